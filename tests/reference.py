"""The suite's independent reference: raw vLLM ``LLM.generate`` on the sample, sharing no code with
the pipeline's prompts, ids or output writing.

Each sample shard is read with pyarrow alone (its ``id`` and ``text`` columns, in file order);
each row's prompt is the tokenizer's own ``apply_chat_template(..., tokenize=True)`` on the
summarize job's template filled by ``str.replace`` (the template is read from
``conf/job/summarize.yaml`` with PyYAML); greedy decoding with the job's ``max_new_tokens`` in
float32. Only the model's folder is found through the pipeline (``model_path``: where setup put
the converted model).

Run as ``python -m tests.reference OUT.json``: writes ``{shard: [{id, prompt_ids, token_ids}]}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"


def main(out: str) -> None:
    import pyarrow.parquet as pq
    import yaml

    job = yaml.safe_load((ROOT / "conf" / "job" / "summarize.yaml").read_text())
    template, max_tokens = job["prompt_template"], job["sampling"]["max_new_tokens"]
    from pipeline.config import compose
    from pipeline.engine.model import model_path

    path = model_path(compose(["+job=summarize"]))
    # One core, the CPU KV cache in host memory (DESIGN.md section 2); the rest vLLM's defaults.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(min(os.sched_getaffinity(0))))
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = {}
    for shard in sorted(SAMPLE.glob("*.parquet")):
        table = pq.read_table(shard, columns=["id", "text"])
        rows[shard.name] = []
        for rid, text in zip(table.column("id").to_pylist(), table.column("text").to_pylist()):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": template.replace("{text}", text)}],
                                                add_generation_prompt=True, tokenize=True)
            rows[shard.name].append({"id": rid, "prompt_ids": list(ids["input_ids"] if hasattr(ids, "keys") else ids)})
    llm = LLM(model=path, dtype="float32", max_model_len=4096, enforce_eager=True, gpu_memory_utilization=0.3)
    flat = [r for shard in rows.values() for r in shard]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=r["prompt_ids"]) for r in flat],
                           SamplingParams(temperature=0.0, max_tokens=max_tokens))
    for r, o in zip(flat, outputs):
        r["token_ids"] = list(o.outputs[0].token_ids)
    Path(out).write_text(json.dumps(rows))


if __name__ == "__main__":
    main(sys.argv[1])
