"""``pools=auto`` (pipeline.plan.auto): the local-prefill threshold against a hand calculation on
the toy model, the input sample against the planner's own reading of a dataset
(``workload_from_input``, written separately), the choice against the planner's answer for
that workload, and the command line's dry run. No engine starts."""

from __future__ import annotations

import dataclasses
import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import compose
from pipeline.io.sample import sample_prompt_lengths
from pipeline.plan.auto import choose_pools, local_prefill_threshold
from tests.conftest import SAMPLE, run_pipeline
from tests.plan.toy import TOY, TOY_HW


def test_local_prefill_threshold_by_hand():
    """Toy model: prefill of n tokens (2 x 5e6 n + 2 x 5 x 10 n^2) / 1.01e10 s; moving its KV
    200 n / 1e8 s; with a 0.5 s hand-off latency local prefill wins while
    (100/1.01e10) n^2 + (1e7/1.01e10 - 2e-6) n < 0.5: up to the positive root of that quadratic."""
    a, b, c = 100 / 1.01e10, 1e7 / 1.01e10 - 2e-6, -0.5
    root = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)  # 503.5 tokens
    hw = dataclasses.replace(TOY_HW, handoff_s=0.5)
    assert local_prefill_threshold(TOY, hw, 65536) == math.ceil(root) == 504
    assert local_prefill_threshold(TOY, hw, 300) == 300  # capped at the context
    assert local_prefill_threshold(TOY, TOY_HW, 65536) == 0  # no hand-off latency measured


def test_sample_renders_prompts_as_the_planner_reads_a_dataset():
    from pipeline.engine.model import load_tokenizer
    from pipeline.io.shards import list_shards
    from pipeline.plan.model import load_model
    from pipeline.plan.workload import workload_from_input

    cfg = compose(["+job=summarize", f"job.input={SAMPLE}"])
    shards = list_shards(cfg.job.input)
    lengths, read = sample_prompt_lengths(cfg, shards, load_tokenizer(cfg), cfg.pools.sample_rows)
    want = workload_from_input(str(SAMPLE), load_model("smollm2-135m"))
    assert (sorted(lengths), read) == (sorted(want.prompt_tokens), 24)
    lengths, read = sample_prompt_lengths(cfg, shards, load_tokenizer(cfg), 5)
    assert read == len(shards) * math.ceil(5 / len(shards)) and len(lengths) == read


def test_choice_is_the_planners_answer_for_the_input():
    from pipeline.plan.hardware import hardware
    from pipeline.plan.model import load_model
    from pipeline.plan.recommend import plan
    from pipeline.plan.workload import workload_from_input

    cfg = compose(["+job=summarize", f"job.input={SAMPLE}", "pools=auto", "pools.prefill=2", "pools.decode=2",
                   "pools.hardware=cpu"])
    from pipeline.io.shards import list_shards

    resolved, choice = choose_pools(cfg, list_shards(cfg.job.input), 24)
    want = plan(load_model("smollm2-135m"), hardware("cpu"), workload_from_input(str(SAMPLE), load_model("smollm2-135m")),
                workers=4, rows_in_flight=cfg.job.batch_rows)
    assert resolved.pools.mode == choice.mode == want.recommendation
    if want.recommendation == "disaggregated":
        split = (want.disaggregated.prefill_workers, want.disaggregated.decode_workers)
        assert (resolved.pools.prefill, resolved.pools.decode) == split
    else:
        assert resolved.pools.prefill == 4
    assert resolved.pools.local_prefill_tokens == 0  # the cpu preset measures no hand-off latency
    assert choice.rows == 24 and choice.sampled_rows == 24 and choice.hardware == "cpu"
    assert set(choice.options) == {"colocated", "disaggregated"}


def test_each_pools_tp_reaches_the_planner_on_devices_and_not_on_cpu():
    """pools=auto with model.prefill_tp=8 / model.decode_tp=4 on the h100 profile is the
    planner's answer for those shapes (the options say so, and their devices count 8 per prefill
    and 4 per decode worker); on the cpu profile a worker's ranks share its cores, so the choice
    is the one for TP 1 (measured here: TP 3 on one core is slower than TP 1)."""
    from pipeline.io.shards import list_shards
    from pipeline.plan.hardware import hardware
    from pipeline.plan.model import load_model
    from pipeline.plan.recommend import plan
    from pipeline.plan.workload import workload_from_input

    base = ["+job=summarize", f"job.input={SAMPLE}", "pools=auto", "pools.prefill=2", "pools.decode=2",
            "model.prefill_tp=8", "model.decode_tp=4"]
    model = load_model("smollm2-135m")
    wl = workload_from_input(str(SAMPLE), model)
    for name, tps in (("h100", (8, 4)), ("cpu", (1, 1))):
        cfg = compose([*base, f"pools.hardware={name}"])
        _, choice = choose_pools(cfg, list_shards(cfg.job.input), 24)
        want = plan(model, hardware(name), wl, workers=4, rows_in_flight=cfg.job.batch_rows,
                    prefill_tp=tps[0], decode_tp=tps[1])
        assert choice.mode == want.recommendation, name
        d = choice.options["disaggregated"]
        assert (d["prefill_tp"], d["decode_tp"]) == tps, name
        assert d["devices"] == tps[0] * d["prefill_workers"] + tps[1] * d["decode_workers"], name
        assert d["makespan_s"] == pytest.approx(want.disaggregated.makespan_s), name


def test_input_with_no_usable_row_is_refused_in_one_line(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "text": [None, None]}), d / "x.parquet")
    p = run_pipeline("+job=summarize", f"job.input={d}", "pools=auto", f"run.dir={tmp_path / 'run'}", "--dry-run")
    assert p.returncode == 2, p.stderr
    assert "pools=auto: none of the 2 rows read from job.input becomes a prompt" in p.stderr


def test_dry_run_prints_the_choice(tmp_path):
    p = run_pipeline("+job=summarize", f"job.input={SAMPLE}", "pools=auto", f"run.dir={tmp_path / 'run'}",
                     "--dry-run")
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("pools=auto: "))
    assert ("colocated x2" in line) or ("1P:1D" in line), line
    assert "from 24 of 24 rows" in p.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.e2e
def test_auto_run_saves_its_choice_and_runs_it(tmp_path, installed):
    # As a user who installed the wheel runs it: pd-pipeline from a folder outside the checkout,
    # over the sample shipped in the package (the job's default input).
    p = installed.run("+job=summarize", "pools=auto", f"run.dir={tmp_path / 'run'}", "run.progress=false",
                      "model.dtype=float32", timeout=900, empty_cache=False)
    assert p.returncode == 0, p.stderr[-2000:]
    packaged = installed.site / "pipeline" / "data" / "sample"
    assert f"input: {packaged}" in (tmp_path / "run" / "config.yaml").read_text()
    for shard in sorted(SAMPLE.glob("*.parquet")):
        got = pq.read_table(tmp_path / "run" / "output" / shard.name)
        assert got.column("id").to_pylist() == pq.read_table(shard).column("id").to_pylist()
        assert got.column("error").null_count == got.num_rows
    choice = json.loads((tmp_path / "run" / "pools.json").read_text())
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert f"mode: {choice['mode']}" in saved
    roles = {f.name.split("-")[0] for f in (tmp_path / "run" / "metrics" / "workers").glob("*.parquet")}
    assert roles == ({"colocated"} if choice["mode"] == "colocated" else {"prefill", "decode"})
