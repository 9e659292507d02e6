"""OpenAI batch files without an engine: detection, request lines -> rows (sampling fields under
vLLM's names, bad lines as rows that say why), rows -> prompts with the model's real tokenizer,
and output rows -> the OpenAI batch output format."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from pipeline.config import compose
from pipeline.io.openai_batch import CHAT, COMPLETIONS, request_batch, request_prompts
from pipeline.io.openai_body import body_sampling
from pipeline.io.openai_output import output_line, write_batch_output
from pipeline.io.output import RowResult, build_output, output_schema, row_ids
from pipeline.io.sampling import row_sampling
from pipeline.io.shards import batch_output_url, iter_batches, list_shards, shard_format, shard_schema


def _request(cid: str, url: str = CHAT, **body) -> dict:
    return {"custom_id": cid, "method": "POST", "url": url, "body": {"model": "m", **body}}


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


LINES = [
    _request("chat", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
             max_tokens=8, temperature=0, user="u1", metadata={"k": "v"}),
    _request("completion", COMPLETIONS, prompt="Once upon a time", max_tokens=5, logprobs=2, stop="."),
    "{broken",
    {"custom_id": "no-body", "method": "POST", "url": CHAT},
    _request("embeddings", "/v1/embeddings", input="x"),
    _request("parts", messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
             logprobs=True, top_logprobs=3, max_completion_tokens=4),
    _request("bias", messages=_user("x"), logit_bias={"1": 5}),
    _request("bad-range", messages=_user("x"), temperature=-1),
    _request("wizard", messages=[{"role": "wizard", "content": "x"}]),
    _request("chat", messages=_user("same id again")),
]


@pytest.fixture(scope="module")
def tokenizer():
    from pipeline.engine.model import load_tokenizer

    return load_tokenizer(compose(["+job=summarize"]))


def _write(path, lines) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


def test_detected_by_the_first_valid_line(tmp_path):
    _write(tmp_path / "batch.jsonl", ["{oops", *LINES[:2]])
    _write(tmp_path / "plain.jsonl", [{"id": "a", "text": "x"}, LINES[0]])
    _write(tmp_path / "none.jsonl", ["{oops"])
    assert [shard_format(s) for s in list_shards(str(tmp_path))] == ["openai_batch", "jsonl", "jsonl"]


def test_body_sampling_under_vllm_names_and_what_is_refused():
    assert body_sampling({"model": "m", "messages": [], "max_completion_tokens": 9, "temperature": 0.5, "top_p": 0.9,
                          "seed": 3, "stop": "\n", "n": 1, "logprobs": True, "top_logprobs": 2,
                          "presence_penalty": 0.1, "frequency_penalty": 0.2, "top_k": 5, "min_p": 0.1,
                          "repetition_penalty": 1.1, "stop_token_ids": [2], "ignore_eos": False, "min_tokens": 1,
                          "stream": False, "user": "u", "best_of": 1}, chat=True) == {
        "max_tokens": 9, "temperature": 0.5, "top_p": 0.9, "seed": 3, "stop": ["\n"], "logprobs": 2,
        "presence_penalty": 0.1, "frequency_penalty": 0.2, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1,
        "stop_token_ids": [2], "ignore_eos": False, "min_tokens": 1, "n": 1}
    assert body_sampling({"logprobs": True}, chat=True) == {"logprobs": 0}
    assert body_sampling({"logprobs": 3, "n": 2}, chat=False) == {"logprobs": 3, "n": 2}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert json.loads(body_sampling({"response_format": fmt}, chat=True)["json_schema"]) == schema
    assert body_sampling({"response_format": {"type": "text"}, "guided_regex": "a+"}, chat=True)["regex"] == "a+"
    for body, why in [({"logit_bias": {"1": 1}}, "body.logit_bias"), ({"stream": True}, "body.stream"),
                      ({"tools": [{"type": "function"}]}, "body.tools"), ({"frobnicate": 1}, "body.frobnicate"),
                      ({"temperature": "hot"}, "body.temperature is a JSON string, not a number"),
                      ({"max_tokens": 1.5}, "body.max_tokens is a JSON number, not an integer"),
                      ({"logprobs": 3}, "not a boolean"), ({"top_logprobs": 3}, "needs body.logprobs=true"),
                      ({"response_format": {"type": "yaml"}}, "body.response_format")]:
        with pytest.raises(ValueError, match=why.replace(".", r"\.").replace("=", "=")):
            body_sampling(body, chat=True)


def test_lines_become_rows_bad_lines_say_why(tmp_path):
    _write(tmp_path / "b.jsonl", LINES)
    shard = list_shards(str(tmp_path))[0]
    rows = [r for _, b in iter_batches(shard, 4) for r in b.to_pylist()]
    assert all(b.schema.equals(shard_schema(shard)) for _, b in iter_batches(shard, 4))
    # A line that is not JSON has no custom_id: it is named by its line (a string, as vLLM's
    # batch output requires).
    assert [r["id"] for r in rows] == ["chat", "completion", "line-3-without-custom-id", "no-body", "embeddings",
                                       "parts", "bias", "bad-range", "wizard", "chat"]
    assert rows[0]["messages"][1] == {"role": "user", "content": "Hi"} and rows[0]["text"] is None
    assert rows[0]["model"] == "m" and rows[0]["sampling_params"]["max_tokens"] == 8
    assert rows[1]["text"] == "Once upon a time" and rows[1]["messages"] is None
    assert rows[1]["sampling_params"]["stop"] == ["."] and rows[1]["sampling_params"]["logprobs"] == 2
    errors = [r["line_error"] for r in rows]
    assert errors[2].startswith("line 3 is not valid JSON")
    assert errors[3] == "line 4: the request has no body"
    assert errors[4] == "line 5: url '/v1/embeddings' is not supported (supported: /v1/chat/completions, /v1/completions)"
    assert rows[5]["messages"] == [{"role": "user", "content": "ab"}] and rows[5]["sampling_params"]["logprobs"] == 3
    assert errors[6].startswith("line 7: body.logit_bias=")
    # A value out of range names its line and the body's own field name.
    assert errors[7] == "line 8: body.temperature: must be >= 0, got -1"
    assert [e is None for e in errors] == [True, True, False, False, False, True, False, False, True, True]
    for body, why in [({"max_tokens": -1}, "line 1: body.max_tokens: must be >= 1, got -1"),
                      ({"max_completion_tokens": 0}, "line 1: body.max_tokens: must be >= 1, got 0"),
                      ({"n": 0}, "line 1: body.n: must be >= 1, got 0"),
                      ({"max_tokens": 4, "min_tokens": 9}, "line 1: body.min_tokens: must be in [0, max_tokens=4], got 9")]:
        assert request_batch([(1, _request("r", messages=_user("x"), **body))]).column("line_error")[0].as_py() == why
    # Fields the job's sampling decides are checked against it later (n > 1 needs a run of samples).
    ok = request_batch([(1, _request("r", messages=_user("x"), n=3, min_tokens=100))])
    assert ok.column("line_error")[0].as_py() is None
    for line, why in [({"custom_id": "g", "method": "GET", "url": CHAT, "body": {}}, "method is 'GET'"),
                      ({"url": CHAT, "body": {}, "method": "POST"}, "custom_id is missing"),
                      (_request("ids", COMPLETIONS, prompt=[1, 2]), "body.prompt must be one string"),
                      (_request("img", messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
                       "only text parts"),
                      ([1], "not a request object")]:
        assert why in request_batch([(1, line)]).column("line_error")[0].as_py()


def test_prompts_chat_through_the_template_completions_as_written(tmp_path, tokenizer):
    _write(tmp_path / "b.jsonl", LINES)
    shard = list_shards(str(tmp_path))[0]
    _, batch = next(iter_batches(shard, 100))
    job = compose(["+job=summarize", "job.sampling.max_new_tokens=16"]).job
    samplings = []
    for value in batch.column("sampling_params").to_pylist():
        try:
            samplings.append(row_sampling(job.sampling, value, "sampling_params"))
        except ValueError as exc:
            samplings.append(str(exc))
    from pipeline.io.formats import line_errors

    errors = line_errors(batch, 0, {9: "duplicate id 'chat' (first at row 0)"})
    prompts = request_prompts(batch, [str(i) for i in range(10)], job, tokenizer, 2048, 0, errors, samplings)
    chat = tokenizer.apply_chat_template(LINES[0]["body"]["messages"], add_generation_prompt=True, tokenize=True)
    chat = chat["input_ids"] if hasattr(chat, "keys") else chat  # a BatchEncoding in recent transformers
    assert prompts[0].token_ids == list(chat) and prompts[0].sampling.max_new_tokens == 8
    assert prompts[1].token_ids == tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
    assert prompts[1].sampling.logprobs == 2 and prompts[1].sampling.stop == ["."]
    assert prompts[5].sampling.max_new_tokens == 4 and prompts[5].sampling.logprobs == 3
    assert "job.system_prompt" not in str(prompts[0])  # the job's prompt template and system prompt stay out
    assert [p.error is None for p in prompts] == [True, True, False, False, False, True, False, False, False, False]
    assert prompts[3].error == "line 4: the request has no body"
    assert "temperature" in prompts[7].error and "wizard" in prompts[8].error
    assert prompts[9].error.startswith("duplicate id")


def _output(tmp_path, tokenizer):
    """An output shard as a shard owner writes it, for the first two requests and three errors."""
    _write(tmp_path / "in" / "b.jsonl", LINES[:4] + [LINES[7]])
    shard = list_shards(str(tmp_path / "in"))[0]
    _, rows = next(iter_batches(shard, 100))
    hello = tokenizer("Hello there", add_special_tokens=False)["input_ids"]
    steps = [[{"token_id": t, "logprob": -0.5}, {"token_id": t + 1, "logprob": -1.5}, {"token_id": t + 2, "logprob": -9.0}]
             for t in hello]
    results = [RowResult(generation="Hello there", generation_token_ids=hello, finish_reason="stop",
                         prompt_tokens=20, output_tokens=len(hello), queue_s=0.1),
               RowResult(generation="Hello there", generation_token_ids=hello, finish_reason="length",
                         stop_reason=None, logprobs=steps, prompt_tokens=4, output_tokens=len(hello), queue_s=0.1),
               RowResult(error="line 3 is not valid JSON"), RowResult(error="line 4: the request has no body"),
               RowResult(error="KV transfer did not complete (after 3 tries)", queue_s=0.2)]
    table = build_output(rows, row_ids(rows, "id", shard.name), "id", "text", results)
    pq.write_table(table.cast(output_schema(rows.schema, "id", "text")), tmp_path / "out.parquet")
    return shard, hello


def test_output_lines_in_the_openai_batch_output_format(tmp_path, tokenizer):
    shard, hello = _output(tmp_path, tokenizer)
    target = batch_output_url(str(tmp_path / "out"), shard)
    assert target == str(tmp_path / "out" / "b.jsonl")
    assert write_batch_output(str(tmp_path / "out.parquet"), target, tokenizer, rows=2) == 5
    lines = [json.loads(line) for line in open(target)]
    assert [line["custom_id"] for line in lines] == ["chat", "completion", "line-3-without-custom-id", "no-body",
                                                     "bad-range"]
    assert len({line["id"] for line in lines}) == 5 and all(line["id"].startswith("batch_req_") for line in lines)
    chat = lines[0]["response"]
    assert chat["status_code"] == 200 and lines[0]["error"] is None and chat["request_id"]
    assert chat["body"]["object"] == "chat.completion" and chat["body"]["model"] == "m"
    assert chat["body"]["id"].startswith("chatcmpl-") and isinstance(chat["body"]["created"], int)
    assert chat["body"]["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello there"},
                                        "logprobs": None, "finish_reason": "stop", "stop_reason": None}]
    assert chat["body"]["usage"] == {"prompt_tokens": 20, "completion_tokens": len(hello),
                                     "total_tokens": 20 + len(hello)}
    text = lines[1]["response"]["body"]
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "Hello there"
    lp = text["choices"][0]["logprobs"]  # logprobs=2: the top 2 of the 3 recorded, the chosen token's own
    assert "".join(lp["tokens"]) == "Hello there" and lp["token_logprobs"] == [-0.5] * len(hello)
    assert [len(top) for top in lp["top_logprobs"]] == [2] * len(hello) and lp["text_offset"][0] == 0
    for line, code, status in [(lines[2], "invalid_request", 400), (lines[3], "invalid_request", 400),
                               (lines[4], "server_error", 500)]:
        assert line["response"]["status_code"] == status and line["response"]["body"] is None
        assert line["error"]["code"] == code and line["error"]["message"]
    assert lines[3]["error"]["message"] == "line 4: the request has no body"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["b.jsonl"]  # no temporary file left
    # Every line, and a line of several samples, is what vLLM's own batch runner writes (its
    # BatchRequestOutput model; it refused the custom_id null once given to a line that is not
    # JSON). vLLM 0.32's runner serves no /v1/completions, so a completion's body is checked
    # against vLLM's own CompletionResponse, and its envelope apart.
    from vllm.entrypoints.launchers.run_batch import BatchRequestOutput
    from vllm.entrypoints.openai.completion.protocol import CompletionResponse

    several = output_line({"id": "n2", "url": CHAT, "model": "m", "generation": ["a", "b"], "finish_reason": ["stop", "length"],
                           "generation_token_ids": [[1], [2]], "prompt_tokens": 3, "output_tokens": 2, "error": None,
                           "queue_s": 0.0}, 0)
    for line in [*lines, several]:
        body = (line["response"] or {}).get("body")
        if body is not None and body["object"] == "text_completion":
            CompletionResponse.model_validate(body)
            line = {**line, "response": {**line["response"], "body": None}}
        parsed = BatchRequestOutput.model_validate(line)
        assert parsed.custom_id == line["custom_id"]
        if line["error"] is None and line["response"]["body"] is not None:
            assert [c.index for c in parsed.response.body.choices] == [c["index"] for c in line["response"]["body"]["choices"]]


def test_chat_logprobs_and_several_samples():
    row = {"id": "x", "url": CHAT, "model": "m", "sampling_params": {"logprobs": 1},
           "generation": ["a", "b"], "finish_reason": ["stop", "length"], "generation_token_ids": [[1], [2]],
           "logprobs": [[[{"token_id": 1, "logprob": -0.1}]], [[{"token_id": 3, "logprob": -0.2},
                                                                {"token_id": 2, "logprob": -0.7}]]],
           "prompt_tokens": 3, "output_tokens": 2, "error": None, "queue_s": 0.0}
    body = output_line(row, 0)["response"]["body"]
    assert [c["message"]["content"] for c in body["choices"]] == ["a", "b"]
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    second = body["choices"][1]["logprobs"]["content"][0]
    assert second["token"] == "token_id:2" and second["logprob"] == -0.7
    assert second["top_logprobs"] == [{"token": "token_id:3", "logprob": -0.2, "bytes": list(b"token_id:3")}]


def test_a_request_asking_for_samples_makes_the_runs_sample_columns_lists(tmp_path):
    """``vllm run-batch`` serves ``"n": 2`` in a body; so does a run with job.sampling.n=1 whose
    batch file asks for it: the file is read at start and the run's sample columns are lists.
    Not when no body asks for more than one (an "n" elsewhere in a line, n: 1, a string)."""
    from pipeline.preflight.inputs import asks_for_samples
    from pipeline.preflight import preflight

    def request(cid, **body):
        return {"custom_id": cid, "method": "POST", "url": COMPLETIONS, "body": {"prompt": "Hi", **body}}

    plain = [request("a", n=1), request("b", metadata={"n": 3}), request("c", n="2"), "{not json with \"n\""]
    _write(tmp_path / "one" / "b.jsonl", plain)
    _write(tmp_path / "two" / "b.jsonl", [*plain, request("d", n=2)])
    assert not asks_for_samples(str(tmp_path / "one" / "b.jsonl"))
    assert asks_for_samples(str(tmp_path / "two" / "b.jsonl"))
    for name, lists in (("one", False), ("two", True)):
        cfg = compose(["+job=summarize", f"job.input={tmp_path / name}", f"run.dir={tmp_path / name}-run"])
        assert preflight(cfg).sample_lists is lists, name
        assert preflight(compose(["+job=summarize", f"job.input={tmp_path / name}", "job.sampling.n=2",
                                  "job.sampling.temperature=1", f"run.dir={tmp_path / name}-run"])).sample_lists
    # A row of such a run may ask for two samples; of a run without lists, it is an error row.
    assert row_sampling(compose(["+job=summarize"]).job.sampling, {"n": 2}, "body", lists=True).n == 2
    with pytest.raises(ValueError, match="need job.sampling.n > 1"):
        row_sampling(compose(["+job=summarize"]).job.sampling, {"n": 2}, "body", lists=False)
