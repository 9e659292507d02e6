"""Everything that touches vLLM and NIXL: building an engine for a role (:mod:`.build`, with its
process environment and CPU pinning in :mod:`.env`), streaming one request (:mod:`.stream`), the
model and tokenizer (:mod:`.model`), KV sizes (:mod:`.kv_layout`), vLLM's NIXL connectors with a
sleeping progress thread (:mod:`.connector`, :mod:`.nixl_agent`) and decode blocks taken back
after a hand-off given up on (:mod:`.reclaim`), the decode host-DRAM tier (:mod:`.dram_pool`,
:mod:`.dram_connector`), the per-step metrics recorder (:mod:`.steps`) and the reaper that ends
a worker's engine processes with it (:mod:`.reaper`)."""
