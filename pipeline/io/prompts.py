"""Rows -> prompts: render each row's text through the job's template and the model's chat
template, tokenize, and turn unusable rows into error messages instead of requests."""

from __future__ import annotations

import string
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from pipeline.config import JobConfig, SamplingConfig
from pipeline.io.encode import Encoder

# Stands for the row's text while the chat template is rendered; never appears in real text.
_SLOT = "\uE000pd-pipeline-text\uE001"


@dataclass
class Prompt:
    """One row ready for prefill (``token_ids`` set) or already failed (``error`` set).

    ``row`` is the row index in its shard; ``row_key`` is unique within the run; ``truncated`` says
    the text was cut to fit the context (``job.too_long=truncate``). RAG rows also carry their
    retrieved ``passage_ids`` / ``passage_scores`` (cosine similarity) and a ``prefix_key`` that
    is equal for rows whose prompts share their passages.
    """

    row: int
    row_key: str
    token_ids: list[int] | None = None
    error: str | None = None
    truncated: bool = False
    prefix_key: str | None = None  # rows with the same key share a long prompt prefix (RAG passages)
    passage_ids: list[str] | None = None  # RAG: the retrieved passages, best first
    passage_scores: list[float] | None = None
    sampling: SamplingConfig | None = None  # the row's own sampling; None: job.sampling
    lora: str | None = None  # the row's LoRA adapter (a key of model.lora); None: the base model


def parse_template(template: str, key: str, slots: Collection[str] = (),
                   required: Collection[str] = ()) -> list[tuple[str, str | None]]:
    """``template`` read the way ``str.format`` reads it (``string.Formatter().parse``): a list of
    (literal text, placeholder name or None), ``{{`` and ``}}`` already turned into ``{`` and
    ``}``. Only the placeholders ``slots`` are allowed, each written plainly (``{text}``: no
    conversion, no format spec) and as often as wanted; every name in ``required`` must appear.

    Raises:
        ValueError: one line starting with ``key``: an unknown placeholder, a placeholder with a
            conversion or format spec, a single ``{`` or ``}`` (literal braces are written
            ``{{`` and ``}}``), or a required placeholder missing.
    """
    known = ", ".join(f"{{{s}}}" for s in slots) or "none"
    hint = "write a literal brace as {{ or }}"
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}; {hint}") from None
    out: list[tuple[str, str | None]] = []
    for literal, name, spec, conversion in parts:
        if name is None:
            out.append((literal, None))
            continue
        written = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        if name not in slots:
            raise ValueError(f"{key}: unknown placeholder {written} (known: {known}); {hint}")
        if conversion or spec:
            raise ValueError(f"{key}: placeholder {written} has a conversion or format spec; "
                             f"write it as {{{name}}} ({hint})")
        out.append((literal, name))
    names = {name for _, name in out}
    for name in required:
        if name not in names:
            raise ValueError(f"{key}: must contain {{{name}}}, or what it stands for never reaches the model")
    return out


def fill_template(parts: list[tuple[str, str | None]], values: dict[str, str]) -> str:
    """The text of a :func:`parse_template` result with each placeholder replaced by its value
    wherever it appears; values are inserted as they are (braces in them stay)."""
    return "".join(literal + (values[name] if name else "") for literal, name in parts)


class Renderer:
    """Token ids for a row's text: the job's prompt template and the model's chat template (with
    the assistant turn opened) around it.

    ``job.prompt_template`` is read like ``str.format`` (:func:`parse_template`: ``{{``/``}}``
    are literal braces, ``{text}`` the only placeholder) and the row's text goes into every
    ``{text}`` slot; ``job.system_prompt`` takes no placeholder. The ids are the tokenizer's own
    tokenization of the whole rendered prompt (:class:`~pipeline.io.encode.Encoder`: what
    ``apply_chat_template(..., tokenize=True)`` gives); a text that holds ``<|im_start|>`` or
    another special-token string cannot open a turn of its own: that string reads as plain text.

    ``pieces``: the rendered template's text around and between the ``slots`` text slots;
    ``overhead``: the template's size in tokens with an empty text (within a token or two of
    what it takes around a text, where tokens merge across the seams).

    Raises:
        ValueError: a bad template (see :func:`parse_template`), naming its setting.
    """

    def __init__(self, job: JobConfig, tokenizer: Any):
        user = fill_template(parse_template(job.prompt_template, "job.prompt_template", ("text",), ("text",)),
                             {"text": _SLOT})
        messages = [{"role": "user", "content": user}]
        if job.system_prompt:
            system = fill_template(parse_template(job.system_prompt, "job.system_prompt"), {})
            messages.insert(0, {"role": "system", "content": system})
        if getattr(tokenizer, "chat_template", None):
            rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            self.encode = Encoder(tokenizer)
        else:
            rendered = user
            self.encode = Encoder(tokenizer, add_special_tokens=True)
        self.pieces = rendered.split(_SLOT)
        self.slots = len(self.pieces) - 1
        self.overhead = len(self.encode(["".join(self.pieces)], []))

    def __call__(self, text: str, max_text_tokens: int | None = None) -> tuple[list[int], bool]:
        """(token ids, whether the text was cut): the text in every slot. ``max_text_tokens``
        is the text's budget for the whole prompt, shared by its slots: the prompt is at most
        ``overhead + max_text_tokens`` tokens, each copy of the text cut to its first
        ``max_text_tokens // slots`` tokens or fewer (fewer where the cut text's seams merge
        differently)."""
        ids = self.encode(self.pieces, [text] * self.slots)
        limit = None if max_text_tokens is None else self.overhead + max(0, max_text_tokens)
        if limit is None or len(ids) <= limit:
            return ids, False
        each = max(0, max_text_tokens) // max(1, self.slots)
        while True:
            ids = self.encode(self.pieces, [self.encode.cut(text, each)] * self.slots)
            if len(ids) <= limit or each == 0:
                return ids, True
            each = max(0, each - -(-(len(ids) - limit) // self.slots))


def as_text(value: Any, column: str) -> tuple[str | None, str | None]:
    """(text, error): strings pass; bytes must be UTF-8; anything else is an error."""
    if value is None:
        return None, f"{column} is null"
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, f"{column} is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
    if not isinstance(value, str):
        return None, f"{column} is {type(value).__name__}, not a string"
    if not value.strip():
        return None, f"{column} is empty"
    return value, None


def make_prompts(texts: list[Any], keys: list[str], job: JobConfig, tokenizer: Any,
                 max_model_len: int, ids: list[Any] | None = None, first_row: int = 0,
                 row_errors: dict[int, str] | None = None,
                 samplings: list[SamplingConfig | str | None] | None = None) -> list[Prompt]:
    """One :class:`Prompt` per row, in order; rows are numbered from ``first_row``. ``texts``
    are the rows' text values, or their chat messages when ``job.messages_column`` is set
    (:func:`pipeline.io.chat.chat_token_ids`). ``samplings``: each row's own sampling
    (:func:`pipeline.io.sampling.row_sampling`; ``None``: ``job.sampling``; a string: why the
    row's sampling is invalid).

    Error rows, each with the reason: ``row_errors`` (row -> why, decided by the caller, such as
    a duplicate id); an invalid per-row sampling; null, empty or non-string text; bytes that are
    not UTF-8; malformed chat messages; an id seen earlier in ``ids``; a prompt that leaves no
    room for one output token within ``max_model_len`` tokens, unless ``job.too_long ==
    "truncate"``, which cuts a text row's text so that the prompt (chat template included)
    leaves room for the row's ``max_new_tokens``, and sets ``truncated``.
    """
    from pipeline.io.chat import chat_token_ids

    chat = job.messages_column is not None
    render = None if chat else Renderer(job, tokenizer)
    encoder = Encoder(tokenizer) if chat else None
    first_seen: dict[Any, int] = {}
    out = []
    for i, (value, key) in enumerate(zip(texts, keys)):
        row = first_row + i
        p = Prompt(row=row, row_key=key)
        out.append(p)
        if row_errors and row in row_errors:
            p.error = row_errors[row]
            continue
        if ids is not None:
            rid = ids[i]
            if rid in first_seen:
                p.error = f"duplicate id {rid!r} (first at row {first_seen[rid]})"
                continue
            first_seen[rid] = row
        sampling = samplings[i] if samplings is not None else None
        if isinstance(sampling, str):
            p.error = sampling
            continue
        p.sampling = sampling
        max_new = (sampling or job.sampling).max_new_tokens
        if chat:
            try:
                token_ids = chat_token_ids(value, job, tokenizer, encoder)
            except ValueError as exc:
                p.error = str(exc)
                continue
        else:
            text, p.error = as_text(value, job.text_column)
            if p.error:
                continue
            budget = max_model_len - max_new - render.overhead
            if job.too_long == "truncate" and budget < 1:
                p.error = (f"job.sampling.max_new_tokens={max_new} leaves no room for the text: the prompt "
                           f"template takes {max_model_len - max_new - budget} of model.max_model_len={max_model_len} tokens")
                continue
            token_ids, p.truncated = render(text, budget if job.too_long == "truncate" else None)
        if len(token_ids) >= max_model_len:
            cut = " (job.too_long=truncate cuts the text instead)" if not chat else ""
            p.error = (f"prompt is {len(token_ids)} tokens; the model's context (model.max_model_len) "
                       f"is {max_model_len} tokens{cut}")
        else:
            p.token_ids = token_ids
    return out
