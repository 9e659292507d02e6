"""Compose, validate and save the run configuration (Hydra compose API over ``conf/``)."""

from __future__ import annotations

import dataclasses
import itertools
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import (
    ClusterConfig, Config, JobConfig, ModelConfig, PoolsConfig, RagConfig, RunConfig, SamplingConfig,
    OffloadConfig, TransportConfig, register,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
if not OmegaConf.has_resolver("repo_root"):
    # ${repo_root:} in conf/ is this checkout's root, so bundled paths work from any directory.
    OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT))


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


def compose(overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Compose ``conf/config.yaml`` with Hydra overrides (``+job=summarize``, ``pools=colocated``,
    ``job.input=PATH`` ...) and return the validated, typed :class:`Config`.

    Raises:
        ConfigError: an unknown group option, unknown key (``key=value`` and ``+key=value``
            alike), wrong type or out-of-range value; the message is one line and names the key.
    """
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register()
    overrides = list(overrides)
    if not has_job(overrides):
        raise ConfigError("no job selected: add +job=NAME (for example +job=summarize)")
    for o in parse_overrides(overrides):
        if o.is_sweep_override():
            raise ConfigError(f"{o.input_line}: a sweep: add -m (--multirun) for one run per value; "
                              f"a list is key=[a,b], a string with commas key='a,b'")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=overrides)
        unknown = _unknown_key(cfg)
        if unknown:
            raise ConfigError(unknown)
        obj = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except Exception as exc:  # hydra/omegaconf raise many types; all are config errors here
        raise ConfigError(_one_line(exc)) from exc
    finally:
        GlobalHydra.instance().clear()
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

def _loader() -> Any:
    """Hydra's config loader over ``conf/`` (lists group options for ``glob(...)`` sweeps)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path

    register()
    return ConfigLoaderImpl(config_search_path=create_config_search_path(f"file://{CONF_DIR}"))


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
    kept exactly as written (``BasicSweeper`` would rewrite ``~key`` as ``~key=null``); a
    ``glob`` leaves out the ``schema`` option that the typed schema adds to every group.

    Raises:
        ConfigError: an override that does not parse, an interval sweep (no points to run), or a
            sweep with no point at all.
    """
    from hydra.core.override_parser.types import ValueType

    axes: list[list[tuple[str, bool]]] = []
    for o in parse_overrides(overrides, _loader()):
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
def hydra_app() -> Iterator[Any]:
    """Hydra's own application object (``hydra._internal.hydra.Hydra``, what ``@hydra.main``
    builds) over ``conf/``, for ``--hydra-help``, ``--info`` and ``--cfg hydra``; Hydra's global
    state is cleared on the way out. Runs compose with :func:`compose` instead: typed, validated."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra

    register()
    GlobalHydra.instance().clear()
    try:
        yield Hydra.create_main_hydra2("pipeline", create_config_search_path(f"file://{CONF_DIR}"))
    finally:
        GlobalHydra.instance().clear()


def hydra_call(fn: Callable[[Any], None]) -> str:
    """Run ``fn(app)`` on :func:`hydra_app` and return what it printed (Hydra prints, and logs
    to stdout for ``--info``).

    Raises:
        ConfigError: anything Hydra raised, or its ``sys.exit`` (then its last printed line), in
            one line.
    """
    import contextlib
    import io

    out = io.StringIO()
    try:
        with hydra_app() as app, contextlib.redirect_stdout(out):
            fn(app)
    except SystemExit as exc:
        printed = out.getvalue().strip().splitlines()
        raise ConfigError(printed[-1] if printed else f"hydra exited with status {exc.code}") from exc
    except Exception as exc:  # hydra raises many types; all are config errors here
        raise ConfigError(_one_line(exc)) from exc
    return out.getvalue()


def groups(overrides: list[str] | tuple[str, ...] = ()) -> dict[str, tuple[list[str], str | None]]:
    """The config groups of ``conf/`` (Hydra's own left out): group -> (its options, the option
    chosen with ``overrides``; None where none is: ``job`` until ``+job=NAME``). ``job`` first,
    then the order of ``conf/config.yaml``'s defaults list.

    Raises:
        ConfigError: an override that names no option of its group (one line).
    """
    from hydra.core.object_type import ObjectType
    from hydra.types import RunMode

    with hydra_app() as app:
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
    "ClusterConfig", "Config", "OffloadConfig", "ConfigError", "JobConfig", "ModelConfig", "PoolsConfig",
    "RagConfig", "RunConfig", "SamplingConfig", "TransportConfig", "compose", "from_yaml", "groups",
    "has_job", "hydra_app", "hydra_call", "parse_overrides", "sweep_points", "to_yaml",
]
