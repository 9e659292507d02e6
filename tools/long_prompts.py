"""Write a long-prompt input set: rows whose text is ``min_tokens``-``max_tokens`` tokens (or the
token counts given) of the bundled Python Language Reference corpus (``data/rag/corpus.parquet``,
PSF licence, about 28K tokens; a longer row goes round it again), each row starting at a
different section, so no two prompts share a prefix.

    python tools/long_prompts.py OUT_DIR [--rows 8] [--shards 1] [--min-tokens 4000] [--max-tokens 7500]
    python tools/long_prompts.py OUT_DIR --counts 24000,600,32000

Used by the DRAM-tier test (tests/test_dram_tier.py), benchmark (tools/bench_dram.py) and GPU check
(tools/gpu_dram_check.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def yarn_context(max_model_len: int, trained: int = 8192, rope_theta: float = 100000.0) -> list[str]:
    """Overrides that run the bundled SmolLM2-135M (``trained`` = 8,192 positions, RoPE theta
    100,000) at ``max_model_len`` tokens through vLLM's own ``hf_overrides``: YaRN with factor
    ``max_model_len / trained``. vLLM 0.32's CPU build derives the longest context from
    ``max_position_embeddings``, so that is overridden too (docs/long-contexts.md)."""
    factor = max_model_len / trained
    return [f"model.max_model_len={max_model_len}",
            f"+model.engine_kwargs.hf_overrides={{max_position_embeddings:{max_model_len},rope_parameters:"
            f"{{rope_type:yarn,factor:{float(factor)!r},original_max_position_embeddings:{trained},rope_theta:{float(rope_theta)!r}}}}}"]


def write_long_prompts(out: Path, tokenizer, rows: int = 8, shards: int = 1, min_tokens: int = 4000,
                       max_tokens: int = 7500) -> list[int]:
    """Write ``shards`` Parquet shards (``id``, ``text``) of ``rows`` rows in all; row ``i`` has
    ``min_tokens + i * (max_tokens - min_tokens) / (rows - 1)`` tokens (evenly spread). Returns
    the token counts, in row order."""
    counts = [min_tokens + (i * (max_tokens - min_tokens) // (rows - 1) if rows > 1 else 0) for i in range(rows)]
    return write_prompts(out, tokenizer, counts, shards)


def write_prompts(out: Path, tokenizer, counts: list[int], shards: int = 1) -> list[int]:
    """Write ``shards`` Parquet shards (``id`` ``long<i>``, ``text``) whose row ``i`` is
    ``counts[i]`` tokens of the corpus (of document text: the job's template adds its own).
    Returns ``counts``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sections = pq.read_table(ROOT / "data" / "rag" / "corpus.parquet").column("text").to_pylist()
    out.mkdir(parents=True, exist_ok=True)
    recs = []
    for i, n in enumerate(counts):
        start = (i * 7) % len(sections)
        ids: list[int] = []
        while len(ids) < n:  # round the corpus again for a row longer than it
            text = "\n\n".join(sections[start:] + sections[:start])
            ids += tokenizer("\n\n" + text if ids else text, add_special_tokens=False)["input_ids"]
        recs.append({"id": f"long{i}", "text": tokenizer.decode(ids[:n])})
    rows = len(counts)
    per = -(-rows // shards)
    for s in range(shards):
        pq.write_table(pa.Table.from_pylist(recs[s * per:(s + 1) * per]), out / f"part-{s:05d}.parquet")
    return counts


def main() -> None:
    from tools.benchlib.cli import parser

    ap = parser(__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--min-tokens", type=int, default=4000)
    ap.add_argument("--max-tokens", type=int, default=7500)
    ap.add_argument("--counts", help="comma-separated token counts, one per row (instead of --rows/--min/--max)")
    a = ap.parse_args()
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer

    tok = load_tokenizer(compose(["+job=summarize"]))
    if a.counts:
        print(write_prompts(a.out, tok, [int(c) for c in a.counts.split(",")], a.shards))
    else:
        print(write_long_prompts(a.out, tok, a.rows, a.shards, a.min_tokens, a.max_tokens))


if __name__ == "__main__":
    main()
