"""The benchmark scripts' own parts: :mod:`.e2e` for ``tools/bench.py`` (the pipeline against
raw vLLM, disaggregated against colocated), :mod:`.kv` for ``tools/bench_kv.py`` (NIXL KV
transfers against memcpy). What several scripts share is in ``tools.benchlib``."""
