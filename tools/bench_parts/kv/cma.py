"""What UCX's cma transport does for a put, without UCX or NIXL: ``process_vm_writev`` calls
(the ``CMA`` op of ``tools/bench_kv.py``, the kernel's ceiling for that single-copy path)."""

from __future__ import annotations

import ctypes

import numpy as np

CMA_SEG_BYTES = 512 * 1024  # UCX_CMA_SEG_SIZE default (UCX 1.23)
CMA_MAX_IOV = 16  # UCX_CMA_MAX_IOV default


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def raw_cma_write(pid: int, local_rows: np.ndarray, remote_rows: np.ndarray):
    """A callable doing what UCX's cma transport does for a put, without UCX or NIXL: the same
    rows (address, length, device) as ``process_vm_writev`` calls of at most ``CMA_MAX_IOV``
    iovecs of at most ``CMA_SEG_BYTES`` each. The ceiling of any CMA-based transfer here."""
    pieces = []
    for (la, ln, _), (ra, _, _) in zip(local_rows.tolist(), remote_rows.tolist()):
        for off in range(0, ln, CMA_SEG_BYTES):
            pieces.append((la + off, ra + off, min(CMA_SEG_BYTES, ln - off)))
    calls = []
    for i in range(0, len(pieces), CMA_MAX_IOV):
        group = pieces[i:i + CMA_MAX_IOV]
        liov = (_IoVec * len(group))(*[(a, n) for a, _, n in group])
        riov = (_IoVec * len(group))(*[(b, n) for _, b, n in group])
        calls.append((liov, riov, len(group), sum(n for *_, n in group)))
    writev = ctypes.CDLL(None, use_errno=True).process_vm_writev
    writev.restype = ctypes.c_ssize_t
    writev.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]

    def move() -> None:
        for liov, riov, count, nbytes in calls:
            done = writev(pid, ctypes.addressof(liov), count, ctypes.addressof(riov), count, 0)
            if done != nbytes:
                raise OSError(ctypes.get_errno(), f"process_vm_writev moved {done} of {nbytes} B")
    return move
