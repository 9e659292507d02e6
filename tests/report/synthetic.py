"""Synthetic run directories for the pipeline.report tests (no vLLM): request and worker metrics
whose numbers the tests check against values computed from the raw token times, and a check that
a PNG is a real image."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io.metrics import WORKER_SCHEMA, write_request_metrics

T0 = 1_000_000.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def req(key: str, read_at: float, ps: float, pe: float | None, tokens: list[float], *,
        error: str | None = None, prompt: int = 100, cached: int = 0, kv_bytes: int = 0) -> dict:
    return {
        "key": key, "shard": "s0.parquet", "row": int(key.split(":")[1]),
        "prefill_worker": "prefill-0@h" if pe is not None else "colocated-0@h",
        "decode_worker": "decode-0@h" if pe is not None else None,
        "read_at": T0 + read_at, "prefill_start": T0 + ps,
        "prefill_end": None if pe is None else T0 + pe,
        "decode_arrived_at": None if pe is None else T0 + pe + 0.01,
        "token_times": [T0 + t for t in tokens], "prompt_tokens": prompt,
        "output_tokens": len(tokens), "kv_tokens": prompt if pe is not None else 0,
        "kv_bytes": kv_bytes, "prefix_cached_tokens": cached, "tries": 1, "error": error,
    }


# Gaps (s): r0 .02 .02 0 .11 .02 | r1 .01 .09 .02 | r2 .01 .01: exactly two > 60 ms (.11, .09),
# one gap of 0 (two tokens in one streamed output).
REQUESTS = [
    req("0:0", 0.0, 0.1, 0.3, [0.40, 0.42, 0.44, 0.44, 0.55, 0.57], cached=50, kv_bytes=1000),
    req("0:1", 0.0, 0.2, 0.5, [0.60, 0.61, 0.70, 0.72], kv_bytes=2000),
    req("0:2", 0.0, 0.3, 0.6, [0.65, 0.66, 0.67], cached=10, kv_bytes=3000),
    req("0:3", 0.0, 0.4, None, [], error="prefill failed: boom"),
]

# (worker, role, t, running, kv usage): decode-0 busy on [0,1) [2,4) [4,5) of a 5 s span = 0.8;
# prefill-0 busy on [0,0.5) of a 3 s span.
STEPS = [
    ("decode-0@h", "decode", 4.0, 3, 0.5),
    ("decode-0@h", "decode", 0.0, 2, 0.1),
    ("decode-0@h", "decode", 2.0, 1, 0.05),
    ("decode-0@h", "decode", 5.0, 0, 0.2),
    ("decode-0@h", "decode", 1.0, 0, 0.0),
    ("prefill-0@h", "prefill", 0.0, 1, 0.3),
    ("prefill-0@h", "prefill", 0.5, 0, 0.0),
    ("prefill-0@h", "prefill", 3.0, 0, 0.0),
]


def _write_steps(run: Path, steps, name: str = "steps") -> None:
    # Columns not given here (NIXL telemetry, DRAM tier) are null, as in a step that moved no KV.
    table = pa.Table.from_pylist([{
        "worker": s[0], "role": s[1], "t": T0 + s[2], "running": s[3], "waiting": 0,
        "kv_cache_usage": s[4], "prompt_tokens": 0, "generation_tokens": 1,
        "prefix_cache_queries": 0, "prefix_cache_hits": 0,
    } for s in steps], schema=WORKER_SCHEMA)
    path = run / "metrics" / "workers" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def make_run(path: Path, requests=REQUESTS, steps=STEPS, stretch: float = 1.0) -> Path:
    """A run directory with ``requests`` (all times x ``stretch`` around T0) in two part files."""
    def s(r):
        r = dict(r)
        for k in ("read_at", "prefill_start", "prefill_end", "decode_arrived_at"):
            if r[k] is not None:
                r[k] = T0 + (r[k] - T0) * stretch
        r["token_times"] = [T0 + (t - T0) * stretch for t in r["token_times"]]
        return r

    reqs = [s(r) for r in requests]
    write_request_metrics(path, "s0.parquet", reqs[:2])
    write_request_metrics(path, "s0.parquet", reqs[2:])
    if steps:
        _write_steps(path, [(w, r, t * stretch, n, kv) for w, r, t, n, kv in steps])
    (path / "summary.json").write_text(json.dumps({"rows": len(requests), "wall_s": 9.0}))
    return path


def raw_gaps() -> list[np.ndarray]:
    """The ITL gaps of :data:`REQUESTS`, per request with more than one token."""
    return [np.diff(np.array(r["token_times"])) for r in REQUESTS if len(r["token_times"]) > 1]


def assert_png(path: Path) -> None:
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 2000, (path, len(data))
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img.std() > 0.01  # not a blank canvas
