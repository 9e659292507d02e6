"""What can be known about a run at start, checked at start: before any engine or Slurm job.

:func:`preflight` checks, each failure one line (:class:`~pipeline.config.ConfigError`, exit
status 2 from ``python -m pipeline``) naming the setting:

- locations: every place the run reads (``job.input``, ``job.rag.corpus``) or writes
  (``run.dir``, ``job.output``, ``job.rag.index_dir``, the model cache) can be reached with the
  fsspec implementation its URL scheme needs (the package to install is named when it is
  missing); inputs exist and can be read; outputs can be created and written (a marker file is
  written and removed, and folders created for it are removed again); no output location is,
  or lies inside, an input location, and no output shard would replace an input shard;
- the input schema, from the Parquet footers only (no row data): ``job.text_column`` is in
  every shard with a text type (string or binary; bytes that are not UTF-8 are a row error
  later), and no input column collides with an output column (``job.input_column_prefix``
  null: refused, naming the setting that keeps them; set: the prefixed names must be free).
  A shard whose footer cannot be parsed is not refused here: it fails on its own later, the
  others run; but when no shard parses, nothing would run: refused. A file named with an
  extension the pipeline does not read (``docs.txt``) is refused, not read as Parquet;
- the model: ``model.path`` is a folder (a relative one is found from the launch directory and
  made absolute for the workers) or a hub id already in the local Hugging Face cache, never
  downloaded (:func:`pipeline.model.resolve.find_model`), and holds a ``config.json``, which
  every check of the model's shape below reads;
- templates (``job.prompt_template``, ``job.system_prompt``, ``job.rag.template``), read like
  ``str.format`` (:func:`pipeline.io.prompts.parse_template`);
- a re-run into a ``run.dir`` that holds results (done markers or row checkpoints): every
  setting that changes which rows are read or what they produce must be as before; all that
  differ are named;
- vLLM engine arguments (``model.engine_kwargs`` and the per-pool dicts): known fields, not
  owned by the pipeline, values vLLM accepts, prefill and decode agreeing on the KV layout
  (:mod:`.engine_args`);
- each pool's shape: TP sizes the model's heads allow, and TP sizes and block sizes that vLLM's
  NIXL connector can carry between the pools with this transport (:mod:`.layout`);
- KV room: one request of ``model.max_model_len`` tokens fits in each engine's KV cache
  (``model.kv_cache_gib``, CPU workers), in ``model.decode_kv_blocks`` and in the DRAM tier
  (``offload.dram_gib``), with the size it needs (:mod:`.kv_fit`);
- a fixed ``transport.base_port`` whose ports are taken on this host (local runs).

The :class:`Plan` it returns says what would run (``--dry-run`` prints :meth:`Plan.describe`).
Unknown keys, ``+key=value`` included, are refused earlier, by :func:`pipeline.config.compose`.

Modules: ``locations`` (places and fsspec), ``inputs`` (templates and the input's schema),
``rerun`` (a re-run into a run directory with results), ``layout`` (each pool's TP and block
size), ``kv_fit`` (KV room for one request).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

import fsspec

from pipeline.config import Config, ConfigError, to_yaml
from pipeline.io import formats
from pipeline.io.openai_batch import is_request_batch
from pipeline.io.shards import Shard
from pipeline.model.resolve import cache_dir
from pipeline.runtime.ports import check_ports_free
from pipeline.preflight.engine_args import check_engine_args, local_model
from pipeline.preflight.inputs import asks_for_samples, check_columns, check_templates, read_footers
from pipeline.preflight.kv_fit import check_kv_fits
from pipeline.preflight.layout import check_pool_layouts_of
from pipeline.preflight.locations import check_overlap, check_writable, filesystem, list_input, one_line
from pipeline.preflight.rerun import RESULT_KEYS, check_rerun, rerun_changes
from pipeline.preflight.shared_fs import shared_fs_warning
from pipeline.preflight.settings import Setting, describe_settings, engine_settings
from pipeline.preflight.limits import resolve_max_model_len

SHOWN_SHARDS = 5  # shard names a dry run lists
TOKEN_SAMPLE_ROWS = 64  # rows a dry run tokenizes to estimate the prompt tokens


@dataclass
class Plan:
    """What a checked run would do. ``rows``: rows per shard from the footers (``None`` for a
    shard whose footer cannot be read: it fails when its owner reads it, the others run);
    ``unreadable``: why, by shard name; ``renamed``: input columns kept under
    ``job.input_column_prefix`` (old name -> new name); ``resumes``: ``run_dir`` already holds
    results of this config."""

    cfg: Config
    run_dir: Path
    output: str
    shards: list[Shard]
    rows: list[int | None]
    unreadable: dict[str, str] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)
    resumes: bool = False
    sample_lists: bool = False  # the sample columns are lists (:func:`sample_lists`)
    model_dir: str | None = None  # the model's folder here (None: the bundled model, not yet converted)
    context_from: str = "set"  # where model.max_model_len came from (pipeline.preflight.limits)
    warnings: list[str] = field(default_factory=list)  # one line each: what a start prints to stderr
    jobs: list[tuple[str, list[str]]] = field(default_factory=list)  # Slurm: each job's #SBATCH lines (dry run)

    @property
    def engines(self) -> dict[str, list[Setting]]:
        """Each engine role's resolved settings and their origin (:func:`engine_settings`), for
        the dry run: worked out when asked, since a preset's origin costs a Hydra composition."""
        return engine_settings(self.cfg, self.model_dir, self.context_from)

    @property
    def total_rows(self) -> int:
        """Rows of every readable shard (footers)."""
        return sum(r or 0 for r in self.rows)

    def rows_source(self) -> str:
        """Where the row count comes from: Parquet footers, or counting JSON Lines / CSV records."""
        text = sum(1 for s in self.shards if formats.file_format(s.name) in ("jsonl", "csv"))
        return ("from the Parquet footers" if not text else "counted record by record" if text == len(self.shards)
                else "from the Parquet footers; JSON Lines and CSV shards counted record by record")

    def pools(self) -> str:
        """``disaggregated 1P:1D`` / ``colocated x2``, with the launcher."""
        p = self.cfg.pools
        size = (f"{p.prefill}P:{p.decode}D" if p.mode == "disaggregated" else
                f"of {p.prefill + p.decode} workers" if p.mode == "auto" else f"x{p.prefill}")
        return f"{p.mode} {size} ({self.cfg.cluster.launcher})"

    def describe(self, tokens: bool = True) -> str:
        """What would run, for ``--dry-run``: shards, rows, prompt tokens (an estimate from up to
        :data:`TOKEN_SAMPLE_ROWS` rows, when ``tokens`` and the model's tokenizer is at hand
        without converting or downloading it), pools, places and the resolved config."""
        names = [s.name for s in self.shards]
        more = f", ... ({len(names) - SHOWN_SHARDS} more)" if len(names) > SHOWN_SHARDS else ""
        lines = [
            "dry run: everything checked, nothing started",
            *self.warnings,
            f"shards: {len(names)} ({', '.join(names[:SHOWN_SHARDS])}{more})",
            *(f"unreadable shard (it will fail, the others run): {n}: {why}" for n, why in self.unreadable.items()),
            f"rows: {self.total_rows} ({self.rows_source()})",
        ]
        if tokens:
            lines.append(f"prompt tokens: {estimate_prompt_tokens(self)}")
        lines += [
            f"pools: {self.pools()}",
            *describe_settings(self.engines),
            *(["slurm jobs it would submit (sbatch options):"] if self.jobs else []),
            *(f"  {job}: {' '.join(line.removeprefix('#SBATCH ') for line in lines)}" for job, lines in self.jobs),
            f"run dir: {self.run_dir}" + (" (holds results of this config: the run resumes there)" if self.resumes else ""),
            f"output: {self.output}",
            *(f"input column {old} kept as {new} (job.input_column_prefix)" for old, new in self.renamed.items()),
            "config:",
            to_yaml(self.cfg).rstrip(),
        ]
        return "\n".join(lines)


def new_run_dir(cfg: Config) -> Path:
    """``run.dir`` when set, else ``run.root/<job>/<timestamp>``."""
    if cfg.run.dir:
        return Path(cfg.run.dir)
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
    return Path(cfg.run.root) / cfg.job.name / stamp


def preflight(cfg: Config, run_dir: Path | None = None) -> Plan:
    """Check everything about ``cfg`` that can be known before a worker starts (see the module
    doc) and return the :class:`Plan`; reads only Parquet footers, and leaves nothing behind
    (the writability markers and the folders made for them are removed).

    ``run_dir``: the run directory (default :func:`new_run_dir`).

    Raises:
        ConfigError: one line naming the setting: a bad template; a location whose URL scheme
            has no fsspec implementation here (names the package), that does not exist, cannot
            be read or written, or where an output is or lies inside an input; no shard in
            ``job.input``, or none that parses, or a file named with an extension not read; a text column missing or not text in a shard; input
            columns named like output columns; a re-run into ``run.dir`` that changes settings
            its results depend on; a fixed ``transport.base_port`` whose ports are taken here;
            a KV cache, ``model.decode_kv_blocks`` or DRAM tier too small for one request of
            ``model.max_model_len`` tokens (:mod:`pipeline.preflight.kv_fit`); pool TP sizes or
            block sizes the model or vLLM's NIXL connector cannot take (:mod:`.layout`); a
            ``model.path`` that is neither a folder nor a hub id in the local Hugging Face
            cache (the message gives the command that fetches it), or a folder without
            ``config.json``.
    """
    check_templates(cfg)
    model_dir = local_model(cfg)
    cfg.model.max_model_len, context_from = resolve_max_model_len(cfg, model_dir)
    check_engine_args(cfg)
    check_pool_layouts_of(cfg, model_dir)
    check_kv_fits(cfg, model_dir)
    for key, value in (("run.dir", cfg.run.dir), ("run.root", cfg.run.root)):
        if value and fsspec.core.split_protocol(value)[0] is not None:
            raise ConfigError(f"{key}: {value} must be a plain path on a file system every worker sees, not a URL")
    run_dir = Path(run_dir if run_dir is not None else new_run_dir(cfg))
    output = cfg.job.output or str(run_dir / "output")
    job = cfg.job
    inputs = [("job.input", job.input)] + ([("job.rag.corpus", job.rag.corpus)] if job.rag else [])
    outputs = [("run.dir", str(run_dir)), ("job.output", output)]
    if job.rag:
        outputs.append(("job.rag.index_dir", job.rag.index_dir or str(cache_dir() / "rag")))
    if not cfg.model.path and not (cache_dir() / "models" / cfg.model.name / "config.json").exists():
        outputs.append(("model cache (PD_PIPELINE_CACHE)", str(cache_dir())))
    where = {key: filesystem(key, url) for key, url in inputs + outputs}
    shards = list_input(job.input)
    if job.rag:
        list_input(job.rag.corpus, "job.rag.corpus")
    check_overlap(inputs, outputs, where, shards, output)
    schemas, rows, unreadable = read_footers(shards)
    renamed = check_columns(cfg, schemas, [s.name for s in shards])
    for key, url in outputs:
        check_writable(key, url, *where[key])
    resumes = check_rerun(cfg, run_dir, shards, output)
    try:
        check_ports_free(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    warning = shared_fs_warning(cfg, model_dir, str(run_dir))
    return Plan(cfg, run_dir, output, shards, rows, unreadable, renamed, resumes, sample_lists(cfg, shards, schemas),
                model_dir, context_from, [warning] if warning else [])


def sample_lists(cfg: Config, shards: list[Shard], schemas: list) -> bool:
    """Whether the run's sample columns hold lists of samples: ``job.sampling.n`` > 1, or a
    request of an OpenAI batch file in the input asks for several (``body.n`` > 1, as
    ``vllm run-batch`` serves it); each batch file is read through once for that."""
    return cfg.job.sampling.n > 1 or any(
        asks_for_samples(s.url) for s, schema in zip(shards, schemas) if schema is not None and is_request_batch(schema))


def estimate_prompt_tokens(plan: Plan) -> str:
    """Prompt tokens of the whole input, estimated from up to :data:`TOKEN_SAMPLE_ROWS` rows
    (spread over the first shards) rendered and tokenized with the model's tokenizer, as a line
    for :meth:`Plan.describe`; says why when there is no estimate (the model is not at hand
    without converting or downloading it, or no row could be read)."""
    cfg = plan.cfg
    if cfg.model.path is None and not (cache_dir() / "models" / cfg.model.name / "config.json").exists():
        return "not estimated (the bundled model is converted on the first real run)"
    from pipeline.engine.model import load_tokenizer
    from pipeline.io.sample import sample_prompt_lengths

    readable = [s for s, r in zip(plan.shards, plan.rows) if r]
    try:
        counts, _ = sample_prompt_lengths(cfg, readable, load_tokenizer(cfg), TOKEN_SAMPLE_ROWS)
    except Exception as exc:  # noqa: BLE001 -- an estimate, never a reason to fail
        return f"not estimated ({one_line(exc)})"
    if not counts:
        return "not estimated (no usable row in the sample)"
    mean = sum(counts) / len(counts)
    rag = "; questions only: the retrieved passages come on top" if cfg.job.rag else ""
    return (f"~{round(mean * plan.total_rows):,} (estimate: mean {mean:.0f} tokens over {len(counts)} "
            f"sampled rows x {plan.total_rows} rows{rag})")


__all__ = ["Plan", "RESULT_KEYS", "check_columns", "check_templates", "estimate_prompt_tokens", "new_run_dir",
           "preflight", "rerun_changes"]
