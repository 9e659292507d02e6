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

A body's sampling fields: :mod:`pipeline.io.openai_body`. Output:
:func:`pipeline.io.openai_output.write_batch_output`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pyarrow as pa

from pipeline.config import JobConfig, SamplingConfig
from pipeline.io.formats import LINE_ERROR, json_kind
from pipeline.io.openai_body import SAMPLING, body_sampling
from pipeline.io.prompts import Prompt, make_prompts
from pipeline.io.sampling import row_sampling

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
REQUEST_SAMPLING = "sampling_params"  # the column of a request's sampling, whatever job.sampling_column says
REQUEST_SCHEMA = pa.schema([("id", pa.string()), ("url", pa.string()), ("model", pa.string()),
                            ("messages", MESSAGES), ("text", pa.string()), (REQUEST_SAMPLING, SAMPLING),
                            (LINE_ERROR, pa.string())])


def is_request(value: Any) -> bool:
    """Whether a JSON value looks like an OpenAI batch request: an object with ``custom_id``
    and one of ``url``, ``body``, ``method`` (a file whose first valid line is one is read as
    an OpenAI batch file)."""
    return isinstance(value, dict) and "custom_id" in value and any(k in value for k in ("url", "body", "method"))


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
