"""Hydra's override grammar: reading ``key=value`` overrides as Hydra does."""

from __future__ import annotations

from typing import Any

from pipeline.config.errors import ConfigError, one_line


def has_job(overrides: list[str] | tuple[str, ...]) -> bool:
    """Whether ``overrides`` pick a job (``+job=NAME``, ``job=NAME``)."""
    return any(o.lstrip("+~").startswith("job=") for o in overrides)


def parse_overrides(overrides: list[str] | tuple[str, ...], loader: Any = None) -> list[Any]:
    """``overrides`` read with Hydra's own override grammar (``hydra.core.override_parser``), as
    its ``Override`` objects; ``loader``: a config loader, needed to expand ``glob(...)``.

    Raises:
        ConfigError: an override that does not parse, named, with the grammar's first line.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create(config_loader=loader)
    parsed = []
    for text in overrides:
        try:
            parsed += parser.parse_overrides([text])
        except Exception as exc:  # OverrideParseException and whatever the grammar raises
            raise ConfigError(f"{text}: {one_line(exc)}") from exc
    return parsed
