"""Hydra's own application object over the package's ``conf/`` and user config directories:
composing, ``--hydra-help``, ``--info`` and ``--cfg hydra`` (what Hydra prints captured), and the
config groups with their options."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

from pipeline.config.errors import ConfigError, one_line
from pipeline.config.overrides import check_job_added
from pipeline.config.schema import register
from pipeline.config.searchpath import search_path, split_searchpath


@contextmanager
def hydra_app(dirs: list[str] | tuple[str, ...] = ()) -> Iterator[Any]:
    """Hydra's own application object (``hydra._internal.hydra.Hydra``, what ``@hydra.main``
    builds) over the package's ``conf/`` and the user config directories ``dirs`` (search path
    entries, :func:`split_searchpath`), at Hydra's version base 1.3; for composing,
    ``--hydra-help``, ``--info`` and ``--cfg hydra``. Hydra's global state is cleared on the way
    out. Runs compose with :func:`compose`: typed, validated."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra

    register()
    version.setbase("1.3")
    GlobalHydra.instance().clear()
    try:
        yield Hydra.create_main_hydra2("pipeline", search_path(dirs))
    finally:
        GlobalHydra.instance().clear()


def hydra_call(fn: Callable[[Any], None], dirs: list[str] | tuple[str, ...] = ()) -> str:
    """Run ``fn(app)`` on :func:`hydra_app` (with the user config directories ``dirs``) and
    return what it printed (Hydra prints, and logs to stdout for ``--info``).

    Raises:
        ConfigError: anything Hydra raised, or its ``sys.exit`` (then its last printed line), in
            one line.
    """
    import contextlib
    import io

    out = io.StringIO()
    try:
        with hydra_app(dirs) as app, contextlib.redirect_stdout(out):
            fn(app)
    except SystemExit as exc:
        printed = out.getvalue().strip().splitlines()
        raise ConfigError(printed[-1] if printed else f"hydra exited with status {exc.code}") from exc
    except Exception as exc:  # hydra raises many types; all are config errors here
        raise ConfigError(one_line(exc)) from exc
    return out.getvalue()


def groups(overrides: list[str] | tuple[str, ...] = ()) -> dict[str, tuple[list[str], str | None]]:
    """The config groups of the package's ``conf/`` and of the user config directories that
    ``overrides`` add (``hydra.searchpath``), Hydra's own left out: group -> (its options, both
    sources together, the option chosen with ``overrides``; None where none is: ``job`` until
    ``+job=NAME``). ``job`` first, then the order of ``conf/config.yaml``'s defaults list.

    Raises:
        ConfigError: an override that names no option of its group, ``job=NAME`` (for
            ``+job=NAME``), or a missing user config directory (one line).
    """
    from hydra.core.object_type import ObjectType
    from hydra.types import RunMode

    check_job_added(overrides)
    dirs, overrides = split_searchpath(overrides)
    with hydra_app(dirs) as app:
        loader = app.config_loader
        try:
            defaults = loader.compute_defaults_list("config", list(overrides), RunMode.RUN)
        except Exception as exc:  # hydra raises many types; all are config errors here
            raise ConfigError(one_line(exc)) from exc
        chosen: dict[str, str | None] = {"job": None}
        for d in defaults.defaults:
            group, _, name = (d.config_path or "").rpartition("/")
            if group and not group.startswith("hydra") and name != "schema":
                chosen[group] = name
        names = [g for g in loader.list_groups("") if g != "hydra"]
        order = [g for g in chosen if g in names] + sorted(set(names) - set(chosen))
        return {g: ([o for o in sorted(loader.get_group_options(g, ObjectType.CONFIG)) if o != "schema"],
                    chosen.get(g)) for g in order}
