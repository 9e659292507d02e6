"""JSON result files of the benchmark scripts."""

from __future__ import annotations

import json
import os
from typing import Any


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` to ``path`` as indented JSON (values JSON cannot hold, such as paths, as
    their ``str``)."""
    with open(path, "w") as f:
        f.write(json.dumps(data, indent=1, default=str))
