"""Compose, validate and save the run configuration (Hydra over the package's ``conf/``, plus
any user config directories named with ``hydra.searchpath=[file://DIR]`` or ``--config-dir``)."""

from __future__ import annotations

import dataclasses
import itertools
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import (
    ClusterConfig, Config, JobConfig, ModelConfig, PoolsConfig, RagConfig, RunConfig, SamplingConfig,
    OffloadConfig, TransportConfig, register,
)

# The configuration and the sample data ship inside the package (package data), so a wheel finds
# them wherever it is installed; a checkout's top-level conf/ and data/ are links to these.
PACKAGE_DIR = Path(__file__).resolve().parents[1]
CONF_DIR = PACKAGE_DIR / "conf"
DATA_DIR = PACKAGE_DIR / "data"
SEARCHPATH_KEY = "hydra.searchpath"
if not OmegaConf.has_resolver("package_data"):
    # ${package_data:} in conf/ is the installed package's data/, so bundled inputs are found
    # from any directory, in a checkout and from a wheel alike.
    OmegaConf.register_new_resolver("package_data", lambda: str(DATA_DIR))
if not OmegaConf.has_resolver("repo_root"):
    # Kept for configs written before the data moved into the package: ${repo_root:}/data/...
    # still names the bundled data (the package directory holds data/ and conf/ as the
    # checkout's root did).
    OmegaConf.register_new_resolver("repo_root", lambda: str(PACKAGE_DIR))


class ConfigError(ValueError):
    """The configuration cannot be composed or validated; the message names the key."""


def _one_line(exc: BaseException) -> str:
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


def _unknown_key(node: DictConfig, prefix: str = "") -> str | None:
    """The first key of ``node`` (recursively) that its schema dataclass does not have, as
    OmegaConf words it for a plain ``key=value``; None when every key is known.

    Hydra adds a ``+key=value`` with the struct flag lifted, and ``OmegaConf.to_object`` then
    drops keys that are not dataclass fields without a word: ``+model.bogus=1`` or
    ``+job.sampling.stop=[x]`` would be accepted and ignored. Free-form fields (``dict`` types
    such as ``cluster.additional_parameters``) take any key.
    """
    cls = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(cls):
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    for key in node.keys():
        if key not in names:
            return f"{prefix}{key}: Key '{key}' not in '{cls.__name__}'"
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not (child._is_none() or child._is_missing()
                                                  or child._is_interpolation()):
            found = _unknown_key(child, f"{prefix}{key}.")
            if found:
                return found
    return None


def has_job(overrides: list[str] | tuple[str, ...]) -> bool:
    """Whether ``overrides`` pick a job (``+job=NAME``, ``job=NAME``)."""
    return any(o.lstrip("+~").startswith("job=") for o in overrides)


def _searchpath_entry(text: str) -> str:
    """One ``hydra.searchpath`` entry as Hydra reads it: ``file://DIR`` (``DIR`` alone too; a
    relative ``DIR`` is from the current directory, made absolute here) or ``pkg://MODULE``.

    Raises:
        ConfigError: a ``file://`` directory that does not exist, or a source Hydra cannot read.
    """
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "file", text
    if scheme == "file":
        path = os.path.abspath(os.path.expanduser(rest))
        if not os.path.isdir(path):
            raise ConfigError(f"{SEARCHPATH_KEY}: config directory {path} not found")
        return f"file://{path}"
    from hydra._internal.sources_registry import SourcesRegistry

    try:
        available = SourcesRegistry.instance().resolve(scheme)("command-line", text).available()
    except Exception as exc:  # an unknown scheme, a module that cannot be imported
        raise ConfigError(f"{SEARCHPATH_KEY}: {text}: {_one_line(exc)}") from exc
    if not available:
        raise ConfigError(f"{SEARCHPATH_KEY}: config source {text} not found")
    return text


def split_searchpath(overrides: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The user config directories that ``overrides`` add with ``hydra.searchpath=[file://DIR,
    ...]`` (``+``/``++`` prefixes too; several such overrides add up, in order), as absolute
    search path entries, and the other overrides, in their order.

    A user directory adds options to the shipped groups (``DIR/job/mine.yaml`` is
    ``+job=mine``, ``DIR/cluster/mysite.yaml`` is ``cluster=mysite``); where both have an
    option of the same name the shipped one is used, as with Hydra's own ``hydra.searchpath``.

    Raises:
        ConfigError: a value that is not a list of strings, or a directory that does not exist
            (one line).
    """
    dirs: list[str] = []
    rest: list[str] = []
    for text in overrides:
        if text.lstrip("+~").split("=", 1)[0] != SEARCHPATH_KEY:
            rest.append(text)
            continue
        (o,) = parse_overrides([text])
        if o.is_delete():
            raise ConfigError(f"{text}: the search path cannot be deleted; leave the override out")
        value = o.value()
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{text}: {SEARCHPATH_KEY} is a list of directories: "
                              f"{SEARCHPATH_KEY}=[file:///path/to/conf]")
        dirs += [_searchpath_entry(v) for v in value if v]
    return dirs, rest


def searchpath_override(dirs: list[str] | tuple[str, ...]) -> str:
    """``hydra.searchpath=[...]`` adding the directories ``dirs`` (paths, made absolute), quoted
    for Hydra's override grammar: what ``--config-dir DIR`` stands for.

    Raises:
        ConfigError: a directory that does not exist, or a path holding both quote characters.
    """
    entries = []
    for d in dirs:
        path = os.path.abspath(os.path.expanduser(d))
        if not os.path.isdir(path):
            raise ConfigError(f"--config-dir: config directory {path} not found")
        if "'" in path and '"' in path:
            raise ConfigError(f"--config-dir: {path}: a path with both quote characters cannot be an override")
        quote = '"' if "'" in path else "'"
        entries.append(f"{quote}file://{path}{quote}")
    return f"{SEARCHPATH_KEY}=[{','.join(entries)}]"


def compose(overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Compose the package's ``conf/config.yaml`` with Hydra overrides (``+job=summarize``,
    ``pools=colocated``, ``job.input=PATH`` ...) and return the validated, typed :class:`Config`.
    ``hydra.searchpath=[file://DIR]`` adds a user config directory's options to the groups
    (:func:`split_searchpath`).

    Raises:
        ConfigError: an unknown group option, unknown key (``key=value`` and ``+key=value``
            alike), wrong type or out-of-range value, a missing user config directory; the
            message is one line and names the key.
    """
    from hydra.types import RunMode
    from omegaconf import open_dict

    overrides = list(overrides)
    if not has_job(overrides):
        raise ConfigError("no job selected: add +job=NAME (for example +job=summarize)")
    dirs, overrides = split_searchpath(overrides)
    for o in parse_overrides(overrides):
        if o.is_sweep_override():
            raise ConfigError(f"{o.input_line}: a sweep: add -m (--multirun) for one run per value; "
                              f"a list is key=[a,b], a string with commas key='a,b'")
    try:
        with hydra_app(dirs) as app:
            cfg = app.compose_config("config", overrides, run_mode=RunMode.RUN, from_shell=False,
                                     with_log_configuration=False)
            with open_dict(cfg):
                del cfg["hydra"]
        unknown = _unknown_key(cfg)
        if unknown:
            raise ConfigError(unknown)
        obj = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except Exception as exc:  # hydra/omegaconf raise many types; all are config errors here
        raise ConfigError(_one_line(exc)) from exc
    assert isinstance(obj, Config)
    return obj


def to_yaml(cfg: Config) -> str:
    """``cfg`` as YAML: what ``--cfg job`` prints and ``RUN_DIR/config.yaml`` holds."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_yaml(path: str | Path) -> Config:
    """Load a resolved config saved by :func:`to_yaml` (the run directory's ``config.yaml``)."""
    register()
    merged = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path))
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, Config)
    return obj


# -- Hydra's command line: override grammar, sweeps, the application object ----------------------

def _search_path(dirs: list[str] | tuple[str, ...] = ()) -> Any:
    """Hydra's config search path: its own configs, the package's ``conf/``, then the user
    directories ``dirs`` (entries from :func:`split_searchpath`) where Hydra's ``--config-dir``
    puts them, then the typed schema."""
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    search_path = create_config_search_path(f"file://{CONF_DIR}")
    for d in dirs:
        search_path.prepend(provider="command-line", path=d, anchor=SearchPathQuery(provider="schema"))
    return search_path


def _loader(dirs: list[str] | tuple[str, ...] = ()) -> Any:
    """Hydra's config loader over ``conf/`` and the user directories ``dirs`` (lists group
    options for ``glob(...)`` sweeps)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    register()
    return ConfigLoaderImpl(config_search_path=_search_path(dirs))


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
            raise ConfigError(f"{text}: {_one_line(exc)}") from exc
    return parsed


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
        ConfigError: an override that does not parse, an interval sweep (no points to run), a
            sweep with no point at all, or a missing user config directory.
    """
    from hydra.core.override_parser.types import ValueType

    axes: list[list[tuple[str, bool]]] = []
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
        yield Hydra.create_main_hydra2("pipeline", _search_path(dirs))
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
        raise ConfigError(_one_line(exc)) from exc
    return out.getvalue()


def groups(overrides: list[str] | tuple[str, ...] = ()) -> dict[str, tuple[list[str], str | None]]:
    """The config groups of the package's ``conf/`` and of the user config directories that
    ``overrides`` add (``hydra.searchpath``), Hydra's own left out: group -> (its options, both
    sources together, the option chosen with ``overrides``; None where none is: ``job`` until
    ``+job=NAME``). ``job`` first, then the order of ``conf/config.yaml``'s defaults list.

    Raises:
        ConfigError: an override that names no option of its group, or a missing user config
            directory (one line).
    """
    from hydra.core.object_type import ObjectType
    from hydra.types import RunMode

    dirs, overrides = split_searchpath(overrides)
    with hydra_app(dirs) as app:
        loader = app.config_loader
        try:
            defaults = loader.compute_defaults_list("config", list(overrides), RunMode.RUN)
        except Exception as exc:  # hydra raises many types; all are config errors here
            raise ConfigError(_one_line(exc)) from exc
        chosen: dict[str, str | None] = {"job": None}
        for d in defaults.defaults:
            group, _, name = (d.config_path or "").rpartition("/")
            if group and not group.startswith("hydra") and name != "schema":
                chosen[group] = name
        names = [g for g in loader.list_groups("") if g != "hydra"]
        order = [g for g in chosen if g in names] + sorted(set(names) - set(chosen))
        return {g: ([o for o in sorted(loader.get_group_options(g, ObjectType.CONFIG)) if o != "schema"],
                    chosen.get(g)) for g in order}


__all__ = [
    "CONF_DIR", "ClusterConfig", "Config", "DATA_DIR", "OffloadConfig", "ConfigError", "JobConfig",
    "ModelConfig", "PoolsConfig", "RagConfig", "RunConfig", "SamplingConfig", "TransportConfig", "compose",
    "from_yaml", "groups", "has_job", "hydra_app", "hydra_call", "parse_overrides", "searchpath_override",
    "split_searchpath", "sweep_points", "to_yaml",
]
