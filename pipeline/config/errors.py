"""The one error a configuration raises, and how Hydra's and OmegaConf's errors become one line
naming the key."""

from __future__ import annotations


class ConfigError(ValueError):
    """The configuration cannot be composed or validated; the message names the key."""


def one_line(exc: BaseException) -> str:
    """One line naming the cause: the innermost OmegaConf error with its ``full_key``, or
    Hydra's first line plus the options a config group offers."""
    chain = []
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    for e in reversed(chain):
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), "")
        if key and lines:
            return f"{key}: {lines[0]}"
    text = str(chain[0])
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = lines[0] if lines else type(chain[0]).__name__
    if "Available options in" in text:
        idx = next(i for i, ln in enumerate(lines) if ln.startswith("Available options in"))
        options = []
        for ln in lines[idx + 1:]:
            if ln.startswith("Config search path"):
                break
            if ln != "schema":
                options.append(ln)
        first += f" (available: {', '.join(options) or 'none'})"
    return first
