"""The suite's independent reference: raw vLLM ``LLM.generate`` on the sample, sharing no code with
the pipeline's prompts, ids or output writing.

Each sample shard is read with pyarrow alone (its ``id`` and ``text`` columns, in file order);
each row's prompt is the tokenizer's own ``apply_chat_template(..., tokenize=True)`` on the
summarize job's template filled by ``str.replace`` (the template is read from
``conf/job/summarize.yaml`` with PyYAML); greedy decoding with the job's ``max_new_tokens`` in
float32. Only the model's folder is found through the pipeline (``model_path``: where setup put
the converted model).

Run as ``python -m tests.reference OUT.json``: writes ``{shard: [{id, prompt_ids, token_ids}]}``.
The prompt functions below serve the unit tests too.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"


def chat_prompt_ids(tokenizer: Any, content: str, system: str | None = None) -> list[int]:
    """The tokenizer's own ids of a one-turn chat prompt (what transformers and vLLM's
    ``LLM.chat`` feed the model), the assistant turn opened."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def inert_prompt_ids(tokenizer: Any, rendered: str, text: str, after: str) -> list[int]:
    """The rule for a prompt whose text (following the first ``after`` in ``rendered``) holds a
    special-token string, written out: cut ``rendered`` at the special tokens outside the text,
    tokenize each stretch with ``split_special_tokens``, so the text's special strings are text."""
    specials = [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]
    pattern = re.compile("|".join(map(re.escape, sorted(specials, key=len, reverse=True))))
    start = rendered.index(after) + len(after)
    outside = [m for m in pattern.finditer(rendered) if m.end() <= start or m.start() >= start + len(text)]
    out, at = [], 0
    for m in outside:
        out += tokenizer(rendered[at:m.start()], add_special_tokens=False, split_special_tokens=True)["input_ids"]
        out.append(tokenizer.convert_tokens_to_ids(m.group()))
        at = m.end()
    return out + tokenizer(rendered[at:], add_special_tokens=False, split_special_tokens=True)["input_ids"]


def sample_rows(shard: Path, template: str, tokenizer: Any) -> list[dict]:
    """``[{id, prompt_ids}]`` of one sample shard, read with pyarrow alone, each prompt the
    tokenizer's own rendering of ``template`` filled with the row's text."""
    import pyarrow.parquet as pq

    table = pq.read_table(shard, columns=["id", "text"])
    return [{"id": rid, "prompt_ids": chat_prompt_ids(tokenizer, template.replace("{text}", text))}
            for rid, text in zip(table.column("id").to_pylist(), table.column("text").to_pylist())]


def hf_greedy(model: Any, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Hugging Face transformers' own greedy ``generate`` (a loaded ``AutoModelForCausalLM``),
    one prompt at a time (no padding): the new tokens of each, stopping at EOS as vLLM does."""
    import torch

    out = []
    for ids in prompts:
        x = torch.tensor([ids])
        with torch.no_grad():
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False)
        out.append(y[0, len(ids):].tolist())
    return out


def main(out: str) -> None:
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
    rows = {shard.name: sample_rows(shard, template, tokenizer) for shard in sorted(SAMPLE.glob("*.parquet"))}
    llm = LLM(model=path, dtype="float32", max_model_len=4096, enforce_eager=True, gpu_memory_utilization=0.3)
    flat = [r for shard in rows.values() for r in shard]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=r["prompt_ids"]) for r in flat],
                           SamplingParams(temperature=0.0, max_tokens=max_tokens))
    for r, o in zip(flat, outputs):
        r["token_ids"] = list(o.outputs[0].token_ids)
    Path(out).write_text(json.dumps(rows))


if __name__ == "__main__":
    main(sys.argv[1])
