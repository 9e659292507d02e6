"""On Slurm, what every node reads must lie on a file system the nodes share: the Python
environment the workers run (``sys.prefix``), the model's folder (``model.path``, a hub id's
snapshot in the Hugging Face cache, or the bundled model's converted copy in
``PD_PIPELINE_CACHE``) and the run directory. A start names each that lies on a local file
system of the machine it runs on (:func:`not_shared`): a warning, since a site may keep an
identical copy on every node's local disk."""

from __future__ import annotations

import os
import sys

import psutil

from pipeline.config import Config

#: File system types (``/proc/mounts``) that nodes of a cluster share.
NETWORK_FS = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs", "fuse.glusterfs", "panfs",
    "wekafs", "fuse.weka", "fuse.juicefs", "fuse.sshfs", "cifs", "smb3", "smbfs", "afs", "orangefs",
    "pvfs2", "fuse.gcsfuse", "fuse.s3fs", "fuse.rclone", "fuse.mountpoint-s3", "9p", "virtiofs",
})


def mount_of(path: str) -> tuple[str, str]:
    """``(mount point, file system type)`` of the mount holding ``path`` (the longest mount
    point that is a prefix of its real path, from ``/proc/mounts`` through psutil)."""
    real = os.path.realpath(path)
    best = ("/", "")
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if (real == mp or real.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best[0]):
            best = (mp, part.fstype)
    return best


def _inside(path: str, folders: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == os.path.realpath(f) or real.startswith(os.path.realpath(f).rstrip("/") + "/") for f in folders)


def not_shared(cfg: Config, places: dict[str, str]) -> list[str]:
    """One line for each of ``places`` (``what -> path``) that nodes may not see: outside every
    folder of ``cluster.shared_paths`` when that is set, else on a file system not of
    :data:`NETWORK_FS`. Paths that do not exist yet are judged by their nearest existing
    parent."""
    lines = []
    for what, path in places.items():
        probe = path
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe.rstrip("/")) or "/"
        if cfg.cluster.shared_paths:
            if not _inside(probe, cfg.cluster.shared_paths):
                lines.append(f"{what} {path} is outside cluster.shared_paths ({', '.join(cfg.cluster.shared_paths)})")
            continue
        mount, fstype = mount_of(probe)
        if fstype not in NETWORK_FS:
            lines.append(f"{what} {path} is on a local file system ({fstype or 'unknown'} at {mount})")
    return lines


def slurm_places(cfg: Config, model_dir: str | None, run_dir: str) -> dict[str, str]:
    """What Slurm's nodes read, ``what -> path``: the Python environment, the model's folder (or
    the cache the bundled model is converted into), the run directory."""
    from pipeline.model.resolve import cache_dir

    return {"the Python environment": sys.prefix,
            "the model": model_dir or str(cache_dir()),
            "run.dir": os.path.abspath(run_dir)}


def shared_fs_warning(cfg: Config, model_dir: str | None, run_dir: str) -> str | None:
    """The start's one-line warning for a Slurm run (None when all is shared, or not on Slurm)."""
    if cfg.cluster.launcher != "slurm":
        return None
    lines = not_shared(cfg, slurm_places(cfg, model_dir, run_dir))
    if not lines:
        return None
    return ("warning: Slurm's nodes may not see " + "; ".join(lines) + ": put it on a file system every node mounts "
            "(docs/slurm.md), or list the shared folders in cluster.shared_paths")
