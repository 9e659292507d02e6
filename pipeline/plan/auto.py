"""``pools=auto``: the planner (:func:`pipeline.plan.recommend.plan`) picks a run's pools from its
own input and machine, before any worker starts.

The workers to place are ``pools.prefill + pools.decode`` (the local launcher gives each its
share of the cores; on Slurm each is a node's worth of ``cluster.*``), each pool's workers of its
own TP size (``model.prefill_tp``, ``model.decode_tp``: a worker of TP n counts n devices, its
rates and KV capacity scale with n; on a CPU profile, where a worker's ranks share its cores,
each worker counts as one, :attr:`~pipeline.plan.hardware.Hardware.ranks_share_cores`). The planner compares them
colocated with every xP:yD split of them, as a batch job with ``job.batch_rows`` rows in flight
per worker, on:

- the input: the prompt lengths of up to ``pools.sample_rows`` rows, rendered and tokenized as
  the workers will (job template, chat template, OpenAI batch requests), spread over the
  shards; output lengths ``job.sampling.max_new_tokens`` (an upper bound); the count, every
  row of the input. RAG jobs are sized on their questions: passages are added by the workers;
- the machine: ``pools.calibration`` (a finished run directory, whose measured speeds fit the
  ``cpu`` profile, :func:`pipeline.plan.calibrate.calibrate`), else the ``pools.hardware``
  preset (default ``cpu`` on a machine without a GPU, else ``h100``).

Disaggregated, it also sets ``pools.local_prefill_tokens`` when left at 0:
:func:`local_prefill_threshold`. The choice, the reason and the figures behind them are printed
and saved as ``RUN_DIR/pools.json``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import Config
from pipeline.io.sample import sample_prompt_lengths
from pipeline.plan.costs import kv_transfer_time, prefill_time
from pipeline.plan.hardware import Hardware, hardware
from pipeline.plan.model import ModelShape, read_json, shape_from_hf
from pipeline.plan.recommend import PlanOptions, plan
from pipeline.plan.workload import Workload


@dataclass
class PoolChoice:
    """What ``pools=auto`` chose: ``mode`` (``colocated`` / ``disaggregated``), ``prefill`` and
    ``decode`` workers, ``local_prefill_tokens``, the planner's ``reason``, the hardware profile
    and the sampled input it used, and each option's predicted makespan (seconds) and output
    tokens/s."""

    mode: str
    prefill: int
    decode: int
    local_prefill_tokens: int
    reason: str
    hardware: str
    sampled_rows: int
    rows: int
    prompt_tokens_mean: float
    prompt_tokens_p99: int
    output_tokens: int
    options: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        """Two or three lines for the terminal."""
        split = f"{self.prefill}P:{self.decode}D" if self.mode == "disaggregated" else f"colocated x{self.prefill}"
        local = (f", rows under {self.local_prefill_tokens} prompt tokens prefilled on decode"
                 if self.mode == "disaggregated" and self.local_prefill_tokens else "")
        return (f"pools=auto: {split}{local}; {self.reason}\n"
                f"  from {self.sampled_rows} of {self.rows} rows (prompt tokens mean {self.prompt_tokens_mean:.0f}, "
                f"p99 {self.prompt_tokens_p99}; up to {self.output_tokens} output tokens) on the {self.hardware} profile"
                + "".join(f"\n  note: {n}" for n in self.notes))


# What a prefill worker does under pools.elastic, by pools.elastic_prefer (pipeline.roles.elastic).
_ELASTIC_PREFILL = {"local": "serve their rows themselves while they have places and hand off the rest",
                    "handoff": "hand their rows off and serve rows alone while every decode rank is full"}


def local_prefill_threshold(model: ModelShape, hw: Hardware, max_tokens: int, prefill_tp: int = 1,
                            decode_tp: int = 1) -> int:
    """The prompt length (tokens) under which computing a prompt's KV on the decode worker
    (``decode_tp`` devices) takes less time than handing it over from a prefill worker of
    ``prefill_tp``: the smallest ``n`` with ``prefill_time(n, decode_tp) >= hw.handoff_s +
    kv_transfer_time(n x KV bytes per token, min(prefill_tp, decode_tp))`` (:mod:`pipeline.plan.costs`; the
    difference is convex in ``n`` and negative at 0, so it crosses 0 once, found by bisection),
    at most ``max_tokens``. 0 without a hand-off latency (the presets have none: only
    :func:`~pipeline.plan.calibrate.calibrate` measures it)."""
    if hw.handoff_s <= 0:
        return 0

    def local_wins(n: int) -> bool:
        return (prefill_time(model, hw, n, decode_tp)
                < hw.handoff_s + kv_transfer_time(n * model.kv_bytes_per_token, hw, min(prefill_tp, decode_tp)))

    if local_wins(max_tokens):
        return max_tokens
    lo, hi = 0, max_tokens  # local_wins(lo) (n = 0 costs nothing), not local_wins(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if local_wins(mid) else (lo, mid)
    return hi


def default_hardware() -> str:
    """``cpu`` where no CUDA device is visible (vLLM's CPU build), else ``h100``."""
    try:
        import torch

        return "h100" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def choose_pools(cfg: Config, shards: list, total_rows: int) -> tuple[Config, PoolChoice]:
    """The config with ``pools=auto`` resolved (see the module doc), and the choice.

    Raises:
        ValueError: no row of the input can become a prompt (nothing to size the pools on), or
            ``pools.calibration`` names no finished run.
    """
    from pipeline.engine.model import load_tokenizer, model_path
    from pipeline.plan.calibrate import calibrate

    path = model_path(cfg)
    model = shape_from_hf(read_json(Path(path) / "config.json"), cfg.model.name, cfg.model.dtype, path)
    kv_dtype = cfg.model.engine_kwargs.get("kv_cache_dtype")
    if kv_dtype and kv_dtype != "auto":
        model = dataclasses.replace(model, kv_cache_dtype=kv_dtype)
    name = cfg.pools.hardware or default_hardware()
    hw = calibrate(cfg.pools.calibration, model, name) if cfg.pools.calibration else hardware(name)
    lengths, read = sample_prompt_lengths(cfg, shards, load_tokenizer(cfg), cfg.pools.sample_rows)
    if not lengths:
        raise ValueError(f"pools=auto: none of the {read} rows read from job.input becomes a prompt; "
                         f"nothing to size the pools on (set pools=colocated or pools=disaggregated)")
    out = cfg.job.sampling.max_new_tokens
    wl = Workload(tuple(lengths), (out,), None, max(total_rows, 1), source="job.input")
    workers = cfg.pools.prefill + cfg.pools.decode
    # On a CPU profile a worker's TP ranks share its cores: each worker counts as one device.
    ptp, dtp = (1, 1) if hw.ranks_share_cores else (cfg.model.prefill_tp, cfg.model.decode_tp)
    p = plan(model, hw, wl, PlanOptions(workers=workers, rows_in_flight=cfg.job.batch_rows, prefill_tp=ptp,
                                        decode_tp=dtp))
    p.notes = [n.replace(" (--workers)", " (pools.prefill + pools.decode)") for n in p.notes]
    options = {"colocated": _figures(p.colocated)}
    if p.disaggregated is not None:
        options["disaggregated"] = _figures(p.disaggregated)
    choice = PoolChoice(
        mode=p.recommendation, prefill=workers, decode=1, local_prefill_tokens=0, reason=p.reason,
        hardware=hw.name, sampled_rows=len(lengths), rows=total_rows,
        prompt_tokens_mean=wl.mean_prompt, prompt_tokens_p99=wl.p99_prompt, output_tokens=out, options=options,
        notes=list(p.notes))
    if cfg.job.rag is not None:
        choice.notes.append("RAG job: sized on the questions alone (the workers add the passages)")
    if p.recommendation == "disaggregated":
        d = p.disaggregated
        choice.prefill, choice.decode = d.prefill_workers, d.decode_workers
        choice.local_prefill_tokens = cfg.pools.local_prefill_tokens or local_prefill_threshold(
            model, hw, cfg.model.max_model_len, ptp, dtp)
    if p.recommendation == "disaggregated":
        predicted = p.disaggregated.makespan_s
        at = f" (predicted makespan {predicted:.0f} s)" if predicted is not None else ""
        choice.notes.append(
            f"pools.elastic: this split is a starting point{at}: decode ranks with room take work units and prefill "
            f"workers {_ELASTIC_PREFILL[cfg.pools.elastic_prefer]}, so the pools follow the run's real output "
            f"lengths" if cfg.pools.elastic else
            f"the split is fixed for the run{at}; with pools.elastic=true it is a starting point that the pools "
            f"rebalance from at run time (decode ranks with room take work units, prefill workers "
            f"{_ELASTIC_PREFILL[cfg.pools.elastic_prefer]})")
    pools = dataclasses.replace(cfg.pools, mode=choice.mode, prefill=choice.prefill, decode=choice.decode,
                                local_prefill_tokens=choice.local_prefill_tokens)
    return dataclasses.replace(cfg, pools=pools), choice


def _figures(pred) -> dict[str, float]:
    return {"prefill_workers": pred.prefill_workers, "decode_workers": pred.decode_workers,
            "prefill_tp": pred.prefill_tp, "decode_tp": pred.decode_tp, "devices": pred.devices,
            "makespan_s": pred.makespan_s, "output_tokens_per_s": pred.output_tokens_per_s}
