"""Worker roles: prefill (owns shards, hands KV off), decode (continuous batching on handed-off
KV) and colocated (plain vLLM generation, the baseline). Each ``*_main`` is one process."""
