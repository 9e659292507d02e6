"""Everything that touches vLLM and NIXL: building an engine for a role (:mod:`.build`, with its
process environment and CPU pinning in :mod:`.env`), streaming one request (:mod:`.stream`), the
model and tokenizer (:mod:`.model`), KV sizes (:mod:`.kv_layout`), vLLM's NIXL connectors with a
sleeping progress thread (:mod:`.connector`, :mod:`.nixl_agent`), the decode host-DRAM tier
(:mod:`.dram_pool`, :mod:`.dram_connector`) and the per-step metrics recorder (:mod:`.steps`)."""
