"""The points of a ``-m`` sweep, expanded the way Hydra's ``BasicSweeper`` does."""

from __future__ import annotations

import itertools
from typing import Any

from pipeline.config.errors import ConfigError
from pipeline.config.overrides import check_job_added, parse_overrides
from pipeline.config.schema import register
from pipeline.config.searchpath import search_path, split_searchpath


def _loader(dirs: list[str] | tuple[str, ...] = ()) -> Any:
    """Hydra's config loader over ``conf/`` and the user directories ``dirs`` (lists group
    options for ``glob(...)`` sweeps)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    register()
    return ConfigLoaderImpl(config_search_path=search_path(dirs))


def sweep_points(overrides: list[str] | tuple[str, ...]) -> list[tuple[list[str], list[str]]]:
    """The points of a ``-m`` sweep, expanded the way Hydra's ``BasicSweeper`` does: the cartesian
    product of every sweep override's values (``key=a,b``, ``range(0,3)``, ``choice(a,b)``,
    ``glob(*)`` over a group's options, ``sort``/``shuffle`` of those), the first override varying
    slowest. Each point: (its whole override list, the overrides that vary). Other overrides are
    kept exactly as written (``BasicSweeper`` would rewrite ``~key`` as ``~key=null``), the
    ``hydra.searchpath`` of user config directories included; a ``glob`` leaves out the
    ``schema`` option that the typed schema adds to every group and sees the user directories'
    options.

    Raises:
        ConfigError: an override that does not parse, ``job=NAME`` (for ``+job=NAME``), an interval sweep (no points to run), a
            sweep with no point at all, or a missing user config directory.
    """
    from hydra.core.override_parser.types import ValueType

    axes: list[list[tuple[str, bool]]] = []
    check_job_added(overrides)
    dirs, _ = split_searchpath(overrides)
    for o in parse_overrides(overrides, _loader(dirs)):
        if not o.is_sweep_override():
            axes.append([(o.input_line, False)])
            continue
        if not o.is_discrete_sweep():
            raise ConfigError(f"{o.input_line}: an interval sweep has no points to run; "
                              f"list the values (a,b) or use range(start,stop,step)")
        values = [v for v in o.sweep_string_iterator()
                  if not (o.value_type == ValueType.GLOB_CHOICE_SWEEP and v == "schema")]
        axes.append([(f"{o.get_key_element()}={v}", True) for v in values])
    points = [([text for text, _ in p], [text for text, swept in p if swept]) for p in itertools.product(*axes)]
    if not points:
        raise ConfigError(f"the sweep has no points: {' '.join(overrides)}")
    return points
