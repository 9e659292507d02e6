"""The run's shared secret: 32 random bytes, hex, in ``RUN_DIR/secret`` (mode 0600), created
once per run directory; control-channel messages are signed with it (:mod:`pipeline.wire.auth`)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def create_secret(path: Path) -> bytes:
    """Read the secret at ``path``, creating it (32 random bytes, hex, mode 0600) if absent."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_secret(path)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return read_secret(path)


def read_secret(path: Path) -> bytes:
    return bytes.fromhex(Path(path).read_text().strip())
