"""Rows -> prompts: error rows name their cause."""

from __future__ import annotations

from pipeline.config import compose
from pipeline.io.prompts import make_prompts


class _Tok:
    """Whitespace tokenizer standing in for the model's (no chat template): the prompt checks
    only count tokens."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True, split_special_tokens=False):
        return {"input_ids": list(range(len(text.split())))}


def test_make_prompts_errors_name_the_cause():
    job = compose(["+job=summarize"]).job
    texts = ["fine text", None, "", "   \n", 42, "word " * 100]
    prompts = make_prompts(texts, [str(i) for i in range(6)], job, _Tok(), max_model_len=50)
    assert prompts[0].error is None and prompts[0].token_ids
    assert "null" in prompts[1].error
    assert "empty" in prompts[2].error and "empty" in prompts[3].error
    assert "int" in prompts[4].error
    assert "max_model_len" in prompts[5].error
    assert [p.row for p in prompts] == list(range(6))


def test_make_prompts_bytes_duplicates_and_truncation():
    job = compose(["+job=summarize", "job.too_long=truncate"]).job
    texts = [b"valid bytes", b"\xff\xfe broken", "a " * 100, "dup one", "dup two"]
    prompts = make_prompts(texts, [str(i) for i in range(5)], job, _Tok(), max_model_len=50,
                           ids=["a", "b", "c", "d", "d"])
    assert prompts[0].error is None
    assert "not valid UTF-8" in prompts[1].error and "0xff" in prompts[1].error
    assert prompts[2].truncated and len(prompts[2].token_ids) == 49
    assert prompts[3].error is None
    assert "duplicate id 'd'" in prompts[4].error and "row 3" in prompts[4].error
