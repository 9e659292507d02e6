"""A toy model and machine with round numbers, so every result of the planner's tests can be
worked by hand:

- KV bytes/token = 2 x 5 layers x 1 KV head x 10 head dim x 2 bytes = 200 B
- weights        = 5e6 params x 2 bytes = 1e7 B; no vocabulary, so N = params = 5e6
- prefill FLOPs of a 1000-token prompt = 2 N L + 2 n_layer L^2 d_attn
                 = 2 x 5e6 x 1000 + 2 x 5 x 1000^2 x 10 = 1e10 + 1e8 = 1.01e10
- at 1.01e10 FLOP/s (MFU 1): S = 1.0 s
- decode step, memory branch: (1e7 + n x 200 x c) / 1e8 B/s, c = 1000 + 100/2 = 1050 tokens
                 = 0.1 s + 0.0021 s x n
- compute branch: n x (2 x 5e6 + 4 x 5 x 1050 x 10) / 1.01e10 = 0.00101 s x n (never larger)
- hand-off: 200 B x 1000 tokens = 2e5 B over 1e8 B/s = 2 ms
"""

from __future__ import annotations

from pipeline.plan.hardware import Hardware
from pipeline.plan.model import ModelShape
from pipeline.plan.workload import Workload, workload

TOY = ModelShape(name="toy", layers=5, hidden=10, heads=1, kv_heads=1, head_dim=10, vocab=0,
                 params=5e6, dtype="bfloat16")
TOY_HW = Hardware("toy", peak_flops=1.01e10, mem_bw=1e8, memory_bytes=1e9, link_bw=1e8,
                  mfu=1.0, mbu=1.0, kv_cache_bytes=1e7, max_batch=24)


def toy_load(rate: float | None = None, count: int | None = None) -> Workload:
    """Requests of 1000 prompt and 100 output tokens, at ``rate`` or a batch of ``count``."""
    return workload(1000, 100, rate=rate, count=count)
