"""What the benchmark scripts under ``tools/`` share, one concept a module:

- :mod:`.cli`: argument parsers described by a script's docstring, comma-separated option lists;
- :mod:`.procfs`: ``/proc`` reads: CPU times, the machine's busy time and CPU pressure, waiting
  for a quiet machine, the load average;
- :mod:`.sampling`: :class:`~.sampling.ProcSampler`, CPU use of a process tree over time;
- :mod:`.procs`: child processes: started with a log, waited for, stopped, ``python -m pipeline``;
- :mod:`.timing`: timing a callable;
- :mod:`.stats`: medians over runs, percentiles, ratios;
- :mod:`.tables`: Markdown tables and their cells;
- :mod:`.results`: JSON result files;
- :mod:`.machine`: a description of the machine.

The scripts run as ``python tools/NAME.py`` from the repository root; each puts the root on
``sys.path`` first and imports ``tools.benchlib``.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
