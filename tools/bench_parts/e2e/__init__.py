"""Parts of ``tools/bench.py``: configurations (:mod:`.configs`), inputs (:mod:`.inputs`), runs
(:mod:`.runs`, :mod:`.raw`, :mod:`.processes`), per-run figures (:mod:`.metrics`) and tables
(:mod:`.tables`, :mod:`.report`). The module docstring of ``tools/bench.py`` says what is
measured and how."""
