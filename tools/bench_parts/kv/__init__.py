"""Parts of ``tools/bench_kv.py``: buffers and descriptor layouts (:mod:`.buffers`), NIXL agents
(:mod:`.nixl`), raw CMA copies (:mod:`.cma`), the two worker processes (:mod:`.workers`) and
their orchestration (:mod:`.pair`), the memcpy reference (:mod:`.memcpy`), UCX settings and
transports (:mod:`.settings`, :mod:`.ucx`) and the tables (:mod:`.report`). The module docstring
of ``tools/bench_kv.py`` says what is measured and how."""
