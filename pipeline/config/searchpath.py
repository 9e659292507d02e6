"""User config directories: the ``hydra.searchpath=[file://DIR]`` grammar, ``--config-dir``, and
Hydra's config search path over the package's ``conf/`` and those directories."""

from __future__ import annotations

import os
from typing import Any

from pipeline.config.errors import ConfigError, one_line
from pipeline.config.overrides import parse_overrides
from pipeline.config.paths import CONF_DIR

SEARCHPATH_KEY = "hydra.searchpath"


def searchpath_entry(text: str) -> str:
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
        raise ConfigError(f"{SEARCHPATH_KEY}: {text}: {one_line(exc)}") from exc
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
        dirs += [searchpath_entry(v) for v in value if v]
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


def search_path(dirs: list[str] | tuple[str, ...] = ()) -> Any:
    """Hydra's config search path: its own configs, the package's ``conf/``, then the user
    directories ``dirs`` (entries from :func:`split_searchpath`) where Hydra's ``--config-dir``
    puts them, then the typed schema."""
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    path = create_config_search_path(f"file://{CONF_DIR}")
    for d in dirs:
        path.prepend(provider="command-line", path=d, anchor=SearchPathQuery(provider="schema"))
    return path
