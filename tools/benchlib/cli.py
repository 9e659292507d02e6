"""Argument handling shared by the benchmark scripts."""

from __future__ import annotations

import argparse
from typing import Any


def parser(doc: str, prog: str | None = None, **kw: Any) -> argparse.ArgumentParser:
    """An argument parser described by the first paragraph of a script's docstring ``doc``."""
    return argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0], **kw)


def csv_list(text: str) -> list[str]:
    """The items of a comma-separated option value, stripped, empty ones dropped."""
    return [x.strip() for x in text.split(",") if x.strip()]
