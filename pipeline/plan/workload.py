"""The requests to serve: :class:`Workload`, given explicitly or counted from a Parquet dataset."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from pipeline.plan.model import CONF_MODELS, ModelShape, compose_config


@dataclass(frozen=True)
class Workload:
    """Requests to serve: prompt and output lengths (tokens; one value or one per request) and
    either an arrival ``rate`` (requests/s, Poisson) or a batch of ``count`` requests (no rate:
    as fast as the pools allow). With both, the count sets the makespan at that rate."""

    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    rate: float | None = None
    count: int | None = None
    source: str = "explicit"

    def __post_init__(self) -> None:
        if not self.prompt_tokens or not self.output_tokens:
            raise ValueError("workload: prompt and output lengths must not be empty")
        if min(self.prompt_tokens) < 1 or min(self.output_tokens) < 1:
            raise ValueError("workload: prompt and output lengths must be >= 1 token")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"workload: rate must be > 0 requests/s, got {self.rate}")
        if self.count is not None and self.count < 1:
            raise ValueError(f"workload: count must be >= 1, got {self.count}")
        if self.rate is None and self.count is None:
            raise ValueError("workload: give an arrival rate (requests/s) or a request count")

    @property
    def mean_prompt(self) -> float:
        return sum(self.prompt_tokens) / len(self.prompt_tokens)

    @property
    def mean_output(self) -> float:
        return sum(self.output_tokens) / len(self.output_tokens)

    @property
    def p99_prompt(self) -> int:
        """99th percentile prompt length (nearest rank; the longest when < 100 requests)."""
        return _quantile(self.prompt_tokens, 0.99)

    @property
    def decode_context(self) -> float:
        """Time-averaged context (tokens) of a running sequence: ``E[o (p + o/2)] / E[o]``. A
        sequence holds ``p + t`` tokens at its ``t``-th step and stays ``o`` steps, so by Little's
        law running sequences are weighted by ``o``. Paired per request when both lists have the
        same length, else the means are used."""
        p, o = self.prompt_tokens, self.output_tokens
        if len(p) != len(o):
            p, o = (self.mean_prompt,), (self.mean_output,)
        return sum(oi * (pi + oi / 2) for pi, oi in zip(p, o)) / sum(o)


def _quantile(values: Sequence[float], q: float) -> Any:
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def workload(prompt_tokens: int | Sequence[int], output_tokens: int | Sequence[int],
             rate: float | None = None, count: int | None = None) -> Workload:
    """An explicit :class:`Workload`: a length is one int (every request) or a list. A batch
    without ``count`` has one request per listed prompt.

    Raises:
        ValueError: empty or non-positive lengths, rate <= 0, neither rate nor count.
    """
    p = (int(prompt_tokens),) if isinstance(prompt_tokens, (int, float)) else tuple(int(t) for t in prompt_tokens)
    o = (int(output_tokens),) if isinstance(output_tokens, (int, float)) else tuple(int(t) for t in output_tokens)
    if rate is None and count is None and len(p) > 1:
        count = len(p)
    return Workload(p, o, rate, count)


def workload_from_input(input_url: str, model: ModelShape, *, job: str = "summarize",
                        tokenizer: str | None = None, output_tokens: int | Sequence[int] | None = None,
                        rate: float | None = None, max_model_len: int | None = None) -> Workload:
    """Prompt lengths of a Parquet dataset as the pipeline renders them: the job's prompt template
    and the model's chat template (:func:`pipeline.io.prompts.make_prompts`), tokenized with the
    model's tokenizer (:func:`pipeline.engine.model.load_tokenizer`). Rows that would be error rows
    (null text, too long for ``model.max_model_len`` ...) are left out. Output lengths default to
    the job's ``sampling.max_new_tokens`` (an upper bound). Without ``rate`` the dataset is a
    batch of its rows. ``max_model_len``: the context rows must fit (default: the model
    config's, ``conf/model``).

    ``tokenizer`` is a model directory (or ``conf/model`` name) whose tokenizer counts tokens;
    default: the model's own.

    Raises:
        ValueError: no tokenizer for the model (a preset without a directory), or no usable row.
        FileNotFoundError: nothing at ``input_url``.
    """
    from pipeline.engine.model import load_tokenizer
    from pipeline.io.prompts import make_prompts
    from pipeline.io.shards import list_shards, read_shard

    tok_ref = tokenizer or model.path
    if tok_ref is None and (CONF_MODELS / f"{model.name}.yaml").exists():
        tok_ref = model.name
    if tok_ref is None:
        raise ValueError(f"model {model.name} has no directory to take a tokenizer from; "
                         f"pass --tokenizer DIR (a model directory)")
    model_override = f"model={tok_ref}" if (CONF_MODELS / f"{tok_ref}.yaml").exists() else f"model.path={tok_ref}"
    cfg = compose_config([model_override, f"job.input={input_url}",
                          *([f"model.max_model_len={max_model_len}"] if max_model_len else [])], job)
    if cfg.model.max_model_len is None:  # a model of one's own: its own context (pipeline.preflight.limits)
        from pipeline.preflight.limits import resolve_max_model_len
        from pipeline.preflight.engine_args import local_model

        cfg.model.max_model_len, _ = resolve_max_model_len(cfg, local_model(cfg))
    tok = load_tokenizer(cfg)
    lengths: list[int] = []
    rows = 0
    for shard in list_shards(cfg.job.input):
        table = read_shard(shard)
        rows += table.num_rows
        texts = (table.column(cfg.job.text_column).to_pylist()
                 if cfg.job.text_column in table.column_names else [None] * table.num_rows)
        keys = [f"{shard.index}:{i}" for i in range(table.num_rows)]
        for p in make_prompts(texts, keys, cfg.job, tok, cfg.model.max_model_len):
            if p.token_ids is not None:
                lengths.append(len(p.token_ids))
    if not lengths:
        raise ValueError(f"no usable row in {input_url} ({rows} rows, column {cfg.job.text_column!r})")
    out = output_tokens if output_tokens is not None else cfg.job.sampling.max_new_tokens
    o = (int(out),) if isinstance(out, (int, float)) else tuple(int(t) for t in out)
    return Workload(tuple(lengths), o, rate, None if rate is not None else len(lengths),
                    source=f"{input_url} ({len(lengths)} of {rows} rows usable)")
