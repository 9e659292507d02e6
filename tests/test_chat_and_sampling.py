"""Chat input (``job.messages_column``), per-row sampling (``job.sampling_column``) and the
sampling outputs (``stop_reason``, ``logprobs``, ``cumulative_logprob``), on real engines: one
input, run colocated, disaggregated with NIXL push, and disaggregated with NIXL pull through the
decode DRAM tier, the latter with ``pools.local_prefill_tokens`` set between the rows' prompt
lengths (the shorter rows are prefilled on the decode worker, with no KV transfer). Checked against independent sources: the colocated run (plain vLLM), the
model's chat template applied by its tokenizer, a JSON Schema validator, the regex itself, the
sum of the chosen tokens' log-probabilities, and rows of the same prompt without the setting
(a stop token ends the unconstrained output at its first occurrence; penalties change it). The same input folder holds an OpenAI batch file
(chat and completions requests, bad lines among them): its ``.jsonl`` output is checked field by
field against the OpenAI batch output format, and against the Parquet output beside it. On the
test Slurm, a sweep of colocated and push + DRAM tier gives the colocated run's rows and lines.
"""

from __future__ import annotations

import json
import math
import re

import jsonschema
import pyarrow as pa
import pyarrow.csv  # noqa: F401  (pa.csv)
import pyarrow.parquet as pq
import pytest

from tests.helpers import COMMON as BASE
from tests.helpers import SLURM, Run, assert_across_hosts, last_core, node_bytes_sent, run_to_end, start_run

pytestmark = pytest.mark.e2e

SYSTEM = "Be brief."
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "year": {"type": "integer"}},
          "required": ["city", "year"], "additionalProperties": False}
REGEX = "[0-9]{3}-[0-9]{4}"
SAMPLING = pa.struct([("max_tokens", pa.int64()), ("temperature", pa.float64()), ("seed", pa.int64()),
                      ("top_k", pa.int64()), ("min_p", pa.float64()), ("stop", pa.list_(pa.string())),
                      ("logprobs", pa.int64()), ("json_schema", pa.string()), ("regex", pa.string()),
                      ("choice", pa.list_(pa.string())), ("min_tokens", pa.int64()),
                      ("ignore_eos", pa.bool_()), ("stop_token_ids", pa.list_(pa.int64())),
                      ("repetition_penalty", pa.float64()), ("presence_penalty", pa.float64()),
                      ("frequency_penalty", pa.float64()), ("bogus", pa.int64())])
PERIOD = 30  # the SmolLM2 tokenizer's id of "." (checked in test_stop_token_ids_end_the_row)
PENALTIES = {"repetition_penalty": 1.5, "presence_penalty": 1.0, "frequency_penalty": 1.0}


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


ROWS = [  # id, messages, sampling overrides
    ("greedy", [{"role": "system", "content": "You answer in one sentence."},
                {"role": "user", "content": "What does a lighthouse do?"}], None),
    ("multi-turn", [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "An apple."},
                    {"role": "user", "content": "And a vegetable?"}], None),
    ("stop-period", _user("Describe a river in three sentences."), {"stop": ["."], "max_tokens": 48}),
    ("stop-comma", _user("List five colours, separated by commas."), {"stop": [","], "max_tokens": 48}),
    ("logprobs", _user("Say hello."), {"logprobs": 3}),
    ("logprobs-long", _user("Say hello to the people who live in the small town by the river."), {"logprobs": 3}),
    ("seeded", _user("Write a line about the sea."), {"temperature": 0.8, "seed": 1234, "top_k": 20, "min_p": 0.05}),
    ("choice", _user("Is water wet? Answer yes or no."), {"choice": ["yes", "no"]}),
    ("regex", _user("Give me a phone number."), {"regex": REGEX}),
    ("json", _user("Give a city and the year it was founded, as JSON."), {"json_schema": json.dumps(SCHEMA), "max_tokens": 64}),
    ("ignore-eos", _user("Hi."), {"min_tokens": 10, "ignore_eos": True, "max_tokens": 12}),
    ("ignore-eos-long", _user("Hi there, how are you doing on this fine and sunny morning?"),
     {"min_tokens": 10, "ignore_eos": True, "max_tokens": 12}),
    ("river", _user("Describe a river in three sentences."), {"max_tokens": 48}),
    ("stop-token", _user("Describe a river in three sentences."), {"stop_token_ids": [PERIOD], "max_tokens": 48}),
    ("no-penalties", _user("Write the word apple ten times."), {"max_tokens": 24}),
    ("penalties", _user("Write the word apple ten times."), {**PENALTIES, "max_tokens": 24}),
    ("bad-field", _user("Hi."), {"bogus": 1}),
    ("bad-range", _user("Hi."), {"temperature": -1.0}),
    ("bad-role", [{"role": "wizard", "content": "Hi."}], None),
    ("null-content", [{"role": "user", "content": None}], None),
    ("no-turns", [], None),
]
# The chat rows' prompts are 19-39 tokens (chat template included): those under 21 ("logprobs",
# "ignore-eos" and two error rows) are prefilled on the decode worker in the pull-dram run; every
# other feature row, and the "-long" twins of those two, has its KV moved over NIXL there.
LOCAL_BELOW = 21
LOCAL = {"logprobs", "ignore-eos"}
COMMON = ["job.messages_column=messages", f"job.system_prompt='{SYSTEM}'", "job.sampling.max_new_tokens=24"]


@pytest.fixture(scope="module")
def chat_input(tmp_path_factory):
    d = tmp_path_factory.mktemp("chat") / "input"
    d.mkdir()
    sampling = pa.array([s for _, _, s in ROWS], SAMPLING)
    pq.write_table(pa.table({"id": [i for i, _, _ in ROWS],
                             "messages": pa.array([m for _, m, _ in ROWS],
                                                  pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
                             "sampling_params": sampling}), d / "chat.parquet")
    batch = [_request("b-chat", messages=ROWS[0][1], max_tokens=16, temperature=0),
             _request("b-completion", COMPLETIONS, prompt="The capital of France is", max_tokens=6,
                      logprobs=2, stop="\n"),
             "{not json",
             _request("b-json", messages=_user("Give a city and the year it was founded, as JSON."), max_tokens=64,
                      response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}),
             _request("b-embeddings", "/v1/embeddings", input="x"),
             _request("b-chat-logprobs", messages=_user("Say hello."), max_completion_tokens=5, logprobs=True,
                      top_logprobs=2)]
    (d / "requests.jsonl").write_text("".join((b if isinstance(b, str) else json.dumps(b)) + "\n" for b in batch))
    # The same turns as JSON Lines (content as a string in one row, as a list of parts in
    # another: pyarrow cannot type that column, so it is read as JSON text) and as CSV (JSON text).
    parts = [{**t, "content": [{"type": "text", "text": t["content"]}]} for t in ROWS[1][1]]
    lines = [{"id": "j-greedy", "messages": ROWS[0][1]}, {"id": "j-multi-turn", "messages": parts},
             {"id": "j-string", "messages": "What does a lighthouse do?"}]
    (d / "chat-lines.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    pa.csv.write_csv(pa.table({"id": ["c-greedy", "c-bad"], "messages": [json.dumps(ROWS[0][1]), "[not json"]}),
                     d / "chat-table.csv")
    return d


CHAT_URL, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def _request(cid: str, url: str = CHAT_URL, **body) -> dict:
    return {"custom_id": cid, "method": "POST", "url": url, "body": {"model": "smollm2", **body}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, chat_input) -> dict[str, Run]:
    # Colocated beside the 1P:1D push run, on the core it leaves idle (tests.conftest.start_run).
    colocated = start_run(tmp_path_factory, "chat-colocated", "pools=colocated", *COMMON, input_url=str(chat_input),
                          cpus=last_core())
    push = run_to_end(tmp_path_factory, "chat-push", "pools=disaggregated", "transport=nixl_push", *COMMON,
                      input_url=str(chat_input))
    return {
        "colocated": colocated.wait(),
        "push": push,
        "pull-dram": run_to_end(tmp_path_factory, "chat-pull-dram", "pools=disaggregated", "transport=nixl_pull",
                          "offload=dram", "offload.dram_gib=1", f"pools.local_prefill_tokens={LOCAL_BELOW}",
                          *COMMON, input_url=str(chat_input)),
    }


def _rows(run: Run) -> dict[str, dict]:
    return {r["id"]: r for r in run.rows("chat.parquet")}


def test_every_row_once_and_disaggregated_equals_colocated(runs):
    base = _rows(runs["colocated"])
    assert list(base) == [i for i, _, _ in ROWS]
    for mode in ("push", "pull-dram"):
        rows = _rows(runs[mode])
        assert list(rows) == list(base)
        for key, r in rows.items():
            # Greedy rows and the seeded sampled row alike: a per-request seed does not depend on
            # the batch, and decode samples every token in both modes.
            assert r["generation_token_ids"] == base[key]["generation_token_ids"], (mode, key)
            assert (r["error"], r["finish_reason"], r["stop_reason"]) == (
                base[key]["error"], base[key]["finish_reason"], base[key]["stop_reason"]), (mode, key)
            assert r["decode_worker"] is not None or r["error"], (mode, key)


def test_json_lines_and_csv_chat_rows_equal_the_parquet_rows(runs):
    """The same turns from a JSON Lines file (a column of mixed types) and a CSV file (JSON
    text) give the Parquet row's tokens in every mode; a value that is not turns is an error row."""
    base = _rows(runs["colocated"])
    for mode, run in runs.items():
        lines = {r["id"]: r for r in run.rows("chat-lines.parquet")}
        table = {r["id"]: r for r in run.rows("chat-table.parquet")}
        assert list(lines) == ["j-greedy", "j-multi-turn", "j-string"] and list(table) == ["c-greedy", "c-bad"]
        for got, key in ((lines["j-greedy"], "greedy"), (lines["j-multi-turn"], "multi-turn"), (table["c-greedy"], "greedy")):
            assert got["error"] is None and got["generation_token_ids"] == base[key]["generation_token_ids"], (mode, got["id"])
            assert got["prompt_tokens"] == base[key]["prompt_tokens"], (mode, got["id"])
        assert "messages is a string, not a list of {role, content} turns" in lines["j-string"]["error"], mode
        assert "'[not json'" in table["c-bad"]["error"] and table["c-bad"]["generation"] is None, mode
        if mode != "colocated":
            assert lines["j-greedy"]["kv_tokens"] > 0 and table["c-greedy"]["decode_worker"], mode


def test_short_prompts_prefilled_on_decode_without_kv(runs):
    """Rows under ``pools.local_prefill_tokens`` (prompt lengths from the colocated run) had no
    KV hand-off and received no KV; the others received KV. Their output equals colocated's
    (above)."""
    base, rows = _rows(runs["colocated"]), _rows(runs["pull-dram"])
    served = {k: r for k, r in rows.items() if r["error"] is None}
    local = {k for k in served if base[k]["prompt_tokens"] < LOCAL_BELOW}
    assert local == LOCAL, "the threshold must split the rows as the test expects"
    for k, r in served.items():
        if k in local:
            assert (r["kv_handoff_s"], r["kv_tokens"], r["kv_bytes"]) == (None, 0, 0), k
            assert r["prefill_s"] is not None and r["decode_worker"], k
        else:
            assert r["kv_tokens"] > 0 and r["kv_handoff_s"] is not None, k


def test_messages_rendered_with_the_models_chat_template(runs):
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer

    tok = load_tokenizer(compose(["+job=summarize"]))
    rows = _rows(runs["colocated"])
    for key, messages, _ in ROWS[:2]:
        turns = messages if any(m["role"] == "system" for m in messages) else [
            {"role": "system", "content": SYSTEM}, *messages]
        want = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
        want = want["input_ids"] if hasattr(want, "keys") else want
        assert rows[key]["prompt_tokens"] == len(want), key
        assert rows[key]["error"] is None and rows[key]["generation"]


def test_malformed_rows_and_bad_sampling_are_error_rows(runs):
    rows = _rows(runs["push"])
    assert "sampling_params.bogus: unknown sampling field" in rows["bad-field"]["error"]
    assert "sampling_params.temperature: must be >= 0" in rows["bad-range"]["error"]
    assert "role is 'wizard'" in rows["bad-role"]["error"]
    assert "content is null" in rows["null-content"]["error"]
    assert "empty" in rows["no-turns"]["error"]
    for key in ("bad-field", "bad-range", "bad-role", "null-content", "no-turns"):
        assert rows[key]["generation"] is None


def test_stop_strings_end_the_row_and_are_not_output(runs):
    rows = _rows(runs["push"])
    stopped = 0
    for key, stop in (("stop-period", "."), ("stop-comma", ",")):
        r = rows[key]
        assert stop not in r["generation"]
        assert r["stop_reason"] in (stop, None)
        if r["stop_reason"] == stop:
            stopped += 1
            assert r["finish_reason"] == "stop"
    assert stopped >= 1
    assert rows["greedy"]["stop_reason"] is None


def test_stop_token_ids_end_the_row(runs):
    """A stop token ends the row at its first occurrence in what the same prompt generates
    without it (the ``river`` row, greedy): the tokens up to and including it, finish ``stop``,
    ``stop_reason`` the token id as text. In every mode (the modes agree above)."""
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer

    assert load_tokenizer(compose(["+job=summarize"])).convert_tokens_to_ids(".") == PERIOD
    for mode, run in runs.items():
        rows = _rows(run)
        free = rows["river"]["generation_token_ids"]
        assert PERIOD in free, "the unconstrained row must hold a period for the test to bite"
        r = rows["stop-token"]
        assert r["generation_token_ids"] == free[:free.index(PERIOD) + 1], mode
        assert (r["finish_reason"], r["stop_reason"]) == ("stop", str(PERIOD)), mode


def test_penalties_change_what_is_repeated(runs):
    """Repetition, presence and frequency penalties reach the engine that samples (decode in the
    disaggregated modes, which equal colocated above): the penalised row differs from the same
    prompt without them and repeats fewer of its own tokens (output tokens equal to an earlier
    output token)."""
    def repeats(tokens: list[int]) -> int:
        return len(tokens) - len(set(tokens))

    for mode, run in runs.items():
        rows = _rows(run)
        free, penalised = rows["no-penalties"]["generation_token_ids"], rows["penalties"]["generation_token_ids"]
        assert penalised != free, mode
        assert repeats(free) >= 2, "the unpenalised row must repeat itself for the test to bite"
        assert repeats(penalised) < repeats(free), mode


def test_structured_outputs_follow_their_constraint(runs):
    for run in runs.values():
        rows = _rows(run)
        assert rows["choice"]["generation"] in ("yes", "no")
        assert re.fullmatch(REGEX, rows["regex"]["generation"])
        jsonschema.validate(json.loads(rows["json"]["generation"]), SCHEMA)


def test_logprobs_and_their_sum(runs):
    for run, key in ((run, key) for run in runs.values() for key in ("logprobs", "logprobs-long")):
        r = _rows(run)[key]
        steps = r["logprobs"]
        assert len(steps) == r["output_tokens"] == len(r["generation_token_ids"])
        chosen = []
        for token, step in zip(r["generation_token_ids"], step_list := steps):
            assert 3 <= len(step) <= 4  # the top 3, and the chosen token when it is not among them
            assert [s["logprob"] for s in step] == sorted((s["logprob"] for s in step), reverse=True)
            chosen.append(next(s["logprob"] for s in step if s["token_id"] == token))
        assert len(step_list) == len(chosen)
        # Greedy: the chosen token is the most likely one.
        assert all(step[0]["token_id"] == t for step, t in zip(steps, r["generation_token_ids"]))
        assert math.isclose(r["cumulative_logprob"], sum(chosen), rel_tol=1e-4, abs_tol=1e-3)
        assert _rows(run)["greedy"]["logprobs"] is None


def test_min_tokens_and_ignore_eos(runs):
    for run, key in ((run, key) for run in runs.values() for key in ("ignore-eos", "ignore-eos-long")):
        r = _rows(run)[key]
        assert r["output_tokens"] == 12 and r["finish_reason"] == "length"


def _batch_lines(run: Run) -> list[dict]:
    return [json.loads(line) for line in (run.output / "requests.jsonl").read_text().splitlines()]


def test_openai_batch_file_output_format_and_modes_agree(runs):
    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer

    tok = load_tokenizer(compose(["+job=summarize"]))
    lines = {mode: _batch_lines(run) for mode, run in runs.items()}
    base = lines["colocated"]
    # One line per request, in input order; the bad lines are error lines, none lost.
    assert [line["custom_id"] for line in base] == ["b-chat", "b-completion", "line-3-without-custom-id", "b-json",
                                                    "b-embeddings", "b-chat-logprobs"]
    for mode, got in lines.items():
        assert [line["custom_id"] for line in got] == [line["custom_id"] for line in base], mode
        for line, want in zip(got, base):
            assert set(line) == {"id", "custom_id", "response", "error"} and line["id"].startswith("batch_req_")
            if want["error"] is None:  # greedy requests: the same text in every mode
                assert line["error"] is None and line["response"]["status_code"] == 200, (mode, line)
                assert ([c.get("text", c.get("message", {}).get("content")) for c in line["response"]["body"]["choices"]]
                        == [c.get("text", c.get("message", {}).get("content")) for c in want["response"]["body"]["choices"]])
    by_id = {line["custom_id"]: line for line in base}
    for bad, code in ((base[2], "invalid_request"), (by_id["b-embeddings"], "invalid_request")):
        assert bad["response"]["status_code"] == 400 and bad["response"]["body"] is None
        assert bad["error"]["code"] == code
    assert base[2]["error"]["message"].startswith("line 3 is not valid JSON")
    assert "/v1/embeddings" in by_id["b-embeddings"]["error"]["message"]

    chat = by_id["b-chat"]["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["model"] == "smollm2"
    (choice,) = chat["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    # The prompt is the chat template over the messages, as vLLM's run-batch renders it.
    want = tok.apply_chat_template(ROWS[0][1], add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    usage = chat["usage"]
    assert usage["prompt_tokens"] == len(want) and 0 < usage["completion_tokens"] <= 16
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # The Parquet output beside it has the same generation for the same row.
    parquet = {r["id"]: r for r in runs["colocated"].rows("requests.parquet")}
    assert choice["message"]["content"] == parquet["b-chat"]["generation"]
    assert len(parquet) == 6 and parquet["b-embeddings"]["generation"] is None

    completion = by_id["b-completion"]["response"]["body"]
    assert completion["object"] == "text_completion"
    text = completion["choices"][0]["text"]
    assert "\n" not in text and completion["usage"]["prompt_tokens"] == len(
        tok("The capital of France is", add_special_tokens=False)["input_ids"])
    lp = completion["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == text or completion["choices"][0]["finish_reason"] == "stop"
    assert all(len(top) <= 2 for top in lp["top_logprobs"]) and len(lp["token_logprobs"]) == len(lp["tokens"])
    assert lp["token_logprobs"] == [max(top.values()) for top in lp["top_logprobs"]]  # greedy: the best token

    jsonschema.validate(json.loads(by_id["b-json"]["response"]["body"]["choices"][0]["message"]["content"]), SCHEMA)
    content = by_id["b-chat-logprobs"]["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert 0 < len(content) <= 5 and all(len(t["top_logprobs"]) == 2 for t in content)
    assert all(t["logprob"] == t["top_logprobs"][0]["logprob"] for t in content)


@pytest.mark.slurm
def test_on_slurm_a_sweep_of_colocated_and_push_through_the_dram_tier(slurm_cluster, runs, chat_input, tmp_path):
    """The same input on the test Slurm as a real multirun from Python, ``submit("-m",
    "pools=colocated,disaggregated", ...)`` with NIXL push through the DRAM tier: both points
    are submitted before either has ended (each in its own run directory, the disaggregated
    one a decode job and a prefill array), and each gives the local colocated run's rows
    (chat messages, per-row sampling) and OpenAI batch lines."""
    from pipeline import submit

    sent = node_bytes_sent()
    handles = submit("-m", *BASE, *SLURM, "pools=colocated,disaggregated", "transport=nixl_push",
                     "offload=dram", "offload.dram_gib=1", *COMMON, f"job.input={chat_input}",
                     f"run.dir={tmp_path / 'sweep'}")
    assert [h.run_dir for h in handles] == [tmp_path / "sweep" / "0", tmp_path / "sweep" / "1"]
    assert not any((h.run_dir / "summary.json").exists() for h in handles)  # submitted without waiting
    base, want = _rows(runs["colocated"]), _batch_lines(runs["colocated"])
    for point, handle in enumerate(handles):
        summary = handle.wait()
        assert summary.shards_done == summary.shards == 4, (point, summary)
        jobs = json.loads((handle.run_dir / "jobs.json").read_text())
        assert len(jobs["array_tasks"]) == 1 and len(jobs.get("decode") or []) == point
        output = handle.run_dir / "output"
        rows = {r["id"]: r for r in pq.read_table(output / "chat.parquet").to_pylist()}
        assert list(rows) == list(base), point
        for key, r in rows.items():
            assert (r["generation_token_ids"], r["error"], r["finish_reason"], r["stop_reason"]) == (
                base[key]["generation_token_ids"], base[key]["error"], base[key]["finish_reason"],
                base[key]["stop_reason"]), (point, key)
            assert r["error"] or bool(r["decode_worker"] and r["kv_tokens"] > 0) == (point == 1), (point, key)
        got = [json.loads(line) for line in (output / "requests.jsonl").read_text().splitlines()]
        assert [(g["custom_id"], g["response"]["status_code"]) for g in got] == [
            (w["custom_id"], w["response"]["status_code"]) for w in want], point
        for g, w in zip(got, want):
            if w["error"] is None:
                assert g["response"]["body"]["choices"] == w["response"]["body"]["choices"], (point, g["custom_id"])
    # The disaggregated point pushed its KV into the DRAM tier of a decode rank on another node.
    assert_across_hosts(handles[1].run_dir, handles[1].run_dir / "output", sent)
