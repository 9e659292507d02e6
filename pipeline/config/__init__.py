"""Compose, validate and save the run configuration (Hydra compose API over ``conf/``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

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
    if not any(o.lstrip("+~").startswith("job=") for o in overrides):
        raise ConfigError("no job selected: add +job=NAME (for example +job=summarize)")
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
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_yaml(path: str | Path) -> Config:
    """Load a resolved config saved by :func:`to_yaml` (the run directory's ``config.yaml``)."""
    register()
    merged = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path))
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, Config)
    return obj


__all__ = [
    "ClusterConfig", "Config", "OffloadConfig", "ConfigError", "JobConfig", "ModelConfig", "PoolsConfig",
    "RagConfig", "RunConfig", "SamplingConfig", "TransportConfig", "compose", "from_yaml", "to_yaml",
]
