"""Several samples per prompt (``job.sampling.n`` > 1) on real engines: one input (a Parquet
shard with per-row ``n`` overrides, and an OpenAI batch file asking for ``n: 2``) run colocated,
where vLLM's own parallel sampling (``SamplingParams.n``) draws the samples, and disaggregated
with NIXL pull (1P:2D) and with NIXL push through the decode DRAM tier (1P:1D), where the prompt
is prefilled and its KV moved once and one decode worker draws all the samples itself (sample 0
loads the KV; the others hit its prefix cache). Checked against
the independent source, vLLM's own ``n``: the same samples token for token (float32, seeded),
and against the decode worker's own counters: it computed at most one block of each extra
sample's prompt, not the prompt again.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.io.metrics import read_request_metrics, read_worker_metrics
from tests.helpers import (COMMON, SLURM, Run, assert_across_hosts, last_core, node_bytes_sent, run_pipeline,
                           run_to_end, start_run)

pytestmark = pytest.mark.e2e

N = 3
TEXT = ("The river town grew around a stone bridge built by the monks of the valley. Traders came "
        "every spring with salt, wool and iron, and the market square filled with their carts. ")
ROWS = [  # id, text, the row's own sampling (None: job.sampling)
    ("three", TEXT * 3, None),
    ("one", "Rain fell on the harbour all night. " * 8, {"n": 1}),
    ("two", TEXT * 2 + "A flood in the third year washed the bridge away.", {"n": 2}),
    ("zero", "Hi.", {"n": 0}),
    ("greedy", "Rain fell on the harbour all night. " * 4, {"n": 2, "temperature": 0.0}),  # vLLM's n refuses
    ("float-seed", "Hi there.", {"seed": 5.0}),  # a float column: 5.0 is 5
    ("half-seed", "Hi.", {"seed": 1.5}),  # not an integer: an error row, not a failed engine
]
BLOCK = 32  # model.block_size: tokens per KV block (vLLM's CPU default, 128, would hide the sharing)
SAMPLING = [f"model.block_size={BLOCK}", "job.sampling.temperature=0.8", "job.sampling.seed=7", "job.sampling.max_new_tokens=12",
            f"job.sampling.n={N}"]


@pytest.fixture(scope="module")
def sample_input(tmp_path_factory):
    d = tmp_path_factory.mktemp("samples") / "input"
    d.mkdir()
    pq.write_table(pa.table({"id": [i for i, _, _ in ROWS], "text": [t for _, t, _ in ROWS],
                             "sampling_params": pa.array([s for _, _, s in ROWS], pa.struct([("n", pa.int64()), ("temperature", pa.float64()),
                                                                           ("seed", pa.float64())]))}),
                   d / "rows.parquet")
    lines = [{"custom_id": "b-two", "method": "POST", "url": "/v1/completions",
              "body": {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 6, "n": 2}},
             {"custom_id": "b-chat", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "smollm2", "messages": [{"role": "system", "content": "Be brief."},
                                                        {"role": "user", "content": "Name a bird."}],
                       "max_completion_tokens": 6}}]
    (d / "requests.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return d


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sample_input) -> dict[str, Run]:
    def start(name: str, *mode: str, cpus: set[int] | None = None):
        return start_run(tmp_path_factory, f"samples-{name}", *mode, *SAMPLING, input_url=str(sample_input), cpus=cpus)

    # Colocated beside the 1P:1D push run, on the core it leaves idle (tests.conftest.start_run).
    colocated = start("colocated", "pools=colocated", cpus=last_core())
    push = start("push-dram", "pools=disaggregated", "transport=nixl_push", "offload=dram",
                 "offload.dram_gib=1").wait()
    colocated = colocated.wait()
    disaggregated = start("disaggregated", "pools=disaggregated", "pools.decode=2", "transport=nixl_pull").wait()
    return {"colocated": colocated, "disaggregated": disaggregated, "push-dram": push}


def test_n_samples_equal_vllms_own_and_the_kv_moved_once(runs):
    want = {r["id"]: r for r in runs["colocated"].rows("rows.parquet")}
    dram = {r["id"]: r for r in runs["push-dram"].rows("rows.parquet")}
    got_table = runs["disaggregated"].table("rows.parquet")
    got = {r["id"]: r for r in got_table.to_pylist()}
    # The sample columns are lists in every row of the run.
    assert got_table.schema.field("generation").type == pa.list_(pa.string())
    assert got_table.schema.field("generation_token_ids").type == pa.list_(pa.list_(pa.int32()))
    assert got_table.schema.field("finish_reason").type == pa.list_(pa.string())
    for rid, n in (("three", N), ("one", 1), ("two", 2)):
        g, w = got[rid], want[rid]
        assert g["error"] is None and w["error"] is None, (g["error"], w["error"])
        assert len(g["generation"]) == len(g["generation_token_ids"]) == len(g["finish_reason"]) == n
        assert g["generation_token_ids"] == w["generation_token_ids"] == dram[rid]["generation_token_ids"], rid
        assert g["generation"] == w["generation"], rid
        assert g["output_tokens"] == sum(len(t) for t in g["generation_token_ids"])
        assert all(f in ("stop", "length") for f in g["finish_reason"])
    # Seeds seed + i: the samples of a row differ.
    assert len({tuple(t) for t in got["three"]["generation_token_ids"]}) > 1
    assert got["zero"]["error"] and "n: must be >= 1" in got["zero"]["error"]
    assert got["zero"]["generation"] is None
    assert got["half-seed"]["error"] == "sampling_params.seed: must be an integer, got 1.5"
    for rid in ("greedy", "float-seed"):
        assert got[rid]["error"] is None and got[rid]["generation_token_ids"] == want[rid]["generation_token_ids"], rid
    assert got["greedy"]["generation_token_ids"][0] == got["greedy"]["generation_token_ids"][1]

    # One prefill, one hand-off per row, to one of the two decode workers, which received the
    # prompt's KV once and computed at most one block of each further sample's prompt (its
    # prefix cache held the rest), where vLLM's own n would have loaded or computed the whole
    # prompt per sample (and a sample drawn on the other worker, the whole prompt).
    run = runs["disaggregated"]
    workers = {r["decode_worker"] for r in got.values() if r["generation"]}
    assert len({w.split("@")[0] for w in workers}) == 2, workers  # both decode workers drew samples
    m = read_request_metrics(run.run_dir).to_pylist()
    assert sorted(r["tries"] for r in m) == [1] * 7  # five rows and the batch file's two requests
    assert all(r["kv_tokens"] >= r["prompt_tokens"] - 1 for r in m)
    samples = {r["id"]: len(r["generation"]) for r in got.values() if r["generation"]}
    by_row = {r["row"]: r["prompt_tokens"] for r in m if r["shard"] == "rows.parquet"}
    extra_prompt_tokens = sum(by_row[i] * (samples[rid] - 1) for i, (rid, _, _) in enumerate(ROWS) if rid in samples)
    extra_samples = sum(n - 1 for n in samples.values()) + 1 + N - 1  # + the batch file's requests' others
    computed = sum(s["prompt_tokens_computed"] or 0 for s in read_worker_metrics(run.run_dir).to_pylist()
                   if s["role"] == "decode")
    assert computed <= BLOCK * extra_samples + len(m), (computed, by_row)
    assert computed < 0.5 * extra_prompt_tokens, (computed, extra_prompt_tokens)


@pytest.fixture(scope="module")
def batch_run(tmp_path_factory, sample_input) -> Run:
    """The batch file alone in a run of one sample per prompt (job.sampling.n=1), 1P:1D pull."""
    d = tmp_path_factory.mktemp("samples-batch") / "input"
    d.mkdir()
    (d / "requests.jsonl").write_text((sample_input / "requests.jsonl").read_text())
    return run_to_end(tmp_path_factory, "samples-batch-n1", "pools=disaggregated", "transport=nixl_pull", *SAMPLING,
                "job.sampling.n=1", input_url=str(d))


def _choices(run: Run) -> list[list[str]]:
    """Per line of the batch output: its choices' texts (completions) or messages (chat)."""
    lines = [json.loads(x) for x in (run.output / "requests.jsonl").read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == ["b-two", "b-chat"] and all(x["error"] is None for x in lines), lines
    return [[c.get("text") or c["message"]["content"] for c in x["response"]["body"]["choices"]] for x in lines]


def test_openai_batch_line_with_n_has_one_choice_per_sample(runs):
    for mode, run in runs.items():
        two, chat = _choices(run)
        assert len(two) == 2 and len(chat) == N, mode  # n: 2; the chat request without n: job.sampling.n
        rows = run.rows("requests.parquet")
        assert two == rows[0]["generation"] and chat == rows[1]["generation"]
    assert _choices(runs["colocated"]) == _choices(runs["disaggregated"]) == _choices(runs["push-dram"])


def test_a_batch_file_asking_for_samples_gets_them_in_a_run_of_one_sample(batch_run, runs):
    """As ``vllm run-batch`` serves it: "n": 2 in a body gives two choices though the run's
    job.sampling.n is 1 (the file is read at start, so the run's sample columns are lists); the
    request without n gets one. Its two samples are those of the run whose job asked for 3 (the
    same seed, drawn by vLLM's own n there), and every line parses as vLLM's batch output."""
    from vllm.entrypoints.launchers.run_batch import BatchRequestOutput
    from vllm.entrypoints.openai.completion.protocol import CompletionResponse

    table = batch_run.table("requests.parquet")
    assert table.schema.field("generation_token_ids").type == pa.list_(pa.list_(pa.int32()))
    two, chat = _choices(batch_run)
    assert two == _choices(runs["colocated"])[0] and len(chat) == 1
    rows = table.to_pylist()
    assert [len(r["generation_token_ids"]) for r in rows] == [2, 1] and all(r["kv_tokens"] for r in rows)
    for line in (json.loads(x) for x in (batch_run.output / "requests.jsonl").read_text().splitlines()):
        body = line["response"]["body"]
        if body["object"] == "text_completion":  # vLLM 0.32's runner serves no completions
            CompletionResponse.model_validate(body)
            line["response"]["body"] = None
        assert BatchRequestOutput.model_validate(line).custom_id == line["custom_id"]


@pytest.mark.slurm
def test_samples_per_row_sampling_and_batch_files_on_slurm(slurm_cluster, runs, sample_input, tmp_path):
    # The same input through the test Slurm (1P:1D, pull): the same samples as vLLM's own n.
    sent = node_bytes_sent()
    # The workers' address named as a site names it (the other Slurm runs leave it to the node).
    p = run_pipeline(*COMMON, *SLURM, "pools=disaggregated", "transport=nixl_pull", "transport.interface=eth0",
                     *SAMPLING, "run.wait=true", f"run.dir={tmp_path / 'run'}", f"job.input={sample_input}",
                     f"job.output={tmp_path / 'output'}", timeout=1500)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr[-4000:]}"
    slurm = Run(p.returncode, p.stdout, p.stderr, tmp_path / "run", tmp_path / "output")
    want = runs["colocated"].rows("rows.parquet")
    got = slurm.rows("rows.parquet")
    assert [r["generation_token_ids"] for r in got] == [r["generation_token_ids"] for r in want]
    assert [r["error"] is None for r in got] == [True, True, True, False, True, True, False]
    assert _choices(slurm) == _choices(runs["colocated"])
    jobs = json.loads((tmp_path / "run" / "jobs.json").read_text())
    assert len(jobs["decode"]) == 1 and len(jobs["array_tasks"]) == 1
    assert_across_hosts(tmp_path / "run", tmp_path / "output", sent)
