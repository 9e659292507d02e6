"""The xP:yD planner: size the prefill and decode pools for a workload on a given machine, and say
whether to disaggregate at all.

``python -m pipeline.plan --model llama-3.1-70b --hardware h100 --prompt-tokens 8192
--output-tokens 256 --rate 2.0`` prints the predictions, the recommendation and the Hydra
overrides that run it (``--json`` for machine output; ``--input DIR`` counts the prompt tokens of
a Parquet dataset with the model's tokenizer; ``--calibrate RUN_DIR`` fits the ``cpu`` profile to
a finished run).

The model (all quantities per request unless said otherwise; one *worker* is ``tp`` devices):

- KV bytes per token ``k = 2 x layers x KV heads x head dim x bytes per element``
  (:mod:`pipeline.kv.layout`); a request moves ``k x prompt tokens`` bytes from prefill to decode
  in ``T = bytes / (tp x link bandwidth)`` seconds.
- Prefill FLOPs ``F(L) = 2 N L + 2 n_layer L^2 d_attn`` for an ``L``-token prompt, ``N`` the
  non-embedding parameters and ``d_attn`` = heads x head dim. Kaplan et al. 2020, "Scaling Laws
  for Neural Language Models", Table 1: forward FLOPs per token ``2N + 2 n_layer n_ctx d_attn``;
  summed over a causal prompt (token ``i`` attends to ``i`` tokens: ``4 i d_attn`` per layer for
  QK^T and AV) this is ``2 n_layer L^2 d_attn``. The LM head runs on the last token only (vLLM),
  so it is left out. Prefill time ``S = F / (tp x peak FLOP/s x MFU)`` (compute bound; see also
  kipply, "Transformer Inference Arithmetic", 2022).
- TTFT ``= Wq + S (+ T when disaggregated)``, ``Wq`` the M/G/1 wait of one prefill worker fed
  ``rate / x`` requests/s (Pollaczek-Khinchine): ``Wq = lambda E[S^2] / (2 (1 - rho))``,
  ``rho = lambda E[S]``. With one prompt length the service is deterministic and this is the
  M/D/1 wait ``rho / (2 mu (1 - rho))``, ``mu = 1 / S``.
- Decode step (one inter-token gap, ITL) on a worker running ``n`` sequences: the roofline
  ``max(bytes / (tp x memory BW x MBU), FLOPs / (tp x peak x MFU))`` with bytes = all weights
  + ``n x k x c`` (the KV of every running sequence; ``c`` its time-averaged context,
  ``E[o (p + o/2)] / E[o]`` tokens) and FLOPs = ``n x (2 (N + vocab x hidden) + 4 n_layer c
  d_attn)`` (kipply 2022; Pope et al. 2022, "Efficiently Scaling Transformer Inference").
  Concurrency by Little's law ``n = lambda_d x E[o] x ITL(n)``, ``lambda_d = rate / y``; ITL
  grows with ``n``, so the fixed point is solved (both roofline branches are affine in ``n``).
- Colocated (one engine does both): prefills pre-empt decoding, so a worker with prefill
  utilisation ``rho`` decodes at mean ITL ``ITL(n) / (1 - rho)`` and its worst gap is
  ``ITL(n) + S(p99 prompt)``: one whole prefill lands inside an inter-token gap.
- Utilisation: prefill ``max(rate x E[S], rate x T) / x``; decode ``max(n / max batch,
  n x k x c / KV capacity, rate x T / y)``, KV capacity = ``tp x memory x mem_fraction -
  weights`` (or the fixed CPU KV space). The split is the smallest x and y (so the smallest
  x + y: the two pools load independently) with both at most the target (0.75).

The decode host-DRAM KV tier (issue #7; ``--dram-tier``, :func:`dram_tier`): prefill pushes a
finished request's KV into host DRAM on its decode worker, the decode worker loads it into its KV
cache (HBM) when it admits the request and swaps sequences out to DRAM and back instead of
recomputing. A decode worker has ``c`` slots: sequences its KV cache holds at full length
``p + o``; a request stays in a slot ``W = load + o x ITL``. Requests in DRAM per worker, by
Little's law ``L = lambda W``: ``lambda_d x (T + Wq + load)`` (pushing, waiting for a slot,
loading; ``Wq`` the Erlang C wait of an M/M/c queue) plus the sequences swapped out; DRAM =
``ceil(headroom x that)`` requests x ``k x (p + o)`` bytes. See :func:`dram_tier`.

A batch job (a request count, no rate) has no arrival process: every request is there at the
start and the pools run as fast as they can. ``--workers G`` (default 2, the pipeline's 1P:1D)
are split into the xP:yD with the shortest makespan and compared with G colocated workers (see
:func:`predict` for the makespan of each).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from pipeline.kv.layout import DTYPE_BYTES, kv_bytes_per_token

GB = 1e9
GIB = 1024 ** 3
TIB = 1024 ** 4


# --------------------------------------------------------------------------------------------
# Hardware
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hardware:
    """One device of a worker (a worker of tensor-parallel size ``tp`` has ``tp`` of them).

    Units: ``peak_flops`` FLOP/s (dense bf16), ``mem_bw`` bytes/s, ``memory_bytes`` bytes,
    ``link_bw`` bytes/s between a prefill and a decode device (NIXL over RDMA / shared memory).
    ``mfu`` and ``mbu`` are the fractions of peak compute and memory bandwidth reached (prefill,
    decode). ``mem_fraction`` is vLLM's ``gpu_memory_utilization``; ``kv_cache_bytes`` when set
    is a fixed KV cache per worker (vLLM CPU: ``VLLM_CPU_KVCACHE_SPACE``) instead of memory left
    after the weights. ``max_batch`` is vLLM's ``max_num_seqs`` (128: the scheduler default for
    the ``AsyncLLM`` engines the pipeline starts, vLLM 0.32).

    The decode host-DRAM tier (:func:`dram_tier`) also uses: ``h2d_bw``, bytes/s from host DRAM
    into one device's memory (each of a worker's ``tp`` devices loads its share of the KV heads
    over its own link); ``node_devices``, devices per node; ``node_dram_bytes``, host DRAM of one
    node in bytes (``None``: this machine's, from ``/proc/meminfo``).
    """

    name: str
    peak_flops: float
    mem_bw: float
    memory_bytes: float
    link_bw: float
    mfu: float = 0.5
    mbu: float = 0.7
    mem_fraction: float = 0.9
    kv_cache_bytes: float | None = None
    max_batch: int = 128
    h2d_bw: float = 55 * GB
    node_devices: int = 8
    node_dram_bytes: float | None = None


HARDWARE: dict[str, Hardware] = {
    # NVIDIA H100 SXM datasheet: 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3, 80 GB; one 400 Gb/s
    # InfiniBand NIC per GPU = 50 GB/s. Host side (assumptions, for the DRAM tier): 8 GPUs and
    # 2 TiB of DRAM per node (DGX H100 / H200: "2 TB" of system memory, 32 x 64 GiB DIMMs);
    # host-to-device 55 GB/s per GPU, the effective rate of PCIe Gen5 x16 (64 GB/s raw per
    # direction: 32 GT/s x 16 lanes x 128/130).
    "h100": Hardware("h100", peak_flops=989e12, mem_bw=3.35e12, memory_bytes=80 * GB, link_bw=50 * GB,
                     h2d_bw=55 * GB, node_devices=8, node_dram_bytes=2 * TIB),
    # NVIDIA H200: same compute, 4.8 TB/s HBM3e, 141 GB; the same PCIe Gen5 x16 host link and node.
    "h200": Hardware("h200", peak_flops=989e12, mem_bw=4.8e12, memory_bytes=141 * GB, link_bw=50 * GB,
                     h2d_bw=55 * GB, node_devices=8, node_dram_bytes=2 * TIB),
    # One worker's share of the 2-core test machine (the local launcher gives each worker one
    # core). Order of magnitude only, near what `calibrate` fitted on a 1P:1D SmolLM2 run here
    # (prefill ~8e10 FLOP/s; decode ~2.6e9 bytes/s effective, per-step overheads included;
    # hand-offs ~6e7 bytes/s effective). KV space: model.kv_cache_gib (1 GiB by default).
    # DRAM tier: the "KV cache" is DRAM too, so a load is a memcpy (9-11 GB/s single-threaded for
    # 256 MiB here, BENCHMARKS.md); a node is this 2-core machine (two workers), its DRAM read
    # from /proc/meminfo.
    "cpu": Hardware("cpu", peak_flops=1.6e11, mem_bw=1e10, memory_bytes=8 * GIB, link_bw=1e8,
                    mfu=0.5, mbu=0.25, mem_fraction=1.0, kv_cache_bytes=1 * GIB,
                    h2d_bw=1e10, node_devices=2, node_dram_bytes=None),
}


def hardware(name: str) -> Hardware:
    """The preset called ``name`` (``h100``, ``h200``, ``cpu``).

    Raises:
        ValueError: no such preset.
    """
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; presets: {', '.join(HARDWARE)}")
    return HARDWARE[name]


# --------------------------------------------------------------------------------------------
# Model shape
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """What the planner needs of a decoder-only transformer (Llama-style, gated MLP).

    ``params`` is the total parameter count (weights read per decode step); ``dtype`` the weight
    and KV element type (a key of :data:`pipeline.kv.layout.DTYPE_BYTES`); ``path`` the model
    directory when there is one (for its tokenizer).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params: float
    dtype: str = "bfloat16"
    tied_embeddings: bool = False
    path: str | None = None

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token, all layers, K and V (:func:`pipeline.kv.layout.kv_bytes_per_token`)."""
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.dtype)

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights: ``params x bytes per element``."""
        return self.params * DTYPE_BYTES[self.dtype]

    @property
    def d_attn(self) -> int:
        """Attention width: query heads x head dim."""
        return self.heads * self.head_dim

    @property
    def flop_params(self) -> float:
        """Non-embedding parameters ``N`` of Kaplan et al. 2020: ``params`` less the embedding
        table(s) (``vocab x hidden``, twice when the LM head is not tied)."""
        return self.params - self.vocab * self.hidden * (1 if self.tied_embeddings else 2)


# Shapes from the models' Hugging Face config.json; params as published (70.6B, 8.03B).
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "llama-3.1-70b": {"num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                      "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 28672,
                      "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                      "params": 70.6e9},
    "llama-3.1-8b": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336,
                     "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                     "params": 8.03e9},
}
CONF_MODELS = Path(__file__).resolve().parents[1] / "conf" / "model"


def count_params(config: dict) -> int:
    """Parameters of a Llama-style model from its HF ``config.json`` dict: per layer the Q, K, V,
    O projections (``hidden x (heads + 2 kv_heads) x head_dim + heads x head_dim x hidden``) and
    a gated MLP (``3 x hidden x intermediate``); plus ``vocab x hidden`` embeddings (twice when
    ``tie_word_embeddings`` is false). Norms are left out (< 0.01%)."""
    h, heads = config["hidden_size"], config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    hd = config.get("head_dim") or h // heads
    per_layer = h * (heads + 2 * kv) * hd + heads * hd * h + 3 * h * config["intermediate_size"]
    tied = config.get("tie_word_embeddings", False)
    return config["num_hidden_layers"] * per_layer + config["vocab_size"] * h * (1 if tied else 2)


def shape_from_hf(config: dict, name: str, dtype: str | None = None, path: str | None = None) -> ModelShape:
    """A :class:`ModelShape` from an HF ``config.json`` dict (``text_config`` merged in, as
    :func:`pipeline.roles.engine.kv_bytes_per_token` does). ``dtype`` defaults to the config's
    ``torch_dtype`` / ``dtype``, else bfloat16; ``params`` to :func:`count_params`.

    Raises:
        ValueError: a key is missing or the dtype is unknown.
    """
    config = {**config, **(config.get("text_config") or {})}
    try:
        heads = config["num_attention_heads"]
        dtype = dtype or str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        shape = ModelShape(
            name=name, layers=config["num_hidden_layers"], hidden=config["hidden_size"],
            heads=heads, kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            vocab=config["vocab_size"], params=float(config.get("params") or count_params(config)),
            dtype=dtype.replace("torch.", ""), tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            path=path)
    except KeyError as exc:
        raise ValueError(f"model {name}: config.json has no {exc.args[0]!r}") from None
    if shape.dtype not in DTYPE_BYTES:
        raise ValueError(f"model {name}: unknown dtype {shape.dtype!r}; known: {sorted(DTYPE_BYTES)}")
    return shape


def load_model(ref: str, dtype: str | None = None) -> ModelShape:
    """The shape of model ``ref``: a preset (``llama-3.1-70b``, ``llama-3.1-8b``), a model config
    of ``conf/model/`` (``smollm2-135m``: its directory is resolved, converting the shipped model
    once, as the pipeline does), a model directory with a ``config.json``, or a ``config.json``.

    Raises:
        ValueError: ``ref`` is none of these, or its config lacks a needed key.
    """
    if ref in MODEL_PRESETS:
        return shape_from_hf(MODEL_PRESETS[ref], ref, dtype)
    if (CONF_MODELS / f"{ref}.yaml").exists():
        from pipeline.roles.engine import model_path

        cfg = _compose([f"model={ref}"])
        path = model_path(cfg)
        return shape_from_hf(_read_json(Path(path) / "config.json"), ref, dtype or cfg.model.dtype, path)
    p = Path(ref)
    if p.is_dir() and (p / "config.json").exists():
        return shape_from_hf(_read_json(p / "config.json"), p.name, dtype, str(p))
    if p.is_file() and p.suffix == ".json":
        return shape_from_hf(_read_json(p), p.parent.name, dtype, str(p.parent))
    known = sorted([*MODEL_PRESETS, *(f.stem for f in CONF_MODELS.glob("*.yaml"))])
    raise ValueError(f"unknown model {ref!r}: not a preset ({', '.join(known)}), "
                     f"a model directory with config.json, or a config.json")


def _read_json(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def _compose(overrides: list[str], job: str = "summarize"):
    """The pipeline's typed config for ``+job=JOB`` and ``overrides`` (Hydra, as a run composes it)."""
    from pipeline.config import compose

    return compose([f"+job={job}", *overrides])


# --------------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------------

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
                        rate: float | None = None) -> Workload:
    """Prompt lengths of a Parquet dataset as the pipeline renders them: the job's prompt template
    and the model's chat template (:func:`pipeline.data.prompts.make_prompts`), tokenized with the
    model's tokenizer (:func:`pipeline.roles.engine.load_tokenizer`). Rows that would be error rows
    (null text, too long for ``model.max_model_len`` ...) are left out. Output lengths default to
    the job's ``sampling.max_new_tokens`` (an upper bound). Without ``rate`` the dataset is a
    batch of its rows.

    ``tokenizer`` is a model directory (or ``conf/model`` name) whose tokenizer counts tokens;
    default: the model's own.

    Raises:
        ValueError: no tokenizer for the model (a preset without a directory), or no usable row.
        FileNotFoundError: nothing at ``input_url``.
    """
    from pipeline.data.prompts import make_prompts
    from pipeline.data.shards import list_shards, read_shard
    from pipeline.roles.engine import load_tokenizer

    tok_ref = tokenizer or model.path
    if tok_ref is None and (CONF_MODELS / f"{model.name}.yaml").exists():
        tok_ref = model.name
    if tok_ref is None:
        raise ValueError(f"model {model.name} has no directory to take a tokenizer from; "
                         f"pass --tokenizer DIR (a model directory)")
    model_override = f"model={tok_ref}" if (CONF_MODELS / f"{tok_ref}.yaml").exists() else f"model.path={tok_ref}"
    cfg = _compose([model_override, f"job.input={input_url}"], job)
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


# --------------------------------------------------------------------------------------------
# Formulas
# --------------------------------------------------------------------------------------------

def prefill_flops(model: ModelShape, tokens: float) -> float:
    """FLOPs to prefill a ``tokens``-token prompt: ``2 N L + 2 n_layer L^2 d_attn`` (Kaplan et al.
    2020, Table 1, summed over a causal prompt; see the module docstring)."""
    return 2 * model.flop_params * tokens + 2 * model.layers * tokens ** 2 * model.d_attn


def prefill_time(model: ModelShape, hw: Hardware, tokens: float, tp: int = 1) -> float:
    """Seconds to prefill ``tokens`` tokens on one worker of ``tp`` devices:
    ``prefill_flops / (tp x peak_flops x mfu)`` (compute bound)."""
    return prefill_flops(model, tokens) / (tp * hw.peak_flops * hw.mfu)


def kv_transfer_time(nbytes: float, hw: Hardware, tp: int = 1) -> float:
    """Seconds to move ``nbytes`` of KV from a prefill to a decode worker: ``nbytes / (tp x
    link_bw)`` (each of the ``tp`` devices sends its shard of the heads over its own link)."""
    return nbytes / (tp * hw.link_bw)


def host_load_time(nbytes: float, hw: Hardware, tp: int = 1) -> float:
    """Seconds to load ``nbytes`` of KV from host DRAM into a decode worker's KV cache:
    ``nbytes / (tp x h2d_bw)`` (each of the ``tp`` devices loads its share of the KV heads over
    its own host link; the same rule as :func:`kv_transfer_time`)."""
    return nbytes / (tp * hw.h2d_bw)


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue (Erlang C) with ``servers`` = c servers
    and offered load ``offered`` = a = lambda x E[service] (erlangs):
    ``C(c, a) = c B / (c - a (1 - B))``, ``B`` the Erlang B blocking probability from the
    recursion ``B(0) = 1, B(k) = a B(k-1) / (k + a B(k-1))`` (Kleinrock, Queueing Systems vol. 1,
    1975, sec. 3.5; the recursion avoids ``a^c / c!``). The mean wait is then ``Wq = C E[service]
    / (c - a)`` and the mean number waiting ``Lq = lambda Wq = C a / (c - a)``.

    Raises:
        ValueError: ``servers < 1`` or not ``0 <= offered < servers`` (no steady state).
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if not 0 <= offered < servers:
        raise ValueError(f"queue overloaded: offered load {offered:.3g} >= {servers} servers" if offered >= servers
                         else f"offered load must be >= 0, got {offered}")
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    return servers * b / (servers - offered * (1 - b))


def dram_full_probability(servers: int, offered: float, transit: float, room: int) -> float:
    """Probability that a request arriving at a decode worker's DRAM pool finds ``room`` or more
    requests there (so its push has to wait): ``P(Nq + Nt >= room)``. ``Nq``, the requests
    waiting for one of ``servers`` slots, has the M/M/c distribution ``P(Nq = 0) = 1 - C rho``,
    ``P(Nq = j) = C (1 - rho) rho^j`` for ``j >= 1`` (``C`` = :func:`erlang_c`, ``rho = offered /
    servers``; Kleinrock 1975, sec. 3.5); ``Nt``, those being pushed or loaded, is Poisson with
    mean ``transit`` (M/G/inf); the two are taken as independent. Poisson arrivals see these
    time averages (PASTA).

    Raises:
        ValueError: as :func:`erlang_c`.
    """
    if room <= 0:
        return 1.0
    c = erlang_c(servers, offered)
    rho = offered / servers
    pq = [1 - c * rho] + [c * (1 - rho) * rho ** j for j in range(1, room)]
    pt, term = [], math.exp(-transit)
    for i in range(room):
        pt.append(term)
        term *= transit / (i + 1)
    below = sum(pq[j] * pt[total - j] for total in range(room) for j in range(total + 1))
    return min(1.0, max(0.0, 1 - below))


def node_dram(hw: Hardware) -> float:
    """Host DRAM of one node, bytes: ``hw.node_dram_bytes``, else this machine's ``MemTotal``
    from ``/proc/meminfo`` (kB = 1024 bytes there).

    Raises:
        ValueError: neither is available.
    """
    if hw.node_dram_bytes is not None:
        return hw.node_dram_bytes
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    raise ValueError(f"hardware {hw.name}: no node DRAM size and no /proc/meminfo; give --node-dram GiB")


def md1_wait(rho: float, service_s: float) -> float:
    """Mean wait in queue (seconds) of an M/D/1 server: ``rho / (2 mu (1 - rho))``, ``mu =
    1 / service_s`` (Pollaczek-Khinchine with deterministic service; Kleinrock, Queueing
    Systems vol. 1, 1975).

    Raises:
        ValueError: ``rho >= 1`` (the server is overloaded: no steady state) or ``rho < 0``.
    """
    if not 0 <= rho < 1:
        raise ValueError(f"queue overloaded: utilisation {rho:.3g} >= 1" if rho >= 1
                         else f"utilisation must be >= 0, got {rho}")
    return rho / (2 * (1 / service_s) * (1 - rho))


def mg1_wait(rate: float, services: Sequence[float]) -> float:
    """Mean wait in queue (seconds) of an M/G/1 server with Poisson arrivals at ``rate``
    requests/s and service times drawn from ``services`` (seconds): Pollaczek-Khinchine,
    ``Wq = rate E[S^2] / (2 (1 - rho))``, ``rho = rate E[S]``; :func:`md1_wait` when all are
    equal.

    Raises:
        ValueError: ``rho >= 1``.
    """
    es = sum(services) / len(services)
    es2 = sum(s * s for s in services) / len(services)
    rho = rate * es
    if rho >= 1:
        raise ValueError(f"queue overloaded: utilisation {rho:.3g} >= 1")
    return rate * es2 / (2 * (1 - rho))


def decode_step_time(model: ModelShape, hw: Hardware, running: float, context: float, tp: int = 1) -> float:
    """Seconds of one decode step (the inter-token gap) of a worker running ``running``
    sequences of ``context`` tokens each: the roofline maximum of reading all weights plus every
    sequence's KV at ``tp x mem_bw x mbu`` and computing ``running x (2 (N + vocab x hidden) +
    4 n_layer context d_attn)`` FLOPs at ``tp x peak_flops x mfu`` (see the module docstring)."""
    (a_m, b_m), (a_c, b_c) = _step_lines(model, hw, context, tp)
    return max(a_m + b_m * running, a_c + b_c * running)


def _step_lines(model: ModelShape, hw: Hardware, context: float, tp: int) -> tuple[tuple[float, float], ...]:
    """The two roofline branches of a decode step as (seconds at 0 sequences, seconds per sequence)."""
    bw = tp * hw.mem_bw * hw.mbu
    flops = tp * hw.peak_flops * hw.mfu
    per_seq_flops = 2 * (model.flop_params + model.vocab * model.hidden) + 4 * model.layers * context * model.d_attn
    return ((model.weight_bytes / bw, model.kv_bytes_per_token * context / bw), (0.0, per_seq_flops / flops))


def decode_concurrency(model: ModelShape, hw: Hardware, rate: float, output_tokens: float,
                       context: float, tp: int = 1, stretch: float = 1.0) -> tuple[float, float]:
    """(running sequences, ITL seconds) of one decode worker fed ``rate`` requests/s of
    ``output_tokens`` tokens each: the fixed point of Little's law ``n = rate x output_tokens x
    stretch x step(n)`` with ``step`` = :func:`decode_step_time` (``stretch`` = ``1 / (1 -
    rho)`` stretches the gaps of a colocated worker that prefills a fraction rho of the time).
    Each branch ``a + b n`` of the roofline gives ``n = r a / (1 - r b)``, ``r = rate x
    output_tokens x stretch``; the fixed point is the larger. Returned ITL = ``step(n)``
    (without the stretch).

    Raises:
        ValueError: ``r b >= 1`` for a branch: the worker cannot keep up at any concurrency.
    """
    r = rate * output_tokens * stretch
    n = 0.0
    for a, b in _step_lines(model, hw, context, tp):
        if r * b >= 1:
            raise ValueError(f"decode worker overloaded: {rate:.3g} requests/s x {output_tokens:g} "
                             f"tokens need more than one worker's throughput")
        n = max(n, r * a / (1 - r * b))
    return n, decode_step_time(model, hw, n, context, tp)


def kv_capacity(model: ModelShape, hw: Hardware, tp: int = 1) -> float:
    """KV cache bytes of one worker: ``hw.kv_cache_bytes`` when fixed (CPU), else ``tp x memory
    x mem_fraction - weights``."""
    if hw.kv_cache_bytes is not None:
        return hw.kv_cache_bytes
    return tp * hw.memory_bytes * hw.mem_fraction - model.weight_bytes


def auto_tp(model: ModelShape, hw: Hardware) -> int:
    """Smallest tensor-parallel size in 1, 2, 4, 8 whose usable memory holds the weights twice
    over (half for weights, at least half for KV; a rule of thumb); 1 with a fixed KV space.

    Raises:
        ValueError: not even 8 devices hold the weights.
    """
    if hw.kv_cache_bytes is not None:
        return 1
    for tp in (1, 2, 4, 8):
        if model.weight_bytes <= 0.5 * tp * hw.memory_bytes * hw.mem_fraction:
            return tp
    raise ValueError(f"{model.name}: {model.weight_bytes / GB:.0f} GB of weights need more than 8 "
                     f"{hw.name} devices per worker")


# --------------------------------------------------------------------------------------------
# Predictions
# --------------------------------------------------------------------------------------------

@dataclass
class Prediction:
    """Predicted steady state of one pool configuration. Times in seconds, rates in requests/s,
    bytes in bytes; utilisations are fractions (1 = saturated).

    ``decode_workers`` is 0 when colocated (``prefill_workers`` then counts the colocated
    workers). ``throughput`` is the arrival rate served, or for a batch ``count / makespan``.
    ``queue_wait_s`` is the mean wait for a prefill worker (a batch: the mean wait of a FIFO
    batch, ``(count / workers - 1) / 2 x E[S]``); ``ttft_s`` adds the prefill (and hand-off).
    ``running`` is the concurrency per decode (or colocated) worker; ``itl_s`` the mean
    inter-token gap, ``itl_worst_s`` the longest (colocated: one p99 prefill inside a gap);
    ``stall_fraction`` the share of a colocated worker's gaps that hold a prefill.
    ``makespan_s`` is set when the workload has a count.
    """

    mode: str
    prefill_workers: int
    decode_workers: int
    tp: int
    throughput: float
    prefill_s: float
    prefill_p99_s: float
    kv_bytes: float
    kv_transfer_s: float
    prefill_util: float
    queue_wait_s: float
    ttft_s: float
    running: float
    itl_s: float
    itl_worst_s: float
    decode_util: float
    stall_fraction: float
    output_tokens_per_s: float
    makespan_s: float | None = None

    @property
    def overrides(self) -> str:
        """Hydra overrides that run this configuration."""
        if self.mode == "colocated":
            out = f"pools=colocated pools.prefill={self.prefill_workers}"
        else:
            out = f"pools=disaggregated pools.prefill={self.prefill_workers} pools.decode={self.decode_workers}"
        if self.tp > 1:
            out += f" model.prefill_tp={self.tp} model.decode_tp={self.tp}"
        return out


@dataclass
class _PrefillSide:
    services: list[float]
    mean_s: float
    p99_s: float
    kv_bytes: float
    transfer_s: float


def _prefill_side(model: ModelShape, hw: Hardware, wl: Workload, tp: int) -> _PrefillSide:
    services = [prefill_time(model, hw, p, tp) for p in wl.prompt_tokens]
    kv = model.kv_bytes_per_token * wl.mean_prompt
    return _PrefillSide(services, sum(services) / len(services), prefill_time(model, hw, wl.p99_prompt, tp),
                        kv, kv_transfer_time(kv, hw, tp))


def _decode_util(model: ModelShape, hw: Hardware, wl: Workload, running: float, tp: int) -> float:
    cap = kv_capacity(model, hw, tp)
    kv_util = running * model.kv_bytes_per_token * wl.decode_context / cap if cap > 0 else math.inf
    return max(running / hw.max_batch, kv_util)


def _max_running(model: ModelShape, hw: Hardware, wl: Workload, tp: int) -> float:
    """Most sequences one worker can run: max batch and KV capacity."""
    cap = kv_capacity(model, hw, tp)
    return max(0.0, min(hw.max_batch, cap / (model.kv_bytes_per_token * wl.decode_context)))


def _needed(util_at, target: float, start: int = 1, limit: int = 100_000) -> int | None:
    """Smallest worker count ``w >= start`` with ``util_at(w) <= target``."""
    for w in range(start, limit):
        if util_at(w) <= target:
            return w
    return None


def predict(model: ModelShape, hw: Hardware, wl: Workload, mode: str = "disaggregated",
            prefill: int = 1, decode: int = 1, tp: int | None = None) -> Prediction:
    """Predict one configuration: ``mode="disaggregated"`` with ``prefill`` x ``decode`` workers,
    or ``mode="colocated"`` with ``prefill`` workers (the pipeline's ``pools.prefill``); ``tp``
    devices per worker (default :func:`auto_tp`).

    With a rate: the steady state at that rate (M/G/1 prefill queue, Little's-law decode
    concurrency; see the module docstring); ``makespan_s = (count - 1) / rate + TTFT + E[o] x
    ITL`` when the workload has a count.

    Without (a batch of ``count`` requests, all there at the start, run as fast as the pools
    allow; no queueing model, prefill utilisation = prefill busy time / makespan):

    - disaggregated: prefill busy ``P = count x max(E[S], T) / x``; decode runs ``n =
      min(n_max, count / y)`` sequences, busy ``D = E[o] x ITL(n) x max(1, count / (y n))``;
      makespan ``= max(P + T + E[o] x ITL_ss, E[S] + T + D)`` (prefill-bound: the last request
      still decodes after its prefill, at the steady concurrency ``ITL_ss`` of Little's law;
      decode-bound: decoding starts after the first prefill);
    - colocated: each worker prefills ``count / w`` prompts and decodes them ``n = min(n_max,
      count / w)`` at a time: makespan ``= (count / w) x E[S] + E[o] x ITL(n) x max(1, count /
      (w n))``;

    and ``throughput = count / makespan``.

    Raises:
        ValueError: a pool is overloaded at the workload's rate (the message says how many
            workers it needs), a bad mode or worker count, or the KV cache of a worker cannot
            hold one request.
    """
    if mode not in ("disaggregated", "colocated"):
        raise ValueError(f"mode must be disaggregated or colocated, got {mode!r}")
    if prefill < 1 or (mode == "disaggregated" and decode < 1):
        raise ValueError(f"worker counts must be >= 1, got prefill={prefill} decode={decode}")
    tp = tp or auto_tp(model, hw)
    n_max = _max_running(model, hw, wl, tp)
    if n_max < 1:
        raise ValueError(f"{model.name}: the KV cache of one worker ({kv_capacity(model, hw, tp) / GIB:.3g} GiB) "
                         f"holds less than one request; use more devices per worker (--tp)")
    pf = _prefill_side(model, hw, wl, tp)
    colocated = mode == "colocated"
    args = (model, hw, wl, pf, prefill, decode, tp, n_max)
    if wl.rate is None:
        return _predict_batch_colocated(*args) if colocated else _predict_batch_disaggregated(*args)
    return _predict_rate(*args, colocated)


def _predict_rate(model, hw, wl, pf, prefill, decode, tp, n_max, colocated) -> Prediction:
    rate, ctx, out = wl.rate, wl.decode_context, wl.mean_output
    workers = prefill if colocated else decode
    per_request = pf.mean_s if colocated else max(pf.mean_s, pf.transfer_s)
    prefill_util = rate * per_request / prefill
    if prefill_util >= 1:
        need = math.floor(rate * per_request) + 1
        raise ValueError(f"{'colocated' if colocated else 'prefill'} pool overloaded: utilisation "
                         f"{prefill_util:.2f} >= 1 with {prefill} workers; it needs at least {need}")
    wait = mg1_wait(rate / prefill, pf.services)
    stretch = 1 / (1 - prefill_util) if colocated else 1.0

    def running_at(w: int) -> float:
        rho = rate * pf.mean_s / w if colocated else 0.0
        if rho >= 1:
            return math.inf
        try:
            return decode_concurrency(model, hw, rate / w, out, ctx, tp, 1 / (1 - rho))[0]
        except ValueError:
            return math.inf

    n = running_at(workers)
    if n > n_max:
        need = _needed(lambda w: running_at(w) / n_max, 1.0, workers + 1)
        raise ValueError(f"{'colocated' if colocated else 'decode'} pool overloaded: {rate:.3g} requests/s "
                         f"need more than the {n_max:.0f} sequences each of {workers} workers can run; "
                         f"it needs at least {need}")
    step = decode_step_time(model, hw, n, ctx, tp)
    itl = step * stretch
    decode_util = _decode_util(model, hw, wl, n, tp)
    if not colocated:
        decode_util = max(decode_util, rate * pf.transfer_s / decode)
    ttft = wait + pf.mean_s + (0.0 if colocated else pf.transfer_s)
    makespan = (wl.count - 1) / rate + ttft + out * itl if wl.count is not None else None
    return Prediction(
        mode="colocated" if colocated else "disaggregated", prefill_workers=prefill,
        decode_workers=0 if colocated else decode, tp=tp, throughput=rate, prefill_s=pf.mean_s,
        prefill_p99_s=pf.p99_s, kv_bytes=pf.kv_bytes, kv_transfer_s=0.0 if colocated else pf.transfer_s,
        prefill_util=prefill_util, queue_wait_s=wait, ttft_s=ttft, running=n, itl_s=itl,
        itl_worst_s=step + pf.p99_s if colocated else step, decode_util=decode_util,
        stall_fraction=min(1.0, rate / prefill * itl) if colocated else 0.0,
        output_tokens_per_s=rate * out, makespan_s=makespan)


def _predict_batch_disaggregated(model, hw, wl, pf, x, y, tp, n_max) -> Prediction:
    count, ctx, out = wl.count, wl.decode_context, wl.mean_output
    busy_p = count * max(pf.mean_s, pf.transfer_s) / x
    n = min(n_max, count / y)
    busy_d = out * decode_step_time(model, hw, n, ctx, tp) * max(1.0, count / (y * n))
    # steady concurrency while prefill feeds decode at x / E[S] (capped by the pool and the batch)
    feed = x / max(pf.mean_s, pf.transfer_s) / y
    try:
        n_ss = min(n, decode_concurrency(model, hw, feed, out, ctx, tp)[0])
    except ValueError:
        n_ss = n
    itl = decode_step_time(model, hw, n_ss, ctx, tp)
    makespan = max(busy_p + pf.transfer_s + out * itl, pf.mean_s + pf.transfer_s + busy_d)
    rate = count / makespan
    wait = (count / x - 1) / 2 * max(pf.mean_s, pf.transfer_s)  # mean wait of a FIFO batch
    return Prediction(
        mode="disaggregated", prefill_workers=x, decode_workers=y, tp=tp, throughput=rate,
        prefill_s=pf.mean_s, prefill_p99_s=pf.p99_s, kv_bytes=pf.kv_bytes, kv_transfer_s=pf.transfer_s,
        prefill_util=busy_p / makespan, queue_wait_s=wait, ttft_s=wait + pf.mean_s + pf.transfer_s, running=n_ss,
        itl_s=itl, itl_worst_s=itl,
        decode_util=max(_decode_util(model, hw, wl, n_ss, tp), busy_d / makespan),
        stall_fraction=0.0, output_tokens_per_s=rate * out, makespan_s=makespan)


def _predict_batch_colocated(model, hw, wl, pf, w, _decode, tp, n_max) -> Prediction:
    count, ctx, out = wl.count, wl.decode_context, wl.mean_output
    per_worker = count / w
    n = min(n_max, per_worker)
    step = decode_step_time(model, hw, n, ctx, tp)
    busy_p = per_worker * pf.mean_s
    busy_d = out * step * max(1.0, per_worker / n)
    makespan = busy_p + busy_d
    rate = count / makespan
    rho = busy_p / makespan
    itl = step / (1 - rho)
    wait = (per_worker - 1) / 2 * pf.mean_s  # mean wait of a FIFO batch (prefills go first)
    return Prediction(
        mode="colocated", prefill_workers=w, decode_workers=0, tp=tp, throughput=rate,
        prefill_s=pf.mean_s, prefill_p99_s=pf.p99_s, kv_bytes=pf.kv_bytes, kv_transfer_s=0.0,
        prefill_util=rho, queue_wait_s=wait, ttft_s=wait + pf.mean_s, running=n, itl_s=itl,
        itl_worst_s=step + pf.p99_s, decode_util=_decode_util(model, hw, wl, n, tp),
        stall_fraction=min(1.0, rate / w * itl), output_tokens_per_s=rate * out, makespan_s=makespan)


# --------------------------------------------------------------------------------------------
# The decode host-DRAM KV tier (issue #7)
# --------------------------------------------------------------------------------------------

@dataclass
class DramTier:
    """Host DRAM a decode worker and node need for the KV tier of one disaggregated split (see
    :func:`dram_tier` for the formulas). Bytes in bytes, times in seconds, rates in requests/s;
    counts of requests are per decode worker unless named ``node``.

    ``request_bytes`` is the KV of a whole request (prompt + generated tokens), ``load_bytes``
    of its prompt (what is pushed and loaded). ``slots``: sequences one worker's KV cache holds at
    full length; ``admitted``: at prompt length (what vLLM admits); ``swapped = admitted - slots``
    the most it may swap out. ``rate`` is per decode worker (a batch: while prefill runs);
    ``residence_s`` a request's time in a slot, ``offered`` ``rate x residence_s`` (erlangs),
    ``wait_probability`` the Erlang C probability of waiting (``None`` for a batch),
    ``admit_wait_s`` the mean wait for a slot. ``waiting`` (mean; a batch: peak), ``transit``
    (being pushed or loaded) and ``swapped`` add up to ``staged``; ``sized_requests`` =
    ``ceil(headroom x staged)``. ``full_probability``: chance a push finds that many there;
    ``sized_1pct``: the fewest requests that bring it to 1% or less (``None`` for a batch).
    ``load_steps`` = ``load_s / itl_s``; ``blocking_itl_s`` = ``itl_s + load_s``, the gap the
    running sequences see if a load is not overlapped with decoding; ``ttft_s`` = the split's TTFT
    (``split_ttft_s``) + ``admit_wait_s`` + ``load_s``; ``h2d_util`` = ``rate x load_s``, the share of time a
    device's host link spends on loads.
    """

    prefill_workers: int
    decode_workers: int
    tp: int
    workers_per_node: int
    decode_nodes: int
    headroom: float
    request_bytes: float
    load_bytes: float
    kv_capacity_bytes: float
    slots: int
    admitted: int
    swapped: int
    rate: float
    itl_s: float
    transfer_s: float
    load_s: float
    residence_s: float
    offered: float
    wait_probability: float | None
    admit_wait_s: float
    waiting: float
    transit: float
    staged: float
    sized_requests: int | None
    worker_bytes: float
    node_bytes: float
    node_dram_bytes: float
    fits: bool
    full_probability: float | None
    sized_1pct: int | None
    load_steps: float
    blocking_itl_s: float
    split_ttft_s: float
    ttft_s: float
    h2d_util: float
    itl_target_s: float
    notes: list[str] = field(default_factory=list)


def dram_tier(model: ModelShape, hw: Hardware, wl: Workload, pred: Prediction, *,
              headroom: float = 1.2, itl_target_s: float = 0.1) -> DramTier:
    """Size the decode workers' host-DRAM KV pool for the disaggregated configuration ``pred``
    (x prefill, y decode workers of ``tp`` devices). ``k`` = KV bytes per token (``2 x layers x
    KV heads x head dim x bytes``, :mod:`pipeline.kv.layout`), ``p`` / ``o`` the mean prompt /
    output tokens, ``C_kv`` = :func:`kv_capacity`.

    - A request's KV: ``k (p + o)`` bytes in DRAM (room for the whole sequence, so it can also be
      swapped out at full length); ``k p`` bytes pushed over the link in ``T`` =
      :func:`kv_transfer_time` and loaded into HBM in ``load = k p / (tp x h2d_bw)``
      (:func:`host_load_time`). The DRAM copy is freed once loaded.
    - Slots ``c = min(max_batch, floor(C_kv / (k (p + o))))``: sequences that run to the end
      without pre-emption. vLLM admits by prompt length, up to ``min(max_batch, floor(C_kv /
      (k p)))``; the difference is the most it swaps out (``swapped``; kept in DRAM throughout).
    - With a rate: each decode worker gets ``lambda = rate / y``; a request holds a slot for
      ``W = load + o x ITL`` (ITL of ``pred``), so ``a = lambda W`` slots are busy (Little's law
      ``L = lambda W``). Waiting for a slot is an M/M/c queue: ``Wq = C(c, a) W / (c - a)``
      (:func:`erlang_c`); exponential service overstates the wait of equal-length requests
      (about 2x for M/D/c, Allen-Cunneen), which errs towards more DRAM. Requests in DRAM by
      Little's law: ``lambda (T + Wq + load)`` (pushing, waiting, loading) ``+ swapped``.
    - A batch (no rate): prefill delivers ``lambda = x / max(S, T) / y`` requests/s to each
      decode worker for ``P = count / (x / max(S, T))`` seconds, and a worker with all slots
      busy (ITL at ``c`` sequences) completes ``mu = c / W``. Fluid backlog at the end of
      prefill (the peak): ``max(0, lambda P - c - mu max(0, P - W))``; mean wait ``peak /
      (2 mu)``. Prefill waits (back-pressure) when DRAM holds less, which costs nothing when
      decode is the bottleneck (``lambda > mu``).
    - Sized: ``ceil(headroom x staged)`` requests (at least 1) per worker x ``k (p + o)``; per
      node ``min(y, node_devices // tp)`` workers; checked against :func:`node_dram`. Mean
      values: the headroom covers fluctuation, and ``full_probability`` says how often a push
      still finds the pool full (:func:`dram_full_probability`); ``sized_1pct`` is the fewest
      requests for which that is at most 1%.
    - The load adds ``load`` to TTFT (plus ``Wq``). Not overlapped with decoding it stalls the
      running sequences: one gap of ``ITL + load``, to compare with ``itl_target_s``.

    Raises:
        ValueError: ``pred`` is colocated, ``headroom < 1``, or a worker's KV cache holds less
            than one whole request.
    """
    if pred.mode != "disaggregated":
        raise ValueError("the DRAM tier sits on decode workers: give a disaggregated prediction")
    if not headroom >= 1:
        raise ValueError(f"DRAM headroom must be >= 1, got {headroom}")
    tp, x, y = pred.tp, pred.prefill_workers, pred.decode_workers
    k = model.kv_bytes_per_token
    p, o = wl.mean_prompt, wl.mean_output
    request_bytes, load_bytes = k * (p + o), k * p
    cap = kv_capacity(model, hw, tp)
    slots = int(min(hw.max_batch, math.floor(cap / request_bytes)))
    admitted = int(min(hw.max_batch, math.floor(cap / load_bytes)))
    if slots < 1:
        raise ValueError(f"{model.name}: the KV cache of one worker ({cap / GIB:.3g} GiB) holds less than one "
                         f"whole request ({request_bytes / GIB:.3g} GiB); use more devices per worker (--tp)")
    swapped = max(0, admitted - slots)
    load = host_load_time(load_bytes, hw, tp)
    transfer = pred.kv_transfer_s
    notes: list[str] = []
    if wl.rate is not None:
        lam = wl.rate / y
        itl = pred.itl_s
        residence = load + o * itl
        offered = lam * residence
        if offered < slots:
            wait_p = erlang_c(slots, offered)
            wait = wait_p * residence / (slots - offered)
        else:
            wait_p, wait = 1.0, math.inf

            def busy(w: int) -> float:
                try:
                    return wl.rate / w * (load + o * decode_concurrency(model, hw, wl.rate / w, o,
                                                                         wl.decode_context, tp)[1]) / slots
                except ValueError:
                    return math.inf

            need = _needed(busy, 1 - 1e-9, y + 1)
            notes.append(f"decode admission overloaded: {offered:.3g} of {slots} slots busy per worker, so the "
                         f"DRAM backlog grows without bound; it needs at least {need} decode workers")
        waiting = lam * wait
    else:
        feed = x / max(pred.prefill_s, transfer)
        lam = feed / y
        itl = decode_step_time(model, hw, slots, wl.decode_context, tp)
        residence = load + o * itl
        offered = lam * residence
        mu = slots / residence
        prefill_phase = wl.count / feed
        waiting = max(0.0, lam * prefill_phase - slots - mu * max(0.0, prefill_phase - residence))
        wait_p, wait = None, waiting / (2 * mu)
        if lam > mu:
            notes.append(f"batch: prefill delivers {lam:.3g} requests/s per decode worker, decode completes "
                         f"{mu:.3g}; the backlog peaks at the end of prefill. With less DRAM prefill waits "
                         f"for room, and the makespan does not change (decode is the bottleneck)")
    transit = lam * (transfer + load)
    staged = waiting + transit + swapped
    per_node = max(1, hw.node_devices // tp)
    on_node = min(y, per_node)
    dram = node_dram(hw)
    if math.isfinite(staged):
        sized: int | None = max(1, math.ceil(headroom * staged - 1e-9))
        worker_bytes = sized * request_bytes
    else:
        sized, worker_bytes = None, math.inf
    node_bytes = on_node * worker_bytes
    full = sized_1pct = None
    if wl.rate is not None and sized is not None:
        full = dram_full_probability(slots, offered, transit, sized - swapped)
        sized_1pct = next(m for m in range(swapped + 1, swapped + 100_000)
                          if dram_full_probability(slots, offered, transit, m - swapped) <= 0.01)
    fits = node_bytes <= dram
    if not fits and math.isfinite(node_bytes):
        notes.append(f"the DRAM pools of {on_node} decode worker{'s' if on_node > 1 else ''} ({node_bytes / GIB:.4g} "
                     f"GiB) exceed the node's {dram / GIB:.4g} GiB: fewer workers per node, more decode workers, "
                     f"or less headroom")
    return DramTier(
        prefill_workers=x, decode_workers=y, tp=tp, workers_per_node=per_node, decode_nodes=math.ceil(y / per_node),
        headroom=headroom, request_bytes=request_bytes, load_bytes=load_bytes, kv_capacity_bytes=cap,
        slots=slots, admitted=admitted, swapped=swapped, rate=lam, itl_s=itl, transfer_s=transfer, load_s=load,
        residence_s=residence, offered=offered, wait_probability=wait_p, admit_wait_s=wait, waiting=waiting,
        transit=transit, staged=staged, sized_requests=sized, worker_bytes=worker_bytes, node_bytes=node_bytes,
        node_dram_bytes=dram, fits=fits, full_probability=full, sized_1pct=sized_1pct, load_steps=load / itl,
        blocking_itl_s=itl + load, split_ttft_s=pred.ttft_s, ttft_s=pred.ttft_s + wait + load, h2d_util=lam * load,
        itl_target_s=itl_target_s, notes=notes)


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------

@dataclass
class Plan:
    """The planner's answer: the model, hardware and workload it used, the smallest
    disaggregated split and colocated pool under ``target_util``, which to run and why, and the
    Hydra overrides for it."""

    model: ModelShape
    hardware: Hardware
    workload: Workload
    target_util: float
    itl_target_s: float
    disaggregated: Prediction | None
    colocated: Prediction
    recommendation: str
    reason: str
    overrides: str
    notes: list[str] = field(default_factory=list)
    dram: DramTier | None = None

    def to_dict(self) -> dict:
        """Everything as JSON-ready data (``--json``); lists of lengths are summarised."""
        wl = self.workload
        d = {
            "model": {**asdict(self.model), "kv_bytes_per_token": self.model.kv_bytes_per_token,
                      "weight_bytes": self.model.weight_bytes, "flop_params": self.model.flop_params},
            "hardware": asdict(self.hardware),
            "workload": {"source": wl.source, "rate": wl.rate, "count": wl.count,
                         "requests_listed": len(wl.prompt_tokens),
                         "prompt_tokens_mean": wl.mean_prompt, "prompt_tokens_p99": wl.p99_prompt,
                         "output_tokens_mean": wl.mean_output, "decode_context_tokens": wl.decode_context},
            "target_util": self.target_util, "itl_target_s": self.itl_target_s,
            "kv_bytes_per_token": self.model.kv_bytes_per_token,
            "disaggregated": None, "colocated": None,
            "recommendation": self.recommendation, "reason": self.reason,
            "overrides": self.overrides, "notes": self.notes,
        }
        for key in ("disaggregated", "colocated"):
            p = getattr(self, key)
            if p is not None:
                d[key] = {**asdict(p), "overrides": p.overrides}
        if self.dram is not None:
            d["dram_tier"] = asdict(self.dram)
        return _finite(d)


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def plan(model: ModelShape, hw: Hardware, wl: Workload, *, target_util: float = 0.75,
         itl_target_s: float = 0.1, tp: int | None = None, workers: int = 2,
         tail_quantile: float = 0.99, dram_headroom: float | None = None) -> Plan:
    """Size the pools and recommend colocated or disaggregated; with ``dram_headroom`` also size
    the decode host-DRAM KV tier of the disaggregated split (:func:`dram_tier`, ``Plan.dram``).

    With a rate: ``x`` = the fewest prefill workers with prefill utilisation <= ``target_util``,
    ``y`` the fewest decode workers with decode utilisation <= ``target_util`` (the pools load
    independently, so this is the smallest x + y); the colocated pool is the fewest workers
    whose prefill share and decode concurrency both stay under the target. Recommendation:

    1. colocated when its worst-case ITL (``ITL + S(p99 prompt)``) is within ``itl_target_s``:
       there is no stall to remove, and disaggregation does not raise throughput;
    2. colocated when the load is too small to fill two pools: prefills land in fewer than
       ``1 - tail_quantile`` (1%) of a colocated worker's gaps, so its p99 ITL is not stalled;
    3. otherwise disaggregated: the colocated worst case exceeds the ITL target often enough
       to reach the tail.

    Without a rate (a batch of ``wl.count``): ``workers`` workers are split into the xP:yD of
    highest throughput and compared with ``workers`` colocated ones by makespan (ITL does not
    matter to a batch); ties go to colocated.

    Raises:
        ValueError: ``target_util`` not in (0, 1), ``workers`` < 1, or no split within 100,000
            workers; with ``dram_headroom``: as :func:`dram_tier`, or no split (``workers`` = 1).
    """
    if not 0 < target_util < 1:
        raise ValueError(f"target utilisation must be in (0, 1), got {target_util}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    tp = tp or auto_tp(model, hw)
    notes: list[str] = []
    if wl.rate is None:
        colo = predict(model, hw, wl, "colocated", workers, tp=tp)
        dis = None
        if workers >= 2:
            dis = max((predict(model, hw, wl, "disaggregated", x, workers - x, tp=tp) for x in range(1, workers)),
                      key=lambda p: p.throughput)
        if dis is not None and dis.makespan_s < colo.makespan_s * (1 - 1e-9):
            rec = "disaggregated"
            reason = (f"batch job: disaggregated {dis.prefill_workers}P:{dis.decode_workers}D finishes in "
                      f"{_s(dis.makespan_s)}, colocated x{workers} in {_s(colo.makespan_s)}")
        else:
            rec = "colocated"
            reason = (f"batch job: only the makespan counts, and colocated x{workers} finishes in "
                      f"{_s(colo.makespan_s)}" + (f" vs {_s(dis.makespan_s)} for the best split "
                                                   f"{dis.prefill_workers}P:{dis.decode_workers}D" if dis else
                                                   " (one worker cannot be split into two pools)"))
        notes.append(f"batch job: {wl.count} requests, all there at the start, on {workers} "
                     f"worker{'s' if workers > 1 else ''} (--workers); the pools run at full speed")
    else:
        pf = _prefill_side(model, hw, wl, tp)
        rate = wl.rate
        x = math.ceil(rate * max(pf.mean_s, pf.transfer_s) / target_util * (1 - 1e-12))
        x = max(1, x)

        def dec_util(w: int) -> float:
            try:
                n, _ = decode_concurrency(model, hw, rate / w, wl.mean_output, wl.decode_context, tp)
            except ValueError:
                return math.inf
            return max(_decode_util(model, hw, wl, n, tp), rate * pf.transfer_s / w)

        def colo_util(w: int) -> float:
            rho = rate * pf.mean_s / w
            if rho >= 1:
                return math.inf
            try:
                n, _ = decode_concurrency(model, hw, rate / w, wl.mean_output, wl.decode_context, tp, 1 / (1 - rho))
            except ValueError:
                return math.inf
            return max(rho, _decode_util(model, hw, wl, n, tp))

        y = _needed(dec_util, target_util)
        n_colo = _needed(colo_util, target_util)
        if y is None or n_colo is None:
            raise ValueError(f"no pool of up to 100,000 workers keeps {rate:g} requests/s under "
                             f"utilisation {target_util}")
        dis = predict(model, hw, wl, "disaggregated", x, y, tp=tp)
        colo = predict(model, hw, wl, "colocated", n_colo, tp=tp)
        tail = 1 - tail_quantile
        if colo.itl_worst_s <= itl_target_s:
            rec = "colocated"
            reason = (f"colocated worst-case ITL {_s(colo.itl_worst_s)} (ITL + one p99 prefill) is within "
                      f"the {_s(itl_target_s)} target: no decode stall to remove, and disaggregation "
                      f"does not raise throughput")
        elif colo.stall_fraction < tail:
            rec = "colocated"
            reason = (f"load too small to fill two pools: prefills land in {colo.stall_fraction:.2%} of "
                      f"a colocated worker's gaps (< {tail:.0%}), so its p{tail_quantile * 100:g} ITL stays "
                      f"{_s(colo.itl_s)}; {x}P:{y}D would run at prefill {dis.prefill_util:.2f}, "
                      f"decode {dis.decode_util:.2f}")
        else:
            rec = "disaggregated"
            reason = (f"colocated worst-case ITL {_s(colo.itl_worst_s)} exceeds the {_s(itl_target_s)} "
                      f"target in {colo.stall_fraction:.1%} of gaps; disaggregated ITL is {_s(dis.itl_s)}")
            if dis.itl_s > itl_target_s:
                notes.append(f"disaggregated ITL {_s(dis.itl_s)} also exceeds the target: decode is "
                             f"bound by reading the weights ({_s(decode_step_time(model, hw, 0, 0, tp))} "
                             f"per step at best); more decode workers cannot go below that")
    chosen = dis if rec == "disaggregated" else colo
    overrides = chosen.overrides
    if hw.kv_cache_bytes is None:
        overrides += f" model.gpu_memory_utilization={hw.mem_fraction:g}"
        notes.append(f"assumes vLLM may use {hw.mem_fraction:.0%} of device memory "
                     f"(the pipeline's default model.gpu_memory_utilization is 0.3)")
    if tp > 1:
        notes.append(f"{tp} devices per worker (tensor parallel): weights {model.weight_bytes / GB:.1f} GB")
    dram = None
    if dram_headroom is not None:
        if dis is None:
            raise ValueError("the DRAM tier needs a disaggregated split: give --workers >= 2")
        dram = dram_tier(model, hw, wl, dis, headroom=dram_headroom, itl_target_s=itl_target_s)
        if rec != "disaggregated":
            dram.notes.append(f"sized for the disaggregated split {dis.prefill_workers}P:{dis.decode_workers}D; "
                              f"the recommendation is {rec}")
    return Plan(model, hw, wl, target_util, itl_target_s, dis, colo, rec, reason, overrides, notes, dram)


def _s(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "inf"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


# --------------------------------------------------------------------------------------------
# Calibration from a run
# --------------------------------------------------------------------------------------------

def _output_dir(run_or_output: str | os.PathLike) -> tuple[Path, Path | None]:
    """(output shard directory, run config.yaml or None) for a run dir or its output dir."""
    p = Path(run_or_output)
    if (p / "config.yaml").exists():
        from pipeline.config import from_yaml

        cfg = from_yaml(p / "config.yaml")
        out = Path(cfg.job.output) if cfg.job.output and "://" not in cfg.job.output else p / "output"
        return out, p / "config.yaml"
    if (p.parent / "config.yaml").exists():
        return p, p.parent / "config.yaml"
    return p, None


def read_run(run_or_output: str | os.PathLike) -> list[list[dict]]:
    """The rows of a run's output shards, one list per shard (rows with an error or without
    timings left out). Accepts the run directory or the output directory.

    Raises:
        FileNotFoundError: no ``*.parquet`` there.
    """
    import pyarrow.parquet as pq

    out, _ = _output_dir(run_or_output)
    files = sorted(glob.glob(str(out / "*.parquet")))
    if not files:
        raise FileNotFoundError(f"no output shards (*.parquet) in {out}")
    cols = ["prompt_tokens", "output_tokens", "queue_s", "prefill_s", "ttft_s", "decode_s", "kv_handoff_s", "error"]
    shards = []
    for f in files:
        table = pq.read_table(f)
        have = [c for c in cols if c in table.column_names]
        rows = [r for r in table.select(have).to_pylist()
                if not r.get("error") and r.get("prefill_s") is not None and r.get("prompt_tokens")]
        for r in rows:
            r.setdefault("queue_s", 0.0)
            r["queue_s"] = r["queue_s"] or 0.0
        shards.append(rows)
    return shards


def workload_from_run(run_or_output: str | os.PathLike, rate: float | None = None) -> Workload:
    """The workload a run served: its rows' prompt and output tokens, as a batch of its row count
    (or at ``rate``).

    Raises:
        FileNotFoundError: no output shards.
        ValueError: no row without an error.
    """
    rows = [r for shard in read_run(run_or_output) for r in shard]
    if not rows:
        raise ValueError(f"no successful rows in {run_or_output}")
    return Workload(tuple(r["prompt_tokens"] for r in rows), tuple(max(1, r["output_tokens"]) for r in rows),
                    rate, None if rate is not None else len(rows), source=f"run {run_or_output} ({len(rows)} rows)")


def model_of_run(run_or_output: str | os.PathLike) -> ModelShape:
    """The model a run used, from its saved ``config.yaml`` (next to the output directory).

    Raises:
        ValueError: no ``config.yaml`` found.
    """
    _, cfg_path = _output_dir(run_or_output)
    if cfg_path is None:
        raise ValueError(f"no config.yaml for {run_or_output}; pass the model (--model)")
    from pipeline.config import from_yaml
    from pipeline.roles.engine import model_path

    cfg = from_yaml(cfg_path)
    path = model_path(cfg)
    return shape_from_hf(_read_json(Path(path) / "config.json"), cfg.model.name, cfg.model.dtype, path)


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def calibrate(run_or_output: str | os.PathLike, model: ModelShape | None = None,
              base: Hardware | str = "cpu") -> Hardware:
    """Fit ``base`` (the ``cpu`` profile) to a finished run: effective FLOP/s, memory bandwidth
    and link bandwidth, returned with ``mfu = mbu = 1`` so they are used as measured.

    Reads the output shards (``prompt_tokens``, ``output_tokens``, ``queue_s``, ``prefill_s``,
    ``ttft_s``, ``decode_s``, ``kv_handoff_s``; :mod:`pipeline.data.output`). Times of one shard
    share an origin (the shard being read): a row is in prefill over ``[queue_s, queue_s +
    prefill_s]``, decodes over ``[queue_s + ttft_s, + decode_s]`` and hands off over
    ``[queue_s + prefill_s, + kv_handoff_s]``. Rows prefilled together share the engine, so:

    - FLOP/s = sum of :func:`prefill_flops` / sum over shards of the union of prefill intervals;
    - memory bytes/s = sum over rows of ``steps x bytes per step`` / sum of ``decode_s``, with
      ``steps = output_tokens - 1`` and bytes per step = weights + the KV (``k x (p + o/2)``) of
      every row of the shard decoding alongside, weighted by the time it overlaps;
    - link bytes/s = sum of ``k x prompt_tokens`` / sum over shards of the union of hand-off
      intervals (disaggregated runs only; otherwise ``base``'s).

    Rows of different shards are taken not to overlap (the output has no common clock), which
    makes the fit conservative when a worker serves several shards at once. Per-step overheads
    (Python, scheduling, hand-off messages) are folded into the fitted rates. The rates are per
    worker as that run placed them: the local launcher splits the cores among the workers (a
    1P:1D run on 2 cores gives each one core, a colocated x1 run both), so calibrate from a run
    laid out like the one to predict.

    ``model`` defaults to the run's (its ``config.yaml``).

    Raises:
        FileNotFoundError: no output shards.
        ValueError: no row with prefill / decode timings to fit.
    """
    base = hardware(base) if isinstance(base, str) else base
    model = model or model_of_run(run_or_output)
    shards = read_run(run_or_output)
    k = model.kv_bytes_per_token
    flops = prefill_busy = 0.0
    dec_bytes = dec_time = 0.0
    kv_moved = handoff_busy = 0.0
    for rows in shards:
        if not rows:
            continue
        flops += sum(prefill_flops(model, r["prompt_tokens"]) for r in rows)
        prefill_busy += _union([(r["queue_s"], r["queue_s"] + r["prefill_s"]) for r in rows])
        dec = [(r["queue_s"] + r["ttft_s"], r["queue_s"] + r["ttft_s"] + r["decode_s"],
                k * (r["prompt_tokens"] + r["output_tokens"] / 2), r)
               for r in rows if r.get("ttft_s") is not None and r.get("decode_s") and r["output_tokens"] >= 2]
        for a, b, _, r in dec:
            kv = sum(kvj * max(0.0, min(b, bj) - max(a, aj)) / (b - a) for aj, bj, kvj, _ in dec)
            dec_bytes += (r["output_tokens"] - 1) * (model.weight_bytes + kv)
            dec_time += r["decode_s"]
        hand = [r for r in rows if r.get("kv_handoff_s") is not None]
        if hand:
            kv_moved += sum(k * r["prompt_tokens"] for r in hand)
            handoff_busy += _union([(r["queue_s"] + r["prefill_s"], r["queue_s"] + r["prefill_s"] + r["kv_handoff_s"])
                                    for r in hand])
    if prefill_busy <= 0 or dec_time <= 0:
        raise ValueError(f"{run_or_output}: no rows with prefill and decode timings to calibrate from")
    return replace(base, name=f"{base.name} calibrated on {run_or_output}", peak_flops=flops / prefill_busy,
                   mfu=1.0, mem_bw=dec_bytes / dec_time, mbu=1.0,
                   link_bw=kv_moved / handoff_busy if handoff_busy > 0 else base.link_bw)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def format_plan(p: Plan) -> str:
    """A readable report of :class:`Plan` (what the command prints without ``--json``)."""
    m, hw, wl = p.model, p.hardware, p.workload
    tp = p.colocated.tp
    lines = [
        f"model      {m.name}: {m.layers} layers, {m.kv_heads} KV heads x {m.head_dim}, "
        f"{m.params:.3g} params, {m.dtype} ({m.weight_bytes / GB:.3g} GB of weights)",
        f"hardware   {hw.name}: {hw.peak_flops / 1e12:.4g} TFLOP/s x MFU {hw.mfu:g}, "
        f"{hw.mem_bw / GB:.4g} GB/s x MBU {hw.mbu:g}, "
        + (f"KV space {hw.kv_cache_bytes / GIB:.3g} GiB" if hw.kv_cache_bytes is not None
           else f"{hw.memory_bytes / GB:.4g} GB") + f", link {hw.link_bw / GB:.4g} GB/s; {tp} per worker",
        f"workload   {wl.source}: " + (f"{wl.rate:g} requests/s" if wl.rate is not None else f"batch of {wl.count}")
        + (f", {wl.count} requests" if wl.rate is not None and wl.count else "")
        + f"; prompt mean {wl.mean_prompt:.0f} tokens (p99 {wl.p99_prompt}), output mean {wl.mean_output:.0f}",
        f"KV cache   {m.kv_bytes_per_token / 1024:.4g} KiB/token; {p.colocated.kv_bytes / GIB:.3g} GiB per mean prompt; "
        f"{_s(kv_transfer_time(p.colocated.kv_bytes, hw, tp))} to move over {tp} x {hw.link_bw / GB:.3g} GB/s",
        f"prefill    {_s(p.colocated.prefill_s)} per mean prompt, {_s(p.colocated.prefill_p99_s)} for the p99 one "
        f"({prefill_flops(m, wl.mean_prompt):.3g} FLOPs)",
        "",
    ]
    cols = [("disaggregated", p.disaggregated), ("colocated", p.colocated)]
    cols = [(n, c) for n, c in cols if c is not None]
    head = [f"{n} {c.prefill_workers}P:{c.decode_workers}D" if c.decode_workers else f"{n} x{c.prefill_workers}"
            for n, c in cols]
    rows = [
        ("throughput (req/s)", lambda c: f"{c.throughput:.4g}"),
        ("output tokens/s", lambda c: f"{c.output_tokens_per_s:.4g}"),
        ("prefill utilisation", lambda c: f"{c.prefill_util:.2f}"),
        ("decode utilisation", lambda c: f"{c.decode_util:.2f}"),
        ("running per worker", lambda c: f"{c.running:.3g}"),
        ("queue wait", lambda c: _s(c.queue_wait_s)),
        ("TTFT mean", lambda c: _s(c.ttft_s)),
        ("ITL mean", lambda c: _s(c.itl_s)),
        ("ITL worst", lambda c: _s(c.itl_worst_s)),
        ("gaps with a prefill", lambda c: f"{c.stall_fraction:.2%}" if c.mode == "colocated" else "-"),
        ("makespan", lambda c: _s(c.makespan_s) if c.makespan_s is not None else "-"),
    ]
    width = max(len(h) for h in head) + 2
    lines.append(f"{'':22}" + "".join(f"{h:>{width}}" for h in head))
    for label, fn in rows:
        lines.append(f"{label:22}" + "".join(f"{fn(c):>{width}}" for _, c in cols))
    lines += ["", f"target utilisation {p.target_util:g}, ITL target {_s(p.itl_target_s)}",
              f"recommendation: {p.recommendation} ({p.reason})",
              f"overrides: {p.overrides}"]
    lines += [f"note: {n}" for n in p.notes]
    if p.dram is not None:
        lines += ["", format_dram(p.dram, m, hw, wl)]
    return "\n".join(lines)


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.4g} GiB" if math.isfinite(nbytes) else "unbounded"


def format_dram(d: DramTier, m: ModelShape, hw: Hardware, wl: Workload) -> str:
    """The DRAM-tier section of the report (``--dram-tier``; :func:`dram_tier`)."""
    batch = wl.rate is None
    on_node = min(d.decode_workers, d.workers_per_node)
    lines = [
        f"DRAM tier  decode host-DRAM KV pool for {d.prefill_workers}P:{d.decode_workers}D: {d.decode_workers} "
        f"decode worker{'s' if d.decode_workers > 1 else ''} of {d.tp}, {d.workers_per_node} per "
        f"{hw.node_devices}-device node, {d.decode_nodes} decode node{'s' if d.decode_nodes > 1 else ''}",
        f"  per request    {wl.mean_prompt + wl.mean_output:.0f} tokens (prompt {wl.mean_prompt:.0f} + output "
        f"{wl.mean_output:.0f}) x {m.kv_bytes_per_token / 1024:.4g} KiB = {_gib(d.request_bytes)}; "
        f"prompt KV {_gib(d.load_bytes)}",
        f"  slots          {d.slots} sequences at full length in {_gib(d.kv_capacity_bytes)} of KV cache "
        f"(max batch {hw.max_batch}); {d.admitted} at prompt length, so up to {d.swapped} swapped out",
        (f"  admission      {d.rate:.4g} req/s per worker while prefill runs x {_s(d.residence_s)} in a slot"
         if batch else f"  admission      {d.rate:.4g} req/s per worker x {_s(d.residence_s)} in a slot")
        + f" (load {_s(d.load_s)} + {wl.mean_output:.0f} x ITL {_s(d.itl_s)}): "
        + (f"would keep {d.offered:.3g} slots busy, has {d.slots}; fluid backlog, mean wait {_s(d.admit_wait_s)}"
           if batch else
           f"{d.offered:.3g} of {d.slots} slots busy; Erlang C wait {_s(d.admit_wait_s)} "
           f"(P(wait) {d.wait_probability:.3g})"),
        f"  in DRAM        {'peak' if batch else 'mean'} {d.waiting:.3g} waiting + {d.transit:.3g} pushing/loading"
        f" + {d.swapped} swapped out = {d.staged:.3g} requests per worker"
        + ("" if batch else " (Little's law)"),
    ]
    if d.sized_requests is not None:
        lines.append(f"  sized          ceil({d.headroom:g} x {d.staged:.3g}) = {d.sized_requests} "
                     f"request{'s' if d.sized_requests > 1 else ''} = "
                     f"{_gib(d.worker_bytes)} per worker; {_gib(d.node_bytes)} per decode node "
                     f"({on_node} worker{'s' if on_node > 1 else ''} on it)")
    else:
        lines.append("  sized          unbounded (see the note)")
    lines.append(f"  node DRAM      {_gib(d.node_dram_bytes)}"
                 f"{'' if hw.node_dram_bytes is not None else ' (/proc/meminfo)'}: "
                 + (f"fits, {d.node_bytes / d.node_dram_bytes:.1%} of it" if d.fits else "does NOT fit")
                 + (f"; a push finds the pool full {d.full_probability:.2%} of the time"
                    if d.full_probability is not None else ""))
    if d.sized_1pct is not None:
        lines.append(f"  for <= 1% full {d.sized_1pct} requests = {_gib(d.sized_1pct * d.request_bytes)} per worker, "
                     f"{_gib(on_node * d.sized_1pct * d.request_bytes)} per decode node "
                     f"({on_node * d.sized_1pct * d.request_bytes / d.node_dram_bytes:.1%} of its DRAM)")
    fits_gap = d.blocking_itl_s <= d.itl_target_s
    lines += [
        f"  DRAM->HBM load {_gib(d.load_bytes)} / ({d.tp} x {hw.h2d_bw / GB:.4g} GB/s) = {_s(d.load_s)} "
        f"= {d.load_steps:.3g} decode steps; not overlapped, one gap of {_s(d.blocking_itl_s)} "
        + (f"(within the {_s(d.itl_target_s)} ITL target)" if fits_gap else
           f"> the {_s(d.itl_target_s)} ITL target: overlap the load with decoding (layer by layer)"),
        f"  TTFT           {_s(d.split_ttft_s)} + wait {_s(d.admit_wait_s)} + load "
        f"{_s(d.load_s)} = {_s(d.ttft_s)}; host link {d.h2d_util:.2%} busy with loads",
    ]
    lines += [f"note: {n}" for n in d.notes]
    return "\n".join(lines)


def _lengths(text: str | None) -> int | list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"token counts must be integers (one, or a comma-separated list), got {text!r}") from None
    return values[0] if len(values) == 1 else values


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.plan``. Exit status 0, or 2 with one line on bad input."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="preset (llama-3.1-70b, llama-3.1-8b, smollm2-135m), "
                    "model directory or config.json (default: the calibrated run's, else smollm2-135m)")
    ap.add_argument("--hardware", default=None, help=f"{', '.join(HARDWARE)} (default h100; cpu with --calibrate)")
    ap.add_argument("--prompt-tokens", help="prompt length in tokens, or a comma-separated list")
    ap.add_argument("--output-tokens", help="output length in tokens, or a comma-separated list")
    ap.add_argument("--rate", type=float, help="arrival rate, requests/s (omit for a batch job)")
    ap.add_argument("--count", type=int, help="number of requests (a batch job without --rate)")
    ap.add_argument("--input", help="Parquet dataset whose prompts are tokenized as the pipeline renders them")
    ap.add_argument("--job", default="summarize", help="job whose prompt template --input uses")
    ap.add_argument("--tokenizer", help="model directory whose tokenizer counts --input tokens (default: the model's)")
    ap.add_argument("--calibrate", metavar="RUN_DIR", help="fit the cpu profile to a finished run (run or output dir)")
    ap.add_argument("--target-util", type=float, default=0.75, help="utilisation each pool may reach (default 0.75)")
    ap.add_argument("--itl-target", type=float, default=0.1, help="inter-token latency target, s (default 0.1)")
    ap.add_argument("--tp", type=int, help="devices per worker (default: fewest that hold the weights twice)")
    ap.add_argument("--workers", type=int, default=2, help="workers (each --tp devices) to split for a batch job (default 2)")
    ap.add_argument("--dtype", help="weight/KV dtype (default: the model's)")
    ap.add_argument("--dram-tier", action="store_true", help="size the decode workers' host-DRAM KV tier "
                    "(issue #7) for the disaggregated split")
    ap.add_argument("--dram-headroom", type=float, help="DRAM tier: factor over the mean requests in DRAM "
                    "(default 1.2; implies --dram-tier)")
    ap.add_argument("--node-dram", type=float, metavar="GIB", help="DRAM tier: host DRAM per node, GiB "
                    "(default: the preset's; cpu: /proc/meminfo; implies --dram-tier)")
    ap.add_argument("--h2d-bw", type=float, metavar="GB_S", help="DRAM tier: host-to-device GB/s per device "
                    "(default: the preset's, 55 for h100/h200; implies --dram-tier)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    try:
        if args.tp is not None and args.tp < 1:
            raise ValueError(f"--tp must be >= 1, got {args.tp}")
        if args.calibrate:
            model = load_model(args.model, args.dtype) if args.model else model_of_run(args.calibrate)
            hw = calibrate(args.calibrate, model, args.hardware or "cpu")
        else:
            model = load_model(args.model or "smollm2-135m", args.dtype)
            hw = hardware(args.hardware or "h100")
        if args.node_dram is not None or args.h2d_bw is not None:
            if args.node_dram is not None and not args.node_dram > 0:
                raise ValueError(f"--node-dram must be > 0 GiB, got {args.node_dram}")
            if args.h2d_bw is not None and not args.h2d_bw > 0:
                raise ValueError(f"--h2d-bw must be > 0 GB/s, got {args.h2d_bw}")
            hw = replace(hw, node_dram_bytes=args.node_dram * GIB if args.node_dram is not None else hw.node_dram_bytes,
                         h2d_bw=args.h2d_bw * GB if args.h2d_bw is not None else hw.h2d_bw)
        dram_on = args.dram_tier or any(v is not None for v in (args.dram_headroom, args.node_dram, args.h2d_bw))
        headroom = (args.dram_headroom if args.dram_headroom is not None else 1.2) if dram_on else None
        prompts, outputs = _lengths(args.prompt_tokens), _lengths(args.output_tokens)
        if args.input:
            wl = workload_from_input(args.input, model, job=args.job, tokenizer=args.tokenizer,
                                     output_tokens=outputs, rate=args.rate)
            if args.count is not None:
                wl = replace(wl, count=args.count)
        elif prompts is not None or outputs is not None:
            if prompts is None or outputs is None:
                raise ValueError("give both --prompt-tokens and --output-tokens (or --input)")
            wl = workload(prompts, outputs, args.rate, args.count)
            if args.rate is None and args.count is None:
                raise ValueError("give --rate (requests/s) or --count (a batch job)")
        elif args.calibrate:
            wl = workload_from_run(args.calibrate, args.rate)
            if args.count is not None:
                wl = replace(wl, count=args.count)
        else:
            raise ValueError("give --prompt-tokens and --output-tokens, or --input, or --calibrate")
        result = plan(model, hw, wl, target_util=args.target_util, itl_target_s=args.itl_target,
                      tp=args.tp, workers=args.workers, dram_headroom=headroom)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=1) if args.json else format_plan(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
