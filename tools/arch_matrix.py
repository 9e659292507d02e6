"""Every test architecture through every path: the matrix behind tests/test_architectures.py.

For each model of :data:`tests.models.ARCHITECTURES` (random weights from a config, made here)
and each path (colocated; push; pull; pull with the DRAM tier; push with prefill TP 2; pull with
decode TP 2, where the model's heads allow), run the pipeline in float32 over the first sample
shard and compare each row's tokens with Hugging Face transformers' own greedy ``generate`` on
the chat template's rendering of the row. Prints one line per (model, path): rows equal to
transformers, the most prompt tokens decode computed for a row, the exit status.

    .venv/bin/python tools/arch_matrix.py [--models qwen2-bias,...] [--paths colocated,push,...] [--out DIR]

About 30-80 s per run on 2 CPU cores (engine start dominates).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.models import ARCHITECTURES, make_model  # noqa: E402
from tests.reference import hf_greedy, sample_rows  # noqa: E402

SHARD = ROOT / "data" / "sample" / "part-00000.parquet"
MAX_NEW = 16
PATHS = {
    "colocated": ["pools=colocated"],
    "push": ["pools=disaggregated", "transport=nixl_push"],
    "pull": ["pools=disaggregated", "transport=nixl_pull"],
    "pull-dram": ["pools=disaggregated", "transport=nixl_pull", "offload=dram", "offload.dram_gib=1"],
    "push-prefill-tp2": ["pools=disaggregated", "transport=nixl_push", "model.prefill_tp=2"],
    "pull-decode-tp2": ["pools=disaggregated", "transport=nixl_pull", "model.decode_tp=2"],
}


def reference(path: Path) -> list[dict]:
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    template = yaml.safe_load((ROOT / "conf" / "job" / "summarize.yaml").read_text())["prompt_template"]
    rows = sample_rows(SHARD, template, AutoTokenizer.from_pretrained(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for row, tokens in zip(rows, hf_greedy(model, [r["prompt_ids"] for r in rows], MAX_NEW)):
        row["token_ids"] = tokens
    return rows


def run(model: str, path: Path, overrides: list[str], out: Path) -> dict:
    import pyarrow.parquet as pq

    p = subprocess.run([sys.executable, "-m", "pipeline", "+job=summarize", "model.dtype=float32", "run.progress=false",
                        f"model.path={path}", f"model.name={model}", f"job.sampling.max_new_tokens={MAX_NEW}",
                        f"job.input={SHARD}", f"run.dir={out}", *overrides], cwd=ROOT, capture_output=True, text=True)
    last = (p.stderr.strip().splitlines() or [""])[-1]
    if p.returncode != 0:
        return {"rc": p.returncode, "why": last}
    return {"rc": 0, "rows": pq.read_table(out / "output" / SHARD.name).to_pylist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ARCHITECTURES))
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--out", default=None, help="where models and runs go (default: a temporary folder)")
    args = ap.parse_args()
    base = Path(args.out or tempfile.mkdtemp(prefix="arch-matrix-"))
    results = []
    for model in args.models.split(","):
        path = make_model(model, base / "models" / model)
        want = reference(path)
        for name in args.paths.split(","):
            got = run(model, path, PATHS[name], base / "runs" / f"{model}-{name}")
            line = {"model": model, "path": name, "rc": got["rc"]}
            if got["rc"] == 0:
                rows = got["rows"]
                line["equal_to_transformers"] = f"{sum(r['generation_token_ids'] == w['token_ids'] for r, w in zip(rows, want))}/{len(want)}"
                if "pools=disaggregated" in PATHS[name]:
                    line["max_prompt_tokens_computed_on_decode"] = max(r["prompt_tokens"] - (r["kv_tokens"] or 0) for r in rows)
            else:
                line["refused_or_failed"] = got["why"]
            print(json.dumps(line), flush=True)
            results.append(line)
    (base / "matrix.json").write_text(json.dumps(results, indent=1))
    print(f"matrix: {base / 'matrix.json'}")


if __name__ == "__main__":
    main()
