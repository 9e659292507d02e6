"""The configurations ``tools/bench.py`` compares, and the pipeline overrides of each."""

from __future__ import annotations

import argparse

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
}
PARTS = {"raw", "coloc", "coloc1", "coloc2", "disagg", "disaggspin", "disaggchunk"}
WORKLOADS = {"uniform", "mixed"}


def selected(parts: set[str], workloads: set[str]) -> list[str]:
    """The configurations of ``parts`` (``--only``) on ``workloads``, in ``CONFIGS`` order
    (``raw`` and ``coloc1`` run the uniform workload whatever ``workloads`` says)."""
    return [n for n, (part, w, _) in CONFIGS.items()
            if (part in parts or n.split("-")[0] in parts) and (n in ("raw", "coloc1") or w in workloads)]


def base_overrides(args: argparse.Namespace, input_dir: str) -> list[str]:
    """Overrides every configuration shares: the job, its input, output length and dtype."""
    return ["+job=summarize", f"job.input={input_dir}",
            f"job.sampling.max_new_tokens={args.max_new_tokens}", f"model.dtype={args.dtype}"]


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
    if name.startswith("disagg"):
        c = cpu_slices(2, "partition")
        spin = (["transport.nixl_progress_delay_us=0"] if name.startswith("disaggspin") else
                ["model.prefill_chunk_tokens=512"] if name.startswith("disaggchunk") else [])
        return base + ["pools=disaggregated", "pools.prefill=1", "pools.decode=1",
                       f"job.batch_rows={args.inflight}"] + spin, {c[0]: "prefill-0", c[1]: "decode-0"}
    raise ValueError(name)
