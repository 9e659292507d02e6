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
    job = compose(["+job=summarize", "job.too_long=truncate", "job.sampling.max_new_tokens=16"]).job
    texts = [b"valid bytes", b"\xff\xfe broken", "a " * 100, "dup one", "dup two"]
    prompts = make_prompts(texts, [str(i) for i in range(5)], job, _Tok(), max_model_len=50,
                           ids=["a", "b", "c", "d", "d"])
    assert prompts[0].error is None
    assert "not valid UTF-8" in prompts[1].error and "0xff" in prompts[1].error
    # Cut so that max_new_tokens still fit: 50 - 16 = 34 tokens (the stand-in has no template).
    assert prompts[2].truncated and len(prompts[2].token_ids) == 50 - 16
    assert prompts[3].error is None
    assert "duplicate id 'd'" in prompts[4].error and "row 3" in prompts[4].error


def test_truncate_leaves_no_room_is_a_row_error_naming_the_settings():
    job = compose(["+job=summarize", "job.too_long=truncate", "job.sampling.max_new_tokens=50"]).job
    prompts = make_prompts(["a " * 100, "short"], ["0", "1"], job, _Tok(), max_model_len=50)
    assert all("job.sampling.max_new_tokens=50 leaves no room" in p.error for p in prompts)


def test_rows_numbered_from_first_row_and_caller_errors_first():
    job = compose(["+job=summarize"]).job
    prompts = make_prompts(["x", "y"], ["0:7", "0:8"], job, _Tok(), max_model_len=50, first_row=7,
                           row_errors={8: "duplicate id 'a' (first at row 2)"})
    assert [p.row for p in prompts] == [7, 8]
    assert prompts[0].error is None and prompts[1].error == "duplicate id 'a' (first at row 2)"


def test_text_in_every_slot_and_truncation_shares_the_budget():
    """Each {text} slot gets the row's text; truncation cuts each copy to budget // slots, so
    the whole prompt still fits; {{ and }} are literal braces."""
    from pipeline.io.prompts import Renderer

    job = compose(["+job=summarize", "job.prompt_template='A {{b}} {text} | {text} end'",
                   "job.too_long=truncate"]).job
    render = Renderer(job, _Tok())
    assert render.slots == 2 and len(render.before) + len(render.after) == 4  # A {b} | end
    ids, cut = render("one two three")
    assert not cut and len(ids) == 4 + 2 * 3
    ids, cut = render("w " * 20, max_text_tokens=11)
    assert cut and len(ids) == 4 + 2 * 5
    prompts = make_prompts(["w " * 300], ["0"], job, _Tok(), max_model_len=200)
    assert prompts[0].truncated and len(prompts[0].token_ids) < 200


def test_bad_prompt_templates_name_the_setting():
    import pytest

    from pipeline.io.prompts import parse_template

    for template, words in [("{text} {title}", "unknown placeholder {title}"), ("{text:10}", "format spec"),
                            ("{text} }", "Single '}'"), ("plain", "must contain {text}")]:
        with pytest.raises(ValueError, match="job.prompt_template: ") as err:
            parse_template(template, "job.prompt_template", ("text",), ("text",))
        assert words in str(err.value)
