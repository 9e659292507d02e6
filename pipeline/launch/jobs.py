"""The job functions submitit runs, one process each, locally or on Slurm.

They are small callables rather than plain functions so that submitit can requeue them on a time
limit or preemption (``checkpoint`` returns the same call again): nothing needs saving here, a
restarted worker resumes from the run directory (done shards, row checkpoints, decode endpoints).
"""

from __future__ import annotations

import submitit


class DecodeJob:
    """Decode rank(s). On Slurm each node's ranks are a job of their own, one task per rank
    (so that a node lost takes only its own ranks), rank ``first_rank`` + the task's rank in it."""

    def __init__(self, run_dir: str, first_rank: int = 0):
        self.run_dir, self.first_rank = run_dir, first_rank

    def __call__(self, rank: int | None = None, cpus: str | None = None) -> str:
        from pipeline.roles.decode import decode_main

        if rank is None:
            rank = self.first_rank + submitit.JobEnvironment().global_rank
        return decode_main(self.run_dir, rank, cpus)

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


class ArrayTaskJob:
    """One array task: a prefill worker (``role="prefill"``) or a colocated worker, which claims
    shards as it frees up (:mod:`pipeline.runtime.claims`) and owns each end to end, at most
    ``limit`` of them (None: until none is left)."""

    def __init__(self, role: str, run_dir: str, limit: int | None = None):
        self.role, self.run_dir, self.limit = role, run_dir, limit

    def __call__(self, task: int, cpus: str | None = None) -> str:
        if self.role == "prefill":
            from pipeline.roles.prefill import prefill_main

            return prefill_main(self.run_dir, task, self.limit, cpus)
        from pipeline.roles.colocated import colocated_main

        return colocated_main(self.run_dir, task, self.limit, cpus)

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)
