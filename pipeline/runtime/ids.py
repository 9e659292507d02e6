"""Names of the things one run has many of: workers, rows and vLLM requests.

- worker id ``"<role>-<index>@<host>"``: a prefill, decode or colocated worker;
- row key ``"<shard index>:<row index>"``: one input row, unique within the run;
- request id ``"row<row key>"`` (``"row<row key>t<try>"`` on a retry): the vLLM request of a row.
"""

from __future__ import annotations

import socket


def worker_id(role: str, index: int) -> str:
    """``"<role>-<index>@<host>"``: names a worker in output rows, logs and the run directory."""
    return f"{role}-{index}@{socket.gethostname()}"


def row_key(shard_index: int, row: int) -> str:
    """``"<shard index>:<row index>"``: names one input row, unique within the run."""
    return f"{shard_index}:{row}"


def request_id(key: str, try_: int = 0) -> str:
    """The vLLM request id of row ``key`` (:func:`row_key`) on its ``try_``-th
    prefill (0 first), the same on the prefill and the decode engine: vLLM's NIXL push connector
    pairs the decode side's registration with the prefill side's finished blocks by this id (less
    the random suffix vLLM appends after the last "-"), so it must match on both sides and must not
    contain "-" itself. A retry gets a new id so that it never meets blocks the prefill engine
    still holds for an earlier, abandoned try."""
    return f"row{key}" if try_ == 0 else f"row{key}t{try_}"
