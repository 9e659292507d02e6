"""Where each setting of a composed config came from: the user's overrides, the chosen options'
presets (``conf/<group>/<option>.yaml``), or the schema's defaults. ``--dry-run`` prints it beside
the engine settings it resolved (:mod:`pipeline.preflight.settings`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

_UNSET = object()


@dataclass
class Origins:
    """The overrides a config was composed from (``dirs``: user config directories, ``overrides``:
    the rest, as :func:`pipeline.config.compose` passed them to Hydra)."""

    dirs: list[str]
    overrides: list[str]
    _presets: Any = field(default=None, repr=False, compare=False)

    def user_keys(self) -> set[str]:
        """Dotted keys the overrides set (``model.kv_cache_gib=2``, ``+model.engine_kwargs.x=1``);
        group choices (``pools=colocated``) are not keys."""
        keys = set()
        for o in self.overrides:
            key = o.split("=", 1)[0].lstrip("+~")
            if "=" in o and "." in key:
                keys.add(key)
        return keys

    def of(self, key: str) -> str:
        """``user``, ``preset`` or ``default`` for a dotted key such as ``model.max_model_len``:
        ``user`` when an override sets it or a key above it; ``preset`` when the chosen options
        give it a value other than the schema's default; else ``default``."""
        if any(key == k or key.startswith(k + ".") for k in self.user_keys()):
            return "user"
        preset = OmegaConf.select(self._preset_config(), key, default=_UNSET)
        return "preset" if preset is not _UNSET and preset != _schema_default(key) else "default"

    def _preset_config(self) -> Any:
        """The config composed from the group choices alone (no ``key=value``), once."""
        if self._presets is None:
            from pipeline.config.app import hydra_app
            from hydra.types import RunMode

            choices = [o for o in self.overrides if "." not in o.split("=", 1)[0]]
            with hydra_app(self.dirs) as app:
                self._presets = app.compose_config("config", choices, run_mode=RunMode.RUN, from_shell=False,
                                                   with_log_configuration=False)
        return self._presets


def _schema_default(key: str) -> Any:
    """The schema's default of a dotted key (``_UNSET`` when it has none: a required key)."""
    from pipeline.config.schema import Config

    cls: Any = Config
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        f = fields.get(part)
        if f is None:
            return _UNSET
        if i == len(parts) - 1:
            if f.default is not dataclasses.MISSING:
                return f.default
            return _UNSET
        cls = f.type if not isinstance(f.type, str) else _resolve(f.type)
    return _UNSET


def _resolve(name: str) -> Any:
    from pipeline.config import schema

    return getattr(schema, name.removeprefix("Optional[").removesuffix("]"), None)
