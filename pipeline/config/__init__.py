"""Compose, validate and save the run configuration (Hydra over the package's ``conf/``, plus
any user config directories named with ``hydra.searchpath=[file://DIR]`` or ``--config-dir``)."""

from __future__ import annotations

from pipeline.config.app import groups, hydra_app, hydra_call
from pipeline.config.composition import compose, from_yaml, to_yaml
from pipeline.config.errors import ConfigError
from pipeline.config.overrides import has_job, parse_overrides
from pipeline.config.paths import CONF_DIR, DATA_DIR
from pipeline.config.schema import (
    ClusterConfig, Config, JobConfig, ModelConfig, PoolsConfig, RagConfig, RunConfig, SamplingConfig,
    OffloadConfig, TransportConfig,
)
from pipeline.config.searchpath import searchpath_override, split_searchpath
from pipeline.config.sweeps import sweep_points

__all__ = [
    "CONF_DIR", "ClusterConfig", "Config", "DATA_DIR", "OffloadConfig", "ConfigError", "JobConfig",
    "ModelConfig", "PoolsConfig", "RagConfig", "RunConfig", "SamplingConfig", "TransportConfig", "compose",
    "from_yaml", "groups", "has_job", "hydra_app", "hydra_call", "parse_overrides", "searchpath_override",
    "split_searchpath", "sweep_points", "to_yaml",
]
