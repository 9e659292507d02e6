"""OpenAI batch files (the format ``vllm run-batch`` reads and writes): requests in, one output
line per request out.

Input: a JSON Lines file whose lines are requests ``{"custom_id", "method": "POST", "url":
"/v1/chat/completions" | "/v1/completions", "body": {"model", "messages" | "prompt",
"max_tokens", "temperature", ...}}``. Each line is one row of :data:`REQUEST_SCHEMA`: ``id`` (the
custom_id), ``url``, ``model`` (recorded, not used), ``messages`` (chat) or ``text`` (the
completions prompt), ``sampling_params`` (the body's sampling fields, named as vLLM names them)
and ``line_error`` (why the line is not a request the pipeline can serve: its row becomes an
error row). A chat request's messages go through the model's chat template; a completions
prompt is tokenized as written. A body field that would change the generation and that the
pipeline does not implement makes an error row; fields that do not (``model``, ``user``,
``metadata`` ...) are ignored.

Output: :func:`write_batch_output` turns the output shard into the OpenAI batch output format,
one line per request, in input order (:func:`output_line`).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import JobConfig, SamplingConfig
from pipeline.io.atomic import atomic_write, url_to_fs
from pipeline.io.formats import LINE_ERROR, json_kind
from pipeline.io.prompts import Prompt, make_prompts
from pipeline.io.sampling import row_sampling

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
SAMPLING = pa.struct([
    ("max_tokens", pa.int64()), ("temperature", pa.float64()), ("top_p", pa.float64()), ("seed", pa.int64()),
    ("stop", pa.list_(pa.string())), ("n", pa.int64()), ("logprobs", pa.int64()),
    ("presence_penalty", pa.float64()), ("frequency_penalty", pa.float64()), ("top_k", pa.int64()),
    ("min_p", pa.float64()), ("repetition_penalty", pa.float64()), ("stop_token_ids", pa.list_(pa.int64())),
    ("ignore_eos", pa.bool_()), ("min_tokens", pa.int64()), ("json_schema", pa.string()), ("regex", pa.string()),
    ("choice", pa.list_(pa.string())),
])
REQUEST_SAMPLING = "sampling_params"  # the column of a request's sampling, whatever job.sampling_column says
REQUEST_SCHEMA = pa.schema([("id", pa.string()), ("url", pa.string()), ("model", pa.string()),
                            ("messages", MESSAGES), ("text", pa.string()), (REQUEST_SAMPLING, SAMPLING),
                            (LINE_ERROR, pa.string())])
#: Body fields that do not change what is generated.
IGNORED = {"model", "user", "metadata", "store", "service_tier", "stream_options", "parallel_tool_calls"}
#: Body fields accepted only at a value that changes nothing.
NEUTRAL = {"stream": (False,), "echo": (False,), "logit_bias": ({},), "tools": ([],), "tool_choice": ("none", "auto"),
           "suffix": ("",), "best_of": (1,)}
_TYPES = {pa.int64(): "an integer", pa.float64(): "a number", pa.bool_(): "a boolean", pa.string(): "a string",
          pa.list_(pa.string()): "a list of strings", pa.list_(pa.int64()): "a list of integers"}


def is_request(value: Any) -> bool:
    """Whether a JSON value looks like an OpenAI batch request: an object with ``custom_id``
    and one of ``url``, ``body``, ``method`` (a file whose first valid line is one is read as
    an OpenAI batch file)."""
    return isinstance(value, dict) and "custom_id" in value and any(k in value for k in ("url", "body", "method"))


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


def _messages(messages: Any) -> list[dict[str, Any]]:
    """A chat request's ``messages`` as ``{role, content}`` turns, content parts joined (text
    parts only); roles and null content are checked later, with the chat template.

    Raises:
        ValueError: not a list of objects, a role or content of the wrong type, a non-text part,
            or a turn field that would change the prompt (``tool_calls`` ...).
    """
    if not isinstance(messages, list):
        raise ValueError(f"body.messages is a JSON {json_kind(messages)}, not an array of messages")
    turns = []
    for i, turn in enumerate(messages):
        if not isinstance(turn, dict):
            raise ValueError(f"body.messages[{i}] is a JSON {json_kind(turn)}, not an object")
        extra = [k for k, v in turn.items() if k not in ("role", "content", "name") and v is not None]
        if extra:
            raise ValueError(f"body.messages[{i}].{extra[0]} is not supported")
        role, content = turn.get("role"), turn.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type", "text") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ValueError(f"body.messages[{i}].content: only text parts are supported")
            content = "".join(p["text"] for p in content)
        for name, value in (("role", role), ("content", content)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"body.messages[{i}].{name} is a JSON {json_kind(value)}, not a string")
        turns.append({"role": role, "content": content})
    return turns


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ValueError("body.prompt must be one string (token ids and several prompts in one request "
                         "are not supported: one request per prompt)")
    return prompt


def unnamed_line(line: int) -> str:
    """The custom_id given to line ``line`` (from 1) of a batch file when the line has none."""
    return f"line-{line}-without-custom-id"


def request_row(line: int, value: Any) -> dict[str, Any]:
    """One line of a batch file (its number, and its JSON value or why it does not parse) as a
    row of :data:`REQUEST_SCHEMA`; what makes it no request the pipeline serves is in its
    ``line_error``, the custom_id kept when there is one (else :func:`unnamed_line`)."""
    row = dict.fromkeys(REQUEST_SCHEMA.names)
    # A line with no custom_id of its own (not JSON, not an object, none given) is named by its
    # line: the output line's custom_id must be a string (vLLM's BatchRequestOutput).
    row["id"] = unnamed_line(line)
    if isinstance(value, str):
        row[LINE_ERROR] = value
        return row
    if not isinstance(value, dict):
        row[LINE_ERROR] = f"line {line} is a JSON {json_kind(value)}, not a request object"
        return row
    custom_id, url, body = value.get("custom_id"), value.get("url"), value.get("body")
    if custom_id is not None:
        row["id"] = custom_id if isinstance(custom_id, str) else json.dumps(custom_id)
    row["url"] = url if isinstance(url, str) else None
    if isinstance(body, dict) and isinstance(body.get("model"), str):
        row["model"] = body["model"]
    if value.get(LINE_ERROR):  # bytes that are not UTF-8 (pipeline.io.formats.json_lines)
        row[LINE_ERROR] = value[LINE_ERROR]
        return row
    try:
        if not isinstance(custom_id, str):
            raise ValueError(f"custom_id is {'missing' if custom_id is None else 'not a string'}")
        if value.get("method", "POST") != "POST":
            raise ValueError(f"method is {value.get('method')!r}; only POST is supported")
        if url not in (CHAT, COMPLETIONS):
            raise ValueError(f"url {url!r} is not supported (supported: {CHAT}, {COMPLETIONS})")
        if not isinstance(body, dict):
            raise ValueError(f"the request has {'no body' if body is None else 'a body that is not an object'}")
        if url == CHAT:
            row["messages"] = _messages(body.get("messages"))
        else:
            row["text"] = _prompt(body.get("prompt"))
        row["sampling_params"] = body_sampling(body, url == CHAT)
        _check_ranges(row["sampling_params"])
    except ValueError as exc:
        row[LINE_ERROR] = f"line {line}: {exc}"
        row["messages"] = row["text"] = row["sampling_params"] = None
    return row


#: A base that takes any body's fields: what the job's sampling decides (``n``, ``max_new_tokens``
#: for a body without ``max_tokens``) is checked later, against the job (:func:`body_errors`).
_ANY = SamplingConfig(max_new_tokens=2**31 - 1, n=2)


def body_errors(message: str) -> str:
    """A sampling error of a request's ``body`` (:func:`pipeline.io.sampling.row_sampling` with
    column ``body``) in the request's own names (``max_tokens``, not ``max_new_tokens``)."""
    return message.replace("max_new_tokens", "max_tokens")


def _check_ranges(sampling: dict[str, Any]) -> None:
    """Check each body field's own range as its line is read, so that the error names the line.

    Raises:
        ValueError: a value out of range (``body.max_tokens: must be >= 1, got -1``).
    """
    try:
        row_sampling(_ANY, sampling, "body")
    except ValueError as exc:
        raise ValueError(body_errors(str(exc))) from None


def request_batch(items: list[tuple[int, Any]]) -> pa.RecordBatch:
    """Rows of :data:`REQUEST_SCHEMA` from (line number, JSON value or error) items."""
    return pa.RecordBatch.from_pylist([request_row(n, v) for n, v in items], schema=REQUEST_SCHEMA)


def is_request_batch(schema: pa.Schema) -> bool:
    """Whether rows of ``schema`` are OpenAI batch requests (:data:`REQUEST_SCHEMA`)."""
    return schema.equals(REQUEST_SCHEMA)


class _AsWritten:
    """A tokenizer seen without its chat template: a completions prompt is tokenized as written."""

    chat_template = None

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer

    def __call__(self, *args: Any, **kw: Any) -> Any:
        return self._tokenizer(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def request_prompts(rows: pa.RecordBatch, keys: list[str], job: JobConfig, tokenizer: Any, max_model_len: int,
                    first_row: int, row_errors: dict[int, str],
                    samplings: list[Any] | None) -> list[Prompt]:
    """The prompts of a batch of request rows (:data:`REQUEST_SCHEMA`): chat requests through
    the model's chat template, completions prompts as written; ``job.prompt_template`` and
    ``job.system_prompt`` do not apply (a request is its whole prompt). ``row_errors`` (row ->
    why) and ``samplings`` as in :func:`pipeline.io.prompts.make_prompts`."""
    own = dataclasses.replace(job, text_column="text", messages_column="messages", prompt_template="{text}",
                              system_prompt=None)
    messages = rows.column("messages").to_pylist()
    kw = dict(first_row=first_row, row_errors=row_errors, samplings=samplings)
    chat = make_prompts(messages, keys, own, tokenizer, max_model_len, **kw)
    texts = rows.column("text").to_pylist()
    plain = make_prompts(texts, keys, dataclasses.replace(own, messages_column=None), _AsWritten(tokenizer),
                         max_model_len, **kw)
    return [c if m is not None else t for c, t, m in zip(chat, plain, messages)]


# -- Output -------------------------------------------------------------------------------------


def _hex() -> str:
    return uuid.uuid4().hex


def _logprobs(steps: list | None, token_ids: list[int] | None, top: int, chat: bool, tokenizer: Any) -> Any:
    """The output's ``logprobs`` (per token, its top-k ``{token_id, logprob}``, the chosen
    token included) in OpenAI's chat or completions form."""
    if steps is None or token_ids is None:
        return None
    text = (lambda t: tokenizer.decode([t])) if tokenizer is not None else (lambda t: f"token_id:{t}")
    chosen, best = [], []
    for token, step in zip(token_ids, steps):
        step = sorted(step or [], key=lambda c: -c["logprob"])
        chosen.append((text(token), next((c["logprob"] for c in step if c["token_id"] == token), None)))
        best.append([(text(c["token_id"]), c["logprob"]) for c in step[:top]])
    if chat:
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()),
                             "top_logprobs": [{"token": s, "logprob": v, "bytes": list(s.encode())} for s, v in b]}
                            for (t, lp), b in zip(chosen, best)]}
    offsets, at = [], 0
    for t, _ in chosen:
        offsets.append(at)
        at += len(t)
    return {"tokens": [t for t, _ in chosen], "token_logprobs": [lp for _, lp in chosen],
            "top_logprobs": [dict(b) for b in best], "text_offset": offsets}


SAMPLE_COLUMNS = ("generation", "finish_reason", "stop_reason", "generation_token_ids", "logprobs")


def _samples(row: dict) -> list[dict]:
    """A row's samples: its generation, or each of its list of generations (``n`` > 1, where
    the other sample columns hold one entry per sample)."""
    if not isinstance(row.get("generation"), list):
        return [{k: row.get(k) for k in SAMPLE_COLUMNS}]
    n = len(row["generation"])
    per = {k: v if isinstance(v := row.get(k), list) and len(v) == n else [v] * n for k in SAMPLE_COLUMNS}
    return [{k: per[k][i] for k in SAMPLE_COLUMNS} for i in range(n)]


def _choices(row: dict, chat: bool, tokenizer: Any) -> list[dict]:
    top = (row.get("sampling_params") or {}).get("logprobs") or 0
    out = []
    for i, s in enumerate(_samples(row)):
        content = {"message": {"role": "assistant", "content": s["generation"]}} if chat else {"text": s["generation"]}
        out.append({"index": i, **content,
                    "logprobs": _logprobs(s["logprobs"], s["generation_token_ids"], top, chat, tokenizer),
                    "finish_reason": s["finish_reason"], "stop_reason": s["stop_reason"]})
    return out


def output_line(row: dict, created: int, tokenizer: Any = None) -> dict:
    """One request's line of the OpenAI batch output from its output-shard row: a response
    (status 200, the completion body) or, for an error row, ``error`` {code, message} with
    status 400 (``invalid_request``: the request or its prompt was refused, never served) or
    500 (``server_error``: serving it failed)."""
    line = {"id": f"batch_req_{_hex()}", "custom_id": row.get("id")}
    if row.get("error") is not None:
        invalid = row.get("queue_s") is None
        line["response"] = {"status_code": 400 if invalid else 500, "request_id": f"req_{_hex()}", "body": None}
        line["error"] = {"code": "invalid_request" if invalid else "server_error", "message": row["error"]}
        return line
    chat = row.get("url") == CHAT
    prompt, completion = row.get("prompt_tokens") or 0, row.get("output_tokens") or 0
    body = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{_hex()}", "object": "chat.completion" if chat else "text_completion",
            "created": created, "model": row.get("model"), "choices": _choices(row, chat, tokenizer),
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}
    line["response"] = {"status_code": 200, "request_id": f"req_{_hex()}", "body": body}
    line["error"] = None
    return line


COLUMNS = ("id", "url", "model", "sampling_params", "generation", "generation_token_ids", "finish_reason",
           "stop_reason", "logprobs", "prompt_tokens", "output_tokens", "error", "queue_s")


def write_batch_output(shard_url: str, jsonl_url: str, tokenizer: Any = None, rows: int = 1024) -> int:
    """Write the OpenAI batch output of an output shard (Parquet at ``shard_url``) to
    ``jsonl_url``, atomically: one line per row, in order (:func:`output_line`), read
    ``rows`` at a time. Returns the lines written."""
    fs, path = url_to_fs(shard_url)
    created, written = int(time.time()), 0
    with fs.open(path, "rb") as f, atomic_write(jsonl_url, "w") as out:
        shard = pq.ParquetFile(f)
        columns = [c for c in COLUMNS if c in shard.schema_arrow.names]
        for batch in shard.iter_batches(batch_size=rows, columns=columns):
            for row in batch.to_pylist():
                out.write(json.dumps(output_line(row, created, tokenizer), ensure_ascii=False) + "\n")
                written += 1
    return written
