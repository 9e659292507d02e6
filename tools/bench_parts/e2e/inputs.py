"""The inputs of ``tools/bench.py``: Parquet shards built from CPython standard-library
docstrings (PSF License), a uniform short workload and a mixed one with long rows."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from typing import Any

from tools.bench_parts.e2e.elastic import write_elastic_workloads
from tools.make_sample_data import clip

SHORT_MIN_CHARS, SHORT_MAX_CHARS = 600, 1200


def _stdlib_docstrings() -> list[tuple[str, str]]:
    """(module, docstring) of standard-library modules, read with ``ast`` from their source files
    (nothing is imported), sorted by name."""
    out = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in {"this", "antigravity"}:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = getattr(spec, "origin", None) if spec else None
        if not origin or not origin.endswith(".py"):
            continue
        try:
            doc = ast.get_docstring(ast.parse(Path(origin).read_text(encoding="utf-8")))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if doc and len(doc.strip()) >= SHORT_MIN_CHARS:
            out.append((name, doc.strip()))
    return out


#: The long workload (the seeds' regime for P/D: long prompts, prompt:output at least 8:1): its
#: rows' document tokens spread evenly over this range; run at ``LONG_CONTEXT`` tokens of context.
LONG_RANGE = (3000, 6000)
LONG_CONTEXT = 8192


def _long_texts(docs: list[tuple[str, str]], targets: list[int], tokenizer: Any, first: int = 0) -> list[tuple[str, str]]:
    """One text per target length (tokens): full docstrings concatenated from module
    ``first + 7 j`` on (no shared prefix between rows), cut to the target."""
    full = [d for _, d in sorted(docs, key=lambda x: -len(x[1]))]
    out = []
    for j, target in enumerate(targets):
        parts, k = [], first + j * 7
        while True:
            parts.append(full[k % len(full)])
            k += 1
            ids = tokenizer("\n\n".join(parts), add_special_tokens=False)["input_ids"]
            if len(ids) >= target:
                break
        out.append((f"long{first + j}", tokenizer.decode(ids[:target])))
    return out


def build_workloads(work: Path, rows: int, shards: int, long_frac: float, long_tokens: int,
                    max_model_len: int, max_new_tokens: int, tokenizer: Any, long_rows: int = 0,
                    elastic: bool = False) -> dict[str, dict]:
    """Write ``work/inputs/{uniform,mixed,long}/part-NNNNN.parquet`` (``rows`` rows over
    ``shards`` shards, ``long_rows`` for *long*; columns ``id``, ``module``, ``kind``
    (short/long), ``text``) and return per workload its directory and prompt-size facts.

    Short rows: distinct module docstrings clipped to <= 1200 characters (~150-350 tokens), at
    a paragraph boundary as tools/make_sample_data.py clips its documents.
    Mixed: in each shard every ``1/long_frac``-th row (from row 1) is long: several full
    docstrings concatenated, starting at a different module for each long row (no shared
    prefix), cut to a length spread over [0.8, 1.2] x ``long_tokens`` tokens and capped so that
    prompt + ``max_new_tokens`` fits ``max_model_len``.
    Long (with ``long_rows`` > 0): every row long, document tokens spread evenly over
    :data:`LONG_RANGE`, none sharing a prefix with the mixed workload's long rows.
    With ``elastic``, also the elastic part's (:mod:`tools.bench_parts.e2e.elastic`).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = _stdlib_docstrings()
    short = [(m, c) for m, c in ((m, clip(d, SHORT_MAX_CHARS)) for m, d in docs) if len(c) >= 400]
    if len(short) < rows:
        raise SystemExit(f"only {len(short)} distinct short documents; use --rows <= {len(short)}")
    per = [rows // shards + (1 if i < rows % shards else 0) for i in range(shards)]
    every = max(1, round(1 / long_frac)) if long_frac > 0 else 0
    n_long = sum(sum(1 for r in range(n) if every and r % every == 1 % every) for n in per)
    cap = max_model_len - max_new_tokens - 64  # room for the template and the output
    longs = _long_texts(docs, [min(cap, int(long_tokens * (0.8 + (0.4 * j / (n_long - 1) if n_long > 1 else 0.2))))
                               for j in range(n_long)], tokenizer)
    lo, hi = LONG_RANGE
    all_long = _long_texts(docs, [min(LONG_CONTEXT - max_new_tokens - 64, lo + (hi - lo) * j // max(1, long_rows - 1))
                                  for j in range(long_rows)], tokenizer, first=n_long * 7 + 3)
    out = {}
    if elastic:  # the elastic part's workloads (tools.bench_parts.e2e.elastic)
        cap = max_model_len - 8 - 64
        longs_e = _long_texts(docs, [min(cap, int(long_tokens * (0.8 + 0.4 * j / max(1, rows - 1))))
                                     for j in range(rows)], tokenizer, first=(n_long + long_rows) * 7 + 5)
        out.update(write_elastic_workloads(work, rows, shards, short, longs_e, tokenizer))
    for wl in ("uniform", "mixed", "long"):
        if wl == "long" and not long_rows:
            continue
        n_rows = long_rows if wl == "long" else rows
        per = [n_rows // shards + (1 if i < n_rows % shards else 0) for i in range(shards)]
        d = work / "inputs" / wl
        d.mkdir(parents=True, exist_ok=True)
        si, li = 0, 0
        for s, n in enumerate(per):
            recs = []
            for r in range(n):
                if wl == "long":
                    m, t = all_long[li]
                    li += 1
                    kind = "long"
                elif wl == "mixed" and every and r % every == 1 % every:
                    m, t = longs[li]
                    li += 1
                    kind = "long"
                else:
                    m, t = short[si]
                    si += 1
                    kind = "short"
                recs.append({"id": f"{wl}-{s}-{r}", "module": m, "kind": kind, "text": t})
            pq.write_table(pa.Table.from_pylist(recs), d / f"part-{s:05d}.parquet")
        toks = [len(tokenizer(t, add_special_tokens=False)["input_ids"])
                for p in sorted(d.glob("*.parquet")) for t in pq.read_table(p).column("text").to_pylist()]
        out[wl] = {"dir": str(d), "rows": n_rows, "shards": shards, "text_tokens": toks,
                   "long_rows": li, "text_tokens_total": sum(toks)}
    return out
