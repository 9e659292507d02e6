"""``python -m pipeline.plan``: the command line of the planner (see :mod:`pipeline.plan`)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

import pipeline.plan
from pipeline.plan.calibrate import (batch_rows_of_run, calibrate, max_model_len_of_run, model_of_run,
                                     workload_from_run)
from pipeline.plan.format import format_plan
from pipeline.plan.hardware import HARDWARE, Hardware, hardware
from pipeline.plan.model import KV_CACHE_DTYPES, ModelShape, load_model
from pipeline.plan.price import option_costs
from pipeline.plan.recommend import PlanOptions, plan
from pipeline.plan.units import GB, GIB
from pipeline.plan.workload import Workload, workload, workload_from_input


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
    args = parser().parse_args(argv)
    try:
        _check_tp_flags(args)
        model, hw = _model_and_hardware(args)
        batch_rows = _batch_rows(args)
        hw, headroom = _dram_tier(args, hw)
        wl = _workload(args, model)
        options = PlanOptions(target_util=args.target_util, itl_target_s=args.itl_target, tp=args.tp,
                              workers=args.workers, dram_headroom=headroom, rows_in_flight=batch_rows,
                              prefill_tp=args.prefill_tp, decode_tp=args.decode_tp)
        result = plan(model, hw, wl, options)
        result.costs = option_costs([result.disaggregated, result.colocated], args.device_hour_price,
                                    args.prefill_device_hour_price, args.decode_device_hour_price)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=1) if args.json else format_plan(result))
    return 0


def _check_tp_flags(args: argparse.Namespace) -> None:
    """Raises ValueError: ``--tp``, ``--prefill-tp`` or ``--decode-tp`` below 1."""
    for flag in ("tp", "prefill_tp", "decode_tp"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")


def _model_and_hardware(args: argparse.Namespace) -> tuple[ModelShape, Hardware]:
    """The model (``--model``, else the calibrated run's, else smollm2-135m) with its KV cache
    dtype, and the hardware (``--hardware`` or the profile fitted to ``--calibrate``) with
    ``--link-gbit`` in place of its link rate.

    Raises:
        ValueError: an unknown model or hardware, or ``--link-gbit`` not above 0.
    """
    if args.calibrate:
        model = load_model(args.model, args.dtype) if args.model else model_of_run(args.calibrate)
        hw = calibrate(args.calibrate, model, args.hardware or "cpu")
    else:
        model = load_model(args.model or "smollm2-135m", args.dtype)
        hw = hardware(args.hardware or "h100")
    model = replace(model, kv_cache_dtype=args.kv_cache_dtype)
    if args.link_gbit is not None:
        if not args.link_gbit > 0:
            raise ValueError(f"--link-gbit must be > 0 Gbit/s, got {args.link_gbit}")
        hw = replace(hw, link_bw=args.link_gbit * 1e9 / 8)
    return model, hw


def _batch_rows(args: argparse.Namespace) -> int:
    """Rows in flight per prefill or colocated worker: ``--batch-rows``, else the calibrated
    run's ``job.batch_rows``, else 16.

    Raises:
        ValueError: ``--batch-rows`` below 1.
    """
    if args.batch_rows is not None and args.batch_rows < 1:
        raise ValueError(f"--batch-rows must be >= 1, got {args.batch_rows}")
    return args.batch_rows or (batch_rows_of_run(args.calibrate) if args.calibrate else None) or 16


def _dram_tier(args: argparse.Namespace, hw: Hardware) -> tuple[Hardware, float | None]:
    """The hardware with ``--node-dram`` and ``--h2d-bw`` in place of its own, and the DRAM
    tier's headroom: ``--dram-headroom`` (default 1.2) when any DRAM flag is given, else None
    (no tier).

    Raises:
        ValueError: ``--node-dram`` or ``--h2d-bw`` not above 0.
    """
    if args.node_dram is not None or args.h2d_bw is not None:
        if args.node_dram is not None and not args.node_dram > 0:
            raise ValueError(f"--node-dram must be > 0 GiB, got {args.node_dram}")
        if args.h2d_bw is not None and not args.h2d_bw > 0:
            raise ValueError(f"--h2d-bw must be > 0 GB/s, got {args.h2d_bw}")
        hw = replace(hw, node_dram_bytes=args.node_dram * GIB if args.node_dram is not None else hw.node_dram_bytes,
                     h2d_bw=args.h2d_bw * GB if args.h2d_bw is not None else hw.h2d_bw)
    dram_on = args.dram_tier or any(v is not None for v in (args.dram_headroom, args.node_dram, args.h2d_bw))
    headroom = (args.dram_headroom if args.dram_headroom is not None else 1.2) if dram_on else None
    return hw, headroom


def _workload(args: argparse.Namespace, model: ModelShape) -> Workload:
    """The requests to plan for: counted from ``--input``, given by ``--prompt-tokens`` and
    ``--output-tokens``, or read from the run of ``--calibrate``; ``--rate`` or ``--count``.

    Raises:
        ValueError: none of those given, one of the token flags without the other, or a batch
            with neither ``--rate`` nor ``--count``.
    """
    prompts, outputs = _lengths(args.prompt_tokens), _lengths(args.output_tokens)
    if args.input:
        wl = workload_from_input(args.input, model, job=args.job, tokenizer=args.tokenizer,
                                 output_tokens=outputs, rate=args.rate,
                                 max_model_len=max_model_len_of_run(args.calibrate) if args.calibrate else None)
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
    return wl


def parser() -> argparse.ArgumentParser:
    """The planner's flags (also docs/cli.md, ``tools/manual.py``)."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.plan", description=pipeline.plan.__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="preset (llama-3.1-70b, llama-3.1-8b, smollm2-135m), "
                    "model directory or config.json (default: the calibrated run's, else smollm2-135m)")
    ap.add_argument("--hardware", default=None, help=f"{', '.join(HARDWARE)} (default h100; cpu with --calibrate)")
    ap.add_argument("--prompt-tokens", help="prompt length in tokens, or a comma-separated list")
    ap.add_argument("--output-tokens", help="output length in tokens, or a comma-separated list")
    ap.add_argument("--rate", type=float, help="arrival rate, requests/s (omit for a batch job)")
    ap.add_argument("--count", type=int, help="number of requests (a batch job without --rate)")
    ap.add_argument("--input", help="Parquet dataset whose prompts are tokenized as the pipeline renders them "
                    "(rows longer than the context, the calibrated run's model.max_model_len, are left out)")
    ap.add_argument("--job", default="summarize", help="job whose prompt template --input uses")
    ap.add_argument("--tokenizer", help="model directory whose tokenizer counts --input tokens (default: the model's)")
    ap.add_argument("--calibrate", metavar="RUN_DIR", help="fit the cpu profile to a finished run (run or output dir)")
    ap.add_argument("--target-util", type=float, default=0.75, help="utilisation each pool may reach (default 0.75)")
    ap.add_argument("--itl-target", type=float, default=0.1, help="inter-token latency target, s (default 0.1)")
    ap.add_argument("--tp", type=int, help="devices per worker (default: fewest that hold the weights twice)")
    ap.add_argument("--prefill-tp", type=int, help="devices per prefill (and colocated) worker (default: --tp)")
    ap.add_argument("--decode-tp", type=int, help="devices per decode worker (default: --tp)")
    ap.add_argument("--workers", type=int, default=2, help="workers (each --tp devices) to split for a batch job (default 2)")
    ap.add_argument("--dtype", help="weight/KV dtype (default: the model's)")
    ap.add_argument("--kv-cache-dtype", default="auto", help="KV cache dtype, vLLM's names: auto (the model's "
                    f"dtype), {', '.join(KV_CACHE_DTYPES)} (fp8: 1 byte per element)")
    ap.add_argument("--batch-rows", type=int, help="batch job: rows in flight per prefill or colocated worker "
                    "(the pipeline's job.batch_rows; default: the calibrated run's, else 16)")
    ap.add_argument("--device-hour-price", type=float, metavar="PRICE", help="price of one device per hour "
                    "(any currency): prints each option's cost per million output tokens")
    ap.add_argument("--prefill-device-hour-price", type=float, metavar="PRICE",
                    help="price of a prefill device per hour (default: --device-hour-price)")
    ap.add_argument("--decode-device-hour-price", type=float, metavar="PRICE",
                    help="price of a decode device per hour (default: --device-hour-price)")
    ap.add_argument("--dram-tier", action="store_true", help="size the decode workers' host-DRAM KV tier "
                    "for the disaggregated split")
    ap.add_argument("--dram-headroom", type=float, help="DRAM tier: factor over the mean requests in DRAM "
                    "(default 1.2; implies --dram-tier)")
    ap.add_argument("--node-dram", type=float, metavar="GIB", help="DRAM tier: host DRAM per node, GiB "
                    "(default: the preset's; cpu: /proc/meminfo; implies --dram-tier)")
    ap.add_argument("--h2d-bw", type=float, metavar="GB_S", help="DRAM tier: host-to-device GB/s per device "
                    "(default: the preset's, 55 for h100/h200; implies --dram-tier)")
    ap.add_argument("--link-gbit", type=float, metavar="GBIT_S", help="the link between a prefill and a "
                    "decode worker, Gbit/s (1 Gbit/s = 125e6 bytes/s); replaces the hardware's or the "
                    "calibrated link rate, e.g. a run calibrated on one link predicting another")
    ap.add_argument("--json", action="store_true", help="print JSON")
    return ap
