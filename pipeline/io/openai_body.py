"""The sampling fields of an OpenAI batch request's ``body``, under vLLM's names and types
(:data:`SAMPLING`): what :mod:`pipeline.io.openai_batch` puts in a request row's
``sampling_params``. A field that would change the generation and that the pipeline does not
implement is refused; fields that do not (``model``, ``user``, ``metadata`` ...) are ignored."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from pipeline.io.formats import json_kind

SAMPLING = pa.struct([
    ("max_tokens", pa.int64()), ("temperature", pa.float64()), ("top_p", pa.float64()), ("seed", pa.int64()),
    ("stop", pa.list_(pa.string())), ("n", pa.int64()), ("logprobs", pa.int64()),
    ("presence_penalty", pa.float64()), ("frequency_penalty", pa.float64()), ("top_k", pa.int64()),
    ("min_p", pa.float64()), ("repetition_penalty", pa.float64()), ("stop_token_ids", pa.list_(pa.int64())),
    ("ignore_eos", pa.bool_()), ("min_tokens", pa.int64()), ("json_schema", pa.string()), ("regex", pa.string()),
    ("choice", pa.list_(pa.string())),
])
#: Body fields that do not change what is generated.
IGNORED = {"model", "user", "metadata", "store", "service_tier", "stream_options", "parallel_tool_calls"}
#: Body fields accepted only at a value that changes nothing.
NEUTRAL = {"stream": (False,), "echo": (False,), "logit_bias": ({},), "tools": ([],), "tool_choice": ("none", "auto"),
           "suffix": ("",), "best_of": (1,)}
_TYPES = {pa.int64(): "an integer", pa.float64(): "a number", pa.bool_(): "a boolean", pa.string(): "a string",
          pa.list_(pa.string()): "a list of strings", pa.list_(pa.int64()): "a list of integers"}


def _fits(value: Any, t: pa.DataType) -> bool:
    if t == pa.int64():
        return isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63
    if t == pa.float64():
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == pa.bool_():
        return isinstance(value, bool)
    if t == pa.string():
        return isinstance(value, str)
    return isinstance(value, list) and all(_fits(v, t.value_type) for v in value)


def _structured(key: str, value: Any) -> dict[str, Any]:
    """``response_format``, ``guided_*`` or ``structured_outputs`` as sampling fields."""
    if key == "response_format":
        kind = value.get("type") if isinstance(value, dict) else None
        if kind == "text":
            return {}
        if kind == "json_object":
            return {"json_schema": {"type": "object"}}
        if kind == "json_schema" and isinstance(value.get("json_schema"), dict) and "schema" in value["json_schema"]:
            return {"json_schema": value["json_schema"]["schema"]}
        raise ValueError("body.response_format: type text, json_object or json_schema (with json_schema.schema)")
    if key == "structured_outputs":
        if not isinstance(value, dict) or set(value) - {"json", "regex", "choice"}:
            raise ValueError("body.structured_outputs: only json, regex and choice are supported")
        return {("json_schema" if k == "json" else k): v for k, v in value.items() if v is not None}
    return {{"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice"}[key]: value}


def body_sampling(body: dict, chat: bool) -> dict[str, Any]:
    """The ``sampling_params`` of a request body: its sampling fields under vLLM's names
    (``max_completion_tokens`` -> ``max_tokens``; chat's ``logprobs: true`` + ``top_logprobs``
    and completions' ``logprobs: k`` -> ``logprobs``; ``response_format`` / ``guided_*`` /
    ``structured_outputs`` -> ``json_schema`` / ``regex`` / ``choice``). Ranges are checked
    later, with the row's sampling.

    Raises:
        ValueError: a field that changes the generation and is not supported, or a value of
            the wrong type; one line naming ``body.<field>``.
    """
    out: dict[str, Any] = {}
    for key, value in body.items():
        if value is None or key in IGNORED or key in ("messages", "prompt", "logprobs", "top_logprobs"):
            continue
        if key in NEUTRAL:
            if value not in NEUTRAL[key] and not (key == "best_of" and value == body.get("n")):
                raise ValueError(f"body.{key}={json.dumps(value)} is not supported (it would change the generation)")
        elif key in ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice"):
            out.update(_structured(key, value))
        elif key == "max_completion_tokens" or key in SAMPLING.names:
            name = "max_tokens" if key == "max_completion_tokens" else key
            if name in out and out[name] != value:
                raise ValueError("body.max_tokens and body.max_completion_tokens differ")
            out[name] = [value] if name == "stop" and isinstance(value, str) else value
        else:
            raise ValueError(f"body.{key} is not supported (known fields: {', '.join(sorted(SAMPLING.names))}, "
                             f"max_completion_tokens, logprobs, top_logprobs, response_format)")
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if chat and logprobs not in (None, False, True):
        raise ValueError(f"body.logprobs is a JSON {json_kind(logprobs)}, not a boolean (chat requests)")
    if chat and top is not None and logprobs is not True:
        raise ValueError("body.top_logprobs needs body.logprobs=true")
    out["logprobs"] = (top or 0) if chat and logprobs is True else (None if chat or logprobs is None else logprobs)
    if isinstance(out.get("json_schema"), (dict, bool)):
        out["json_schema"] = json.dumps(out["json_schema"])
    for name, value in out.items():
        t = SAMPLING.field(name).type
        if value is not None and not _fits(value, t):
            raise ValueError(f"body.{name} is a JSON {json_kind(value)}, not {_TYPES[t]}")
    return out
