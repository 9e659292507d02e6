"""Rows -> prompts: render each row's text through the job's template and the model's chat
template, tokenize, and turn unusable rows into error messages instead of requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.config import JobConfig

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


class Renderer:
    """Token ids for a row's text: the job's prompt template and the model's chat template (with
    the assistant turn opened) around it.

    The template is tokenized with its special tokens; the row's text is tokenized with
    ``split_special_tokens``, so a document that contains ``<|im_start|>`` or similar cannot
    open a turn of its own: it reads as plain text.
    """

    def __init__(self, job: JobConfig, tokenizer: Any):
        self.tokenizer = tokenizer
        user = job.prompt_template.replace("{text}", _SLOT)
        messages = [{"role": "user", "content": user}]
        if job.system_prompt:
            messages.insert(0, {"role": "system", "content": job.system_prompt})
        if getattr(tokenizer, "chat_template", None):
            rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            special = False
        else:
            rendered, special = user, True
        before, after = rendered.split(_SLOT)
        self.before = self._ids(before, add_special_tokens=special) if before else []
        self.after = self._ids(after) if after else []

    def _ids(self, text: str, **kw) -> list[int]:
        kw.setdefault("add_special_tokens", False)
        return list(self.tokenizer(text, **kw)["input_ids"])

    def __call__(self, text: str, max_text_tokens: int | None = None) -> tuple[list[int], bool]:
        """(token ids, whether the text was cut to ``max_text_tokens`` tokens)."""
        body = self._ids(text, split_special_tokens=True)
        cut = max_text_tokens is not None and len(body) > max_text_tokens
        if cut:
            body = body[:max(0, max_text_tokens)]
        return self.before + body + self.after, cut


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
                 max_model_len: int, ids: list[Any] | None = None) -> list[Prompt]:
    """One :class:`Prompt` per row, in order.

    Error rows, each with the reason: null, empty or non-string text; bytes that are not UTF-8;
    an id seen earlier in the shard (``ids``); a prompt that leaves no room for one output token
    within ``max_model_len`` tokens, unless ``job.too_long == "truncate"``, which cuts the text to
    fit and sets ``truncated``.
    """
    render = Renderer(job, tokenizer)
    budget = max_model_len - 1 - len(render.before) - len(render.after)
    first_seen: dict[Any, int] = {}
    out = []
    for row, (value, key) in enumerate(zip(texts, keys)):
        p = Prompt(row=row, row_key=key)
        out.append(p)
        if ids is not None:
            rid = ids[row]
            if rid in first_seen:
                p.error = f"duplicate id {rid!r} (first at row {first_seen[rid]})"
                continue
            first_seen[rid] = row
        text, p.error = as_text(value, job.text_column)
        if p.error:
            continue
        token_ids, p.truncated = render(text, budget if job.too_long == "truncate" else None)
        if len(token_ids) >= max_model_len:
            p.error = (f"prompt is {len(token_ids)} tokens; the model's context (model.max_model_len) "
                       f"is {max_model_len} tokens (job.too_long=truncate cuts the text instead)")
        else:
            p.token_ids = token_ids
    return out
