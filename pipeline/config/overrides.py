"""Hydra's override grammar: reading ``key=value`` overrides as Hydra does, and what to write
instead when one is a common mistake (``job=NAME`` for ``+job=NAME``, a value with braces the
shell or Hydra split, a misspelt key or vLLM's name for one of ours)."""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from typing import Any

from pipeline.config.errors import ConfigError, one_line

#: vLLM's (and OpenAI's) names for settings the pipeline names otherwise: a key ending in one of
#: these is pointed at ours. Names the schema has too (temperature, seed, max_model_len, dtype,
#: block_size ...) are found among the schema's own keys.
VLLM_NAMES = {
    "max_tokens": "job.sampling.max_new_tokens",
    "max_completion_tokens": "job.sampling.max_new_tokens",
    "model": "model.path",
    "tensor_parallel_size": "model.prefill_tp and model.decode_tp",
    "num_gpu_blocks_override": "model.decode_kv_blocks",
    "max_num_batched_tokens": "model.prefill_chunk_tokens",
    "kv_connector": "transport.connector (or transport=nixl_pull|nixl_push)",
    "kv_transfer_config": "transport=nixl_pull|nixl_push",
    **{name: f"model.engine_kwargs.{name}" for name in (
        "max_num_seqs", "enable_prefix_caching", "enable_chunked_prefill", "kv_cache_dtype", "quantization",
        "trust_remote_code", "attention_backend")},
}
_UNKNOWN_KEY = re.compile(r"([\w.]+): Key '[^']*' not in '\w+'")
_NEEDS_QUOTES = set("{}[]:,$ ")  # characters of Hydra's grammar a string value may hold only quoted


def has_job(overrides: list[str] | tuple[str, ...]) -> bool:
    """Whether ``overrides`` pick a job (``+job=NAME``, ``job=NAME``)."""
    return any(o.lstrip("+~").startswith("job=") for o in overrides)


def check_job_added(overrides: list[str] | tuple[str, ...]) -> None:
    """A job is added to the config (``+job=NAME``), never overridden: ``conf/config.yaml`` has
    none to override.

    Raises:
        ConfigError: ``job=NAME`` without the ``+``, saying to write ``+job=NAME``.
    """
    for o in overrides:
        if o.startswith("job="):
            raise ConfigError(f"{o}: the config has no job to override; add one with +{o} (with the +)")


def with_own_model(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """``overrides`` with ``model=own`` added when they set ``model.path`` and choose no ``model``
    option: a model of the user's own then takes none of the bundled model's preset values (its
    context, eager mode) but its own (``conf/model/own.yaml``). Unchanged otherwise."""
    overrides = list(overrides)
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o]
    sets_path = any(k == "model.path" and o.split("=", 1)[1].strip() not in ("", "null")
                    for k, o in zip(keys, (o for o in overrides if "=" in o)))
    if sets_path and "model" not in keys:
        overrides.append("model=own")
    return overrides


def quoted(key: str, value: str) -> str:
    """``'KEY="VALUE"'``: an override as typed in a shell, quoted for the shell (outside) and for
    Hydra (inside), so that braces, colons, commas and spaces stay one string."""
    return f"'{key}=\"{value}\"'" if "'" not in value else f"\"{key}='{value}'\""


def quote_hint(text: str) -> str:
    """For the override ``text`` (``key=value``) that failed, how to quote its value when it
    holds characters of Hydra's grammar (braces ...), as ``; quote ...``; else ``""``."""
    key, eq, value = text.partition("=")
    if not eq or not _NEEDS_QUOTES & set(value) or value[:1] in "'\"":
        return ""
    if "${" in value:
        return (f"; Hydra reads ${{...}} as an interpolation, even quoted: write \\${{ for a literal $ "
                f"(a template's placeholder is {{text}})")
    return f"; quote the value for Hydra inside the shell's quotes: {quoted(key, value)}"


def _split_value(overrides: list[str] | tuple[str, ...], i: int) -> str:
    """Why ``overrides[i]``, which has no ``=``, does not parse: a piece of the value before it
    that the shell split at its spaces (then the whole override, quoted), or a stray word."""
    j = i
    while j > 0 and "=" not in overrides[j - 1]:
        j -= 1
    if j == 0:
        return "not an override (key=value, +key=value or ~key); see python -m pipeline --help"
    k = i + 1
    while k < len(overrides) and "=" not in overrides[k] and not overrides[k].startswith(("-", "+", "~")):
        k += 1
    key, _, value = overrides[j - 1].partition("=")
    whole = " ".join([value, *overrides[j:k]]).strip()
    return (f"not an override (key=value); if it is part of the value of {key}, the shell split that at its "
            f"spaces: quote it for the shell, and for Hydra inside: {quoted(key, whole)}")


def parse_overrides(overrides: list[str] | tuple[str, ...], loader: Any = None) -> list[Any]:
    """``overrides`` read with Hydra's own override grammar (``hydra.core.override_parser``), as
    its ``Override`` objects; ``loader``: a config loader, needed to expand ``glob(...)``.

    Raises:
        ConfigError: an override that does not parse, named, with the grammar's first line, or
            (a value with braces, a piece of a value the shell split) how to quote it.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create(config_loader=loader)
    parsed = []
    for i, text in enumerate(overrides):
        try:
            parsed += parser.parse_overrides([text])
        except Exception as exc:  # OverrideParseException and whatever the grammar raises
            if "=" not in text and not text.startswith("~"):
                raise ConfigError(f"{text}: {_split_value(overrides, i)}") from exc
            raise ConfigError(f"{text}: {one_line(exc)}{quote_hint(text)}") from exc
    return parsed


def _fields(cls: Any) -> dict[str, Any]:
    """A schema dataclass's fields: name -> its dataclass type (``Optional`` unwrapped), or None
    for a leaf."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        t = hints.get(f.name)
        t = next((a for a in typing.get_args(t) if dataclasses.is_dataclass(a)), t)
        out[f.name] = t if dataclasses.is_dataclass(t) else None
    return out


def schema_keys(cls: Any, prefix: str = "") -> list[str]:
    """Every key of the schema dataclass ``cls``, dotted (``job.sampling.max_new_tokens``),
    sections included (``job.sampling``)."""
    keys = []
    for name, sub in _fields(cls).items():
        keys.append(prefix + name)
        if sub is not None:
            keys += schema_keys(sub, f"{prefix}{name}.")
    return keys


def suggest_key(key: str, root: Any) -> str:
    """For ``key``, not in the schema dataclass ``root``: ``did you mean ...?`` with the nearest
    keys (:mod:`difflib`; vLLM's names mapped to ours, :data:`VLLM_NAMES`), or ``""``."""
    parent, _, leaf = key.rpartition(".")
    if leaf in VLLM_NAMES and VLLM_NAMES[leaf] != key:
        return f"did you mean {VLLM_NAMES[leaf]}? ({leaf} is vLLM's name)"
    keys = schema_keys(root)
    leaves = {k.rpartition(".")[2] for k in keys}
    near = difflib.get_close_matches(leaf, leaves, n=3, cutoff=0.75)  # the same name or nearly, anywhere
    close = sorted((k for k in keys if k.rpartition(".")[2] in near),
                   key=lambda k: (near.index(k.rpartition(".")[2]), k.rpartition(".")[0] != parent))[:3]
    siblings = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent]
    close = close or [f"{parent}.{n}".lstrip(".") for n in difflib.get_close_matches(leaf, siblings, n=3, cutoff=0.6)]
    return f"did you mean {' or '.join(close)}?" if close else ""


def explain(message: str, overrides: list[str] | tuple[str, ...], root: Any) -> str:
    """``message``, one line from composing ``overrides``, with what to write instead: the
    nearest keys to an unknown one (:func:`suggest_key` over the schema ``root``), how to quote
    a value with braces that Hydra read as a dict or interpolation, where a model folder goes."""
    if (m := _UNKNOWN_KEY.match(message)) and (hint := suggest_key(m.group(1), root)):
        return f"{message}; {hint}"
    key = message.split(":", 1)[0]
    for o in overrides:
        if o.lstrip("+~").partition("=")[0] == key and (hint := quote_hint(o)):
            return message + hint
    if "Could not find 'model/" in message:
        return f"{message}; a model folder or hub id goes in model.path=PATH_OR_ID"
    return message
