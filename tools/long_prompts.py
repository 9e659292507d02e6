"""Write a long-prompt input set: rows whose text is ``min_tokens``-``max_tokens`` tokens of the
bundled Python Language Reference corpus (``data/rag/corpus.parquet``, PSF licence), each row
starting at a different section, so no two prompts share a prefix.

    python tools/long_prompts.py OUT_DIR [--rows 8] [--shards 1] [--min-tokens 4000] [--max-tokens 7500]

Used by the DRAM-tier test (tests/test_dram_tier.py), benchmark (tools/bench_dram.py) and GPU check
(tools/gpu_dram_check.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def write_long_prompts(out: Path, tokenizer, rows: int = 8, shards: int = 1, min_tokens: int = 4000,
                       max_tokens: int = 7500) -> list[int]:
    """Write ``shards`` Parquet shards (``id``, ``text``) of ``rows`` rows in all; row ``i`` has
    ``min_tokens + i * (max_tokens - min_tokens) / (rows - 1)`` tokens (evenly spread). Returns
    the token counts, in row order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sections = pq.read_table(ROOT / "data" / "rag" / "corpus.parquet").column("text").to_pylist()
    out.mkdir(parents=True, exist_ok=True)
    recs, counts = [], []
    for i in range(rows):
        n = min_tokens + (i * (max_tokens - min_tokens) // (rows - 1) if rows > 1 else 0)
        start = (i * 7) % len(sections)
        text = "\n\n".join(sections[start:] + sections[:start])
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:n]
        recs.append({"id": f"long{i}", "text": tokenizer.decode(ids)})
        counts.append(n)
    per = -(-rows // shards)
    for s in range(shards):
        pq.write_table(pa.Table.from_pylist(recs[s * per:(s + 1) * per]), out / f"shard-{s:05d}.parquet")
    return counts


def main() -> None:
    from tools.benchlib.cli import parser

    ap = parser(__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--min-tokens", type=int, default=4000)
    ap.add_argument("--max-tokens", type=int, default=7500)
    a = ap.parse_args()
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer

    tok = load_tokenizer(compose(["+job=summarize"]))
    print(write_long_prompts(a.out, tok, a.rows, a.shards, a.min_tokens, a.max_tokens))


if __name__ == "__main__":
    main()
