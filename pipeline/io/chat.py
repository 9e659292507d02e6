"""Chat input: a row's OpenAI-style ``messages`` (``job.messages_column``) -> prompt token ids,
through the model's chat template."""

from __future__ import annotations

import json
from typing import Any

from pipeline.config import JobConfig
from pipeline.io.encode import Encoder
from pipeline.io.formats import json_kind
from pipeline.io.prompts import as_text

ROLES = ("system", "developer", "user", "assistant", "tool")


def _slot(i: int) -> str:
    """Stands for turn ``i``'s content while the chat template is rendered; never in real text."""
    return f"\uE000pd-pipeline-turn-{i}\uE001"


def _content(turn: Any, i: int, column: str) -> str:
    """The text of turn ``i``: a string, or OpenAI's list of ``{type: text, text}`` parts.

    Raises:
        ValueError: a turn that is not a ``{role, content}`` struct, an unknown role, null or
            non-text content.
    """
    if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
        raise ValueError(f"{column}[{i}] is {type(turn).__name__}, not a {{role, content}} struct")
    if turn["role"] not in ROLES:
        raise ValueError(f"{column}[{i}].role is {turn['role']!r}; known roles: {', '.join(ROLES)}")
    content = turn["content"]
    if isinstance(content, list):
        try:
            content = "".join(part["text"] for part in content if part.get("type", "text") == "text")
        except (TypeError, KeyError, AttributeError):
            raise ValueError(f"{column}[{i}].content: a list of parts that are not {{type: text, text}}") from None
    if content is None:
        raise ValueError(f"{column}[{i}].content is null")
    if not isinstance(content, str):
        raise ValueError(f"{column}[{i}].content is {type(content).__name__}, not a string")
    return content


def chat_token_ids(messages: Any, job: JobConfig, tokenizer: Any, encoder: Encoder | None = None) -> list[int]:
    """The prompt token ids of one row's ``messages`` (any number of turns; ``job.system_prompt``
    is put first only when the row has no system turn), rendered with the model's chat template
    and the assistant turn opened (``add_generation_prompt``). The ids are the tokenizer's own
    tokenization of the rendered prompt (what ``apply_chat_template(..., tokenize=True)``
    gives), except that a turn's content cannot open another turn by writing ``<|im_start|>``:
    a special-token string in a content reads as text (:class:`~pipeline.io.encode.Encoder`;
    ``encoder``: one made for ``tokenizer``, to reuse across rows).

    ``messages`` is the row's value: a list of turns (a ``list<struct<role, content>>``
    column, or JSON objects), or the JSON text of one as ``str`` or UTF-8 ``bytes`` (a string
    column: CSV, JSON-encoded Parquet, or a JSON Lines column whose rows mix types).

    Raises:
        ValueError: the value is not a non-empty list of ``{role, content}`` turns (see
            :func:`_content`), nor JSON text of one; or the model has no chat template, or the
            template refused it.
    """
    column = job.messages_column
    if isinstance(messages, (str, bytes)):
        messages = _parsed(messages, column)
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{column} is {'empty' if messages == [] else type(messages).__name__}, "
                         f"not a list of {{role, content}} turns")
    contents = [_content(turn, i, column) for i, turn in enumerate(messages)]
    turns = [{"role": t["role"], "content": _slot(i)} for i, t in enumerate(messages)]
    if job.system_prompt and not any(t["role"] == "system" for t in turns):
        turns.insert(0, {"role": "system", "content": job.system_prompt})
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{column}: the model has no chat template to render messages with")
    try:
        rendered = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # jinja raises its own types for what a template refuses
        raise ValueError(f"{column}: the chat template refused the messages: {exc}") from None
    pieces, rest = [], rendered
    for i in range(len(contents)):
        before, slot, rest = rest.partition(_slot(i))
        if not slot:
            raise ValueError(f"{column}[{i}]: the chat template dropped this turn")
        pieces.append(before)
    return (encoder or Encoder(tokenizer))(pieces + [rest], contents)


def _parsed(value: str | bytes, column: str) -> Any:
    """The turns a string value holds as JSON text.

    Raises:
        ValueError: bytes that are not UTF-8 or blank text (:func:`~pipeline.io.prompts.as_text`),
            text that is not JSON, or JSON that is not an array.
    """
    text, why = as_text(value, column)
    if why:
        raise ValueError(why)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise ValueError(f"{column} is a string, not a list of {{role, content}} turns nor its JSON text: "
                         f"{shown!r}") from None
    if not isinstance(value, list):
        raise ValueError(f"{column}: its text is a JSON {json_kind(value)}, not an array of {{role, content}} turns")
    return value
