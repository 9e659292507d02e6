"""Compose, validate and save the run configuration: Hydra's composition, typed into
:class:`~pipeline.config.schema.Config`, refusing keys the schema does not have."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pipeline.config.app import hydra_app
from pipeline.config.errors import ConfigError, one_line
from pipeline.config.provenance import Origins
from pipeline.config.overrides import check_job_added, explain, has_job, parse_overrides, with_own_model
from pipeline.config.schema import Config, register
from pipeline.config.searchpath import split_searchpath


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
    """Compose the package's ``conf/config.yaml`` with Hydra overrides (``+job=summarize``,
    ``pools=colocated``, ``job.input=PATH`` ...) and return the validated, typed :class:`Config`.
    ``hydra.searchpath=[file://DIR]`` adds a user config directory's options to the groups
    (:func:`split_searchpath`).

    Raises:
        ConfigError: an unknown group option, unknown key (``key=value`` and ``+key=value``
            alike), wrong type or out-of-range value, a missing user config directory; the
            message is one line and names the key, and says what to write instead where it can
            (:func:`pipeline.config.overrides.explain`: the nearest keys, how to quote a value;
            ``job=NAME``: ``+job=NAME``).
    """
    from hydra.types import RunMode
    from omegaconf import open_dict

    overrides = list(overrides)
    check_job_added(overrides)
    if not has_job(overrides):
        raise ConfigError("no job selected: add +job=NAME (for example +job=summarize)")
    dirs, overrides = split_searchpath(overrides)
    overrides = with_own_model(overrides)
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
            raise ConfigError(explain(unknown, overrides, Config))
        obj = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except Exception as exc:  # hydra/omegaconf raise many types; all are config errors here
        raise ConfigError(explain(one_line(exc), overrides, Config)) from exc
    assert isinstance(obj, Config)
    obj.origins = Origins(dirs, overrides)  # not a field: for --dry-run's "where each setting came from"
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
