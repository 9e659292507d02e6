"""The configurations ``tools/bench.py`` compares, and the pipeline overrides of each."""

from __future__ import annotations

import argparse
from pathlib import Path

from tools.bench_parts.e2e.elastic import ELASTIC_WORKLOADS, SLURM_SPLITS

CONFIGS = {
    # name: (part, workload, description)
    "raw": ("raw", "uniform", "raw vLLM LLM.generate, all cores"),
    "coloc1": ("coloc", "uniform", "pipeline colocated, 1 worker on all cores"),
    "coloc2-uniform": ("coloc", "uniform", "colocated 2 workers x 1 core"),
    "disagg-uniform": ("disagg", "uniform", "disaggregated 1P (core 0) + 1D (core 1)"),
    "coloc2-mixed": ("coloc", "mixed", "colocated 2 workers x 1 core"),
    "disagg-mixed": ("disagg", "mixed", "disaggregated 1P (core 0) + 1D (core 1)"),
    # before pipeline.engine.connector: NIXL's progress thread busy-polls (transport.nixl_progress_delay_us=0)
    "disaggspin-uniform": ("disaggspin", "uniform", "disaggregated, NIXL progress thread spinning"),
    "disaggspin-mixed": ("disaggspin", "mixed", "disaggregated, NIXL progress thread spinning"),
    # prefill engine steps of at most 512 tokens (model.prefill_chunk_tokens; default: vLLM's 2048)
    "disaggchunk-uniform": ("disaggchunk", "uniform", "disaggregated, prefill chunks of 512 tokens"),
    "disaggchunk-mixed": ("disaggchunk", "mixed", "disaggregated, prefill chunks of 512 tokens"),
    "coloc2-long": ("coloc", "long", "colocated 2 workers x 1 core"),
    "disagg-long": ("disagg", "long", "disaggregated 1P (core 0) + 1D (core 1)"),
}
# The P/D variants of issue #17, on every workload: the pipeline before its changes (push, prefill
# engine with vLLM's async scheduling and empty steps at vLLM's pace), push with today's prefill
# engine, rows under 512 prompt tokens prefilled on decode, and pools=auto.
for _w in ("uniform", "mixed", "long"):
    CONFIGS[f"disaggbefore-{_w}"] = ("disaggbefore", _w, "disaggregated as before #17 (push, async prefill, unpaced)")
    CONFIGS[f"disaggpush-{_w}"] = ("disaggpush", _w, "disaggregated, prefill WRITEs (transport=nixl_push)")
    CONFIGS[f"disagglocal-{_w}"] = ("disagglocal", _w, "disaggregated, prompts < 512 tokens prefilled on decode")
    CONFIGS[f"auto-{_w}"] = ("auto", _w, "pools=auto (2 workers)")
    CONFIGS[f"disaggsync-{_w}"] = ("disaggsync", _w, "disaggregated, decode engine scheduled in step (no async scheduling)")
    CONFIGS[f"disaggdram-{_w}"] = ("disaggdram", _w, "disaggregated, KV handed off through the decode DRAM tier")
    CONFIGS[f"disaggasyncload-{_w}"] = ("disaggasyncload", _w, "disaggregated, vLLM's asynchronous KV load on decode")
    # Each pool its own shape (issue #28): one pool at TP 3 (SmolLM2's only TP size above 1), its
    # 3 ranks on its worker's one core; no DRAM tier (the shapes alone).
    CONFIGS[f"disaggtp3p-{_w}"] = ("disaggtp3p", _w, "disaggregated, prefill TP 3 + decode TP 1")
    CONFIGS[f"disaggtp3d-{_w}"] = ("disaggtp3d", _w, "disaggregated, prefill TP 1 + decode TP 3")
# Elastic pools (issue #40): static 1P:1D, colocated and elastic 1P:1D on each of its workloads
# (tools.bench_parts.e2e.elastic; mixed is shared with part 2).
for _w in ELASTIC_WORKLOADS:
    CONFIGS.setdefault(f"coloc2-{_w}", ("coloc", _w, "colocated 2 workers x 1 core"))
    CONFIGS.setdefault(f"disagg-{_w}", ("disagg", _w, "disaggregated 1P (core 0) + 1D (core 1)"))
    CONFIGS[f"disaggelastic-{_w}"] = ("disaggelastic", _w, "disaggregated 1P + 1D, pools.elastic=true")
    # ... with NIXL's progress thread waking every 1 ms, the default on a CPU before 20 ms
    CONFIGS[f"disaggelastic1ms-{_w}"] = ("disaggelastic1ms", _w, "elastic 1P + 1D, NIXL progress delay 1 ms")
# ... and on the 4-node test Slurm (slurm/start-test-cluster.sh --nodes 4), from each split of 4
# workers (two to each of the machine's 2 cores), against colocated 4 workers: --only slurm.
for _w in ELASTIC_WORKLOADS:
    CONFIGS[f"slurmcoloc4-{_w}"] = ("slurm", _w, "test Slurm, colocated 4 workers")
    for _s in SLURM_SPLITS:
        CONFIGS[f"slurm{_s}-{_w}"] = ("slurm", _w, f"test Slurm, static {_s[0]}P:{_s[2]}D")
        CONFIGS[f"slurm{_s}elastic-{_w}"] = ("slurm", _w, f"test Slurm, elastic {_s[0]}P:{_s[2]}D")
PARTS = {"raw", "disaggelastic", "disaggelastic1ms", "slurm", "coloc", "coloc1", "coloc2", "disagg", "disaggspin", "disaggchunk", "disaggbefore", "disaggpush",
         "disagglocal", "auto", "disaggsync", "disaggdram", "disaggasyncload", "disaggtp3p", "disaggtp3d"}
WORKLOADS = {"uniform", "mixed", "long", *ELASTIC_WORKLOADS}
#: Overrides of a workload: the long one needs the model's whole context; the elastic part's
#: set their output lengths.
WORKLOAD_OVERRIDES = {"long": ["model.max_model_len=8192"], **{w: o for w, o in ELASTIC_WORKLOADS.items() if o}}
#: Overrides of each disaggregated variant.
VARIANT_OVERRIDES = {
    "disaggspin": ["transport.nixl_progress_delay_us=0"],
    "disaggchunk": ["model.prefill_chunk_tokens=512"],
    "disaggbefore": ["transport=nixl_push", "transport.prefill_idle_pause_ms=0",
                     "+model.prefill_engine_kwargs.async_scheduling=true"],
    "disaggpush": ["transport=nixl_push"],
    "disagglocal": ["pools.local_prefill_tokens=512"],
    "disaggsync": ["+model.decode_engine_kwargs.async_scheduling=false"],
    "disaggdram": ["offload=dram"],
    "disaggasyncload": ["transport.sync_kv_load=false"],
    "disaggtp3p": ["model.prefill_tp=3", "offload=none"],
    "disaggtp3d": ["model.decode_tp=3", "offload=none"],
    "disaggelastic": ["pools.elastic=true"],
    "disaggelastic1ms": ["pools.elastic=true", "transport.nixl_progress_delay_us=1000"],
}


def selected(parts: set[str], workloads: set[str]) -> list[str]:
    """The configurations of ``parts`` (``--only``) on ``workloads``, in ``CONFIGS`` order
    (``raw`` and ``coloc1`` run the uniform workload whatever ``workloads`` says)."""
    return [n for n, (part, w, _) in CONFIGS.items()
            if (part in parts or n.split("-")[0] in parts) and (n in ("raw", "coloc1") or w in workloads)]


def run_order(names: list[str], rep: int, order: str) -> list[str]:
    """The configurations ``names`` in the order repeat ``rep`` (0-based) runs them (``--order``):
    ``fixed`` as given; ``reverse`` last first; ``rotate`` starting ``rep`` places later each
    repeat, so that over ``len(names)`` repeats each runs once in every place. On a machine whose
    speed drifts during a set, the order alone moved one layout's engine step by up to 1.3x
    against another's (BENCHMARKS.md, "Whole units")."""
    if order == "reverse":
        return names[::-1]
    if order == "rotate" and names:
        k = rep % len(names)
        return names[k:] + names[:k]
    return list(names)


def base_overrides(args: argparse.Namespace, input_dir: str) -> list[str]:
    """Overrides every configuration shares: the job, its input, output length and dtype."""
    workload = Path(input_dir).name
    own = WORKLOAD_OVERRIDES.get(workload, [])
    new = ([] if any(o.startswith("job.sampling.max_new_tokens=") for o in own)
           else [f"job.sampling.max_new_tokens={args.max_new_tokens}"])
    return ["+job=summarize", f"job.input={input_dir}", *new, f"model.dtype={args.dtype}", *own]


def pipeline_overrides(name: str, args: argparse.Namespace, wl: dict) -> tuple[list[str], dict[str, str]]:
    """Hydra overrides of configuration ``name`` and its engines' roles by core list."""
    from pipeline.launch.local import cpu_slices

    base = base_overrides(args, wl["dir"])
    if name == "coloc1":
        return base + ["pools=colocated", "pools.prefill=1", f"job.batch_rows={wl['rows']}"], \
            {cpu_slices(1, "partition")[0]: "colocated-0"}
    if name.startswith("coloc2"):
        c = cpu_slices(2, "partition")
        return base + ["pools=colocated", "pools.prefill=2",
                       f"job.batch_rows={max(1, args.inflight // 2)}"], \
            {c[0]: "colocated-0", c[1]: "colocated-1"}
    if name.startswith("auto"):
        # the planner places 2 workers; job.batch_rows is per prefill or colocated worker
        c = cpu_slices(2, "partition")
        return base + ["pools=auto", "pools.prefill=1", "pools.decode=1",
                       f"job.batch_rows={max(1, args.inflight // 2)}"], {c[0]: "worker-0", c[1]: "worker-1"}
    if name.startswith("slurm"):
        return base + slurm_overrides(name, args), {}
    if name.startswith("disagg"):
        c = cpu_slices(2, "partition")
        spin = VARIANT_OVERRIDES.get(name.split("-")[0], [])
        # Elastic: job.batch_rows is each of the prefill worker's two kinds of rows (hand-offs,
        # rows served alone) and the rows that fill the decode rank, so half the rows in flight
        # keep each engine at about as many as a colocated worker's.
        rows = args.inflight // 2 if name.startswith("disaggelastic") else args.inflight
        return base + ["pools=disaggregated", "pools.prefill=1", "pools.decode=1",
                       f"job.batch_rows={rows}"] + spin, {c[0]: "prefill-0", c[1]: "decode-0"}
    raise ValueError(name)


#: the test Slurm's nodes, their links (tests/conftest.py's SLURM), every node in both pools
SLURM_BASE = ["cluster=slurm-test-nodes", "run.wait=true", "transport.ucx_tls=tcp", "transport.ucx_net_devices=eth0",
              "cluster.prefill_partition=debug", "cluster.decode_partition=debug"]


def slurm_overrides(name: str, args: argparse.Namespace) -> list[str]:
    """Overrides of ``slurmcoloc4``, ``slurm{x}p{y}d`` (static) and ``slurm{x}p{y}delastic`` on
    the 4-node test Slurm: 4 workers, two to each of this machine's 2 cores (array task / decode
    rank i on core i mod 2, the decode ranks from core 1: ``cluster.*_cpus`` per worker), and
    ``--inflight`` rows in flight in all (colocated: a quarter per worker; static: all on the
    prefill workers, split between them; elastic: a quarter per engine, as in 1P:1D)."""
    kind = name.split("-")[0][len("slurm"):]
    base = [*SLURM_BASE, "cluster.prefill_cpus='0;1'", "cluster.decode_cpus='1;0'"]
    if kind == "coloc4":
        return base + ["pools=colocated", "pools.prefill=4", f"job.batch_rows={max(1, args.inflight // 4)}"]
    elastic = kind.endswith("elastic")
    split = kind.removesuffix("elastic")
    p, d = int(split[0]), int(split[2])
    rows = max(1, args.inflight // 4) if elastic else max(1, args.inflight // p)
    return base + ["pools=disaggregated", f"pools.prefill={p}", f"pools.decode={d}", f"job.batch_rows={rows}"] + (
        ["pools.elastic=true"] if elastic else [])
