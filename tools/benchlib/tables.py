"""Markdown tables, as the benchmark scripts print them, and the formatting of their cells."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def md_row(cells: Iterable[object]) -> str:
    """One table row: ``| a | b |`` (an empty cell: ``| |``)."""
    return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"


def md_rule(align: str) -> str:
    """The header rule, one letter a column: ``l`` (left, ``---``) or ``r`` (right, ``---:``)."""
    return "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"


def md_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A whole table: ``header``, its rule, ``rows``. ``align``: see :func:`md_rule` (columns
    beyond it are left-aligned)."""
    return "\n".join([md_row(header), md_rule(align.ljust(len(header), "l")), *(md_row(r) for r in rows)])


def fmt(v: object, unit: str = "") -> str:
    """A cell value: ``-`` for None; ``unit`` ``ms`` (seconds shown in ms, 1 decimal), ``s`` (2
    decimals), ``x`` (a ratio: 2 decimals and ``x``); else floats with 1 decimal, others as is."""
    if v is None:
        return "-"
    if unit == "ms":
        return f"{v * 1e3:.1f}"
    if unit == "s":
        return f"{v:.2f}"
    if unit == "x":
        return f"{v:.2f}x"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)
