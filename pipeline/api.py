"""The notebook API::

    from pipeline import submit
    run = submit("+job=summarize", "cluster=slurm", "pools.prefill=2")
    run.status()          # shards done / total, job states
    table = run.result()  # waits, then the output shards as a pyarrow dataset
"""

from __future__ import annotations

from pipeline.config import compose
from pipeline.run import RunHandle, start_job


def submit(*overrides: str) -> RunHandle:
    """Compose the same Hydra config as ``python -m pipeline`` with ``overrides`` (``+job=NAME``
    first; ``+job=summarize`` is added when no job is named), run the same checks at start
    (:func:`pipeline.preflight.preflight`), launch it, and return its
    :class:`~pipeline.run.RunHandle` without waiting. With ``"run.dry_run=true"`` nothing is
    launched: ``handle.plan.describe()`` says what would run.

    Raises:
        pipeline.config.ConfigError: a bad override or a failed check (one line naming the
            setting: a location, the input's columns, a template, a changed re-run ...);
            nothing was started.
    """
    args = list(overrides)
    if not any(a.lstrip("+~").startswith("job=") for a in args):
        args.insert(0, "+job=summarize")
    return start_job(compose(args))
