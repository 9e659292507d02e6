"""Rows -> prompts: render each row's text through the job's template and the model's chat
template, tokenize, and turn unusable rows into error messages instead of requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.config import JobConfig


@dataclass
class Prompt:
    """One row ready for prefill (``token_ids`` set) or already failed (``error`` set).

    ``row`` is the row index in its shard; ``key`` is unique within the run.
    """

    row: int
    key: str
    token_ids: list[int] | None = None
    error: str | None = None


def render(text: str, job: JobConfig, tokenizer: Any) -> list[int]:
    """Token ids of ``text`` in the job's prompt template and the model's chat template, with the
    assistant turn opened (``add_generation_prompt``). Models without a chat template get the
    plain rendered template."""
    user = job.prompt_template.replace("{text}", text)
    messages = [{"role": "user", "content": user}]
    if job.system_prompt:
        messages.insert(0, {"role": "system", "content": job.system_prompt})
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return list(tokenizer(user)["input_ids"])


def make_prompts(texts: list[Any], keys: list[str], job: JobConfig, tokenizer: Any,
                 max_model_len: int) -> list[Prompt]:
    """One :class:`Prompt` per row, in order. A row whose text is null, not a string, empty, or
    whose prompt leaves no room for one output token within ``max_model_len`` (tokens) gets an
    error that says why."""
    out = []
    for row, (text, key) in enumerate(zip(texts, keys)):
        p = Prompt(row=row, key=key)
        if text is None:
            p.error = f"{job.text_column} is null"
        elif not isinstance(text, str):
            p.error = f"{job.text_column} is {type(text).__name__}, not a string"
        elif not text.strip():
            p.error = f"{job.text_column} is empty"
        else:
            ids = render(text, job, tokenizer)
            if len(ids) >= max_model_len:
                p.error = (f"prompt is {len(ids)} tokens; the model's context (model.max_model_len) "
                           f"is {max_model_len} tokens")
            else:
                p.token_ids = ids
        out.append(p)
    return out
