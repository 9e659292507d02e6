"""``pools=auto`` (pipeline.plan.auto): the local-prefill threshold against a hand calculation on
the toy model, the input sample against the planner's own reading of a dataset
(``workload_from_input``, written separately), the choice and the dry run's line against
makespans worked out by hand for that workload. No engine starts."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import compose
from pipeline.io.sample import sample_prompt_lengths
from pipeline.plan.auto import choose_pools, local_prefill_threshold
from tests.helpers import SAMPLE, run_pipeline
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


# The sample on the cpu profile, by hand (pipeline.plan's formulas written out for this case):
# SmolLM2-135M in bf16 as the planner reads it: N = 134,479,872 - 49,152 x 576 = 106,168,320
# non-embedding parameters, 30 layers, attention width 9 x 64 = 576, weights 268,959,744 B, KV
# 2 x 30 x 3 x 64 x 2 = 23,040 B per token. The cpu profile: 1.6e11 FLOP/s x MFU 0.5 = 8e10
# FLOP/s, 1e10 B/s x MBU 0.25 = 2.5e9 B/s, links of 1e8 B/s, a 1 GiB KV cache, batches of 128.
N_SMOLLM2, ATTN, LAYERS, WEIGHTS, KV = 106_168_320, 576, 30, 268_959_744, 23_040
NEW_TOKENS = 48  # the summarize job's max_new_tokens


def _by_hand(prompts: list[int]) -> dict[str, float]:
    """Makespans (s) of a batch of ``prompts`` on the cpu profile, each prompt ``NEW_TOKENS`` out.

    A prompt of p tokens prefills in S(p) = (2 N p + 2 x 30 x p^2 x 576) / 8e10 s; S is their
    mean. A decode step of n sequences of c = mean prompt + 48 / 2 tokens reads the weights and
    their KV: 268,959,744 / 2.5e9 + n x 23,040 x c / 2.5e9 s (the compute branch, n x (2 x
    134,479,872 + 4 x 30 x c x 576) / 8e10, is smaller below n = 176). At most 128 run (1 GiB
    holds 1,073,741,824 / (23,040 x c) = 145 of them).
    """
    s = sum((2 * N_SMOLLM2 * p + 2 * LAYERS * p * p * ATTN) / 8e10 for p in prompts) / len(prompts)
    c = sum(prompts) / len(prompts) + NEW_TOKENS / 2
    def step(n: float) -> float:
        return WEIGHTS / 2.5e9 + n * KV * c / 2.5e9
    handoff = KV * sum(prompts) / len(prompts) / 1e8  # the mean prompt's KV over one link
    count = len(prompts)
    return {
        "s": s, "step_0": step(0),
        # w colocated workers: each prefills its count / w prompts, then decodes all of them at
        # once (n = count / w <= batch_rows 16): w S x ... = (count / w) S + 48 step(count / w).
        "colocated x4": count / 4 * s + NEW_TOKENS * step(count / 4),
        "colocated x2": count / 2 * s + NEW_TOKENS * step(count / 2),
        # 3P:1D: each prefill worker serves 8 prompts, all in flight (8 <= 16); the decode worker
        # runs all 24 (Little's law at 3 / S requests/s would want 39, more than the 24 there
        # are), so the last hand-off comes at 8 S + its transfer and decodes in 48 step(24).
        "3P:1D": count / 3 * s + handoff + NEW_TOKENS * step(count),
    }


def test_choice_on_the_sample_is_worked_out_by_hand():
    """pools=auto over the sample with 4 workers on the cpu profile: colocated x4 finishes in 6 S
    + 48 step(6) = 11.0 s. Every split of 4 takes longer: 3P:1D 8 S + hand-off + 48 step(24) =
    15.3 s (the planner's best split), 2P:2D at least 12 S + 48 step(0) = 15.1 s, 1P:3D at least
    its prefills, 24 S = 19.9 s. So colocated, 4 workers."""
    from pipeline.io.shards import list_shards
    from pipeline.plan.model import load_model
    from pipeline.plan.workload import workload_from_input

    cfg = compose(["+job=summarize", f"job.input={SAMPLE}", "pools=auto", "pools.prefill=2", "pools.decode=2",
                   "pools.hardware=cpu"])
    assert cfg.job.batch_rows >= 8 and cfg.job.sampling.max_new_tokens == NEW_TOKENS  # the setting above
    resolved, choice = choose_pools(cfg, list_shards(cfg.job.input), 24)
    # The prompt lengths are the input's (the tokenizer's count, checked against pools=auto's own
    # reading in test_sample_renders_prompts_as_the_planner_reads_a_dataset); the rest is by hand.
    hand = _by_hand(workload_from_input(str(SAMPLE), load_model("smollm2-135m")).prompt_tokens)
    assert hand["colocated x4"] == pytest.approx(11.0, abs=0.1)
    assert min(hand["3P:1D"], 12 * hand["s"] + NEW_TOKENS * hand["step_0"], 24 * hand["s"]) > hand["colocated x4"] + 4
    assert resolved.pools.mode == choice.mode == "colocated"
    assert resolved.pools.prefill == 4
    colo, dis = choice.options["colocated"], choice.options["disaggregated"]
    assert (colo["prefill_workers"], colo["makespan_s"]) == (4, pytest.approx(hand["colocated x4"], rel=1e-6))
    assert (dis["prefill_workers"], dis["decode_workers"]) == (3, 1)
    assert dis["makespan_s"] == pytest.approx(hand["3P:1D"], rel=1e-6)
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
    # On cpu the TP 8 / 4 settings change nothing: the TP 1 answer worked out by hand.
    hand = _by_hand(wl.prompt_tokens)
    assert choice.mode == "colocated" and d["makespan_s"] == pytest.approx(hand["3P:1D"], rel=1e-6)
    assert choice.options["colocated"]["makespan_s"] == pytest.approx(hand["colocated x4"], rel=1e-6)


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
    # The job's default pools (1 + 1 workers) on this machine's profile (cpu), by hand
    # (_by_hand): colocated x2 finishes in 12 S + 48 step(12) = 16.8 s; 1P:1D cannot beat its
    # one prefill worker's 24 prompts, 24 S = 19.9 s.
    from pipeline.plan.model import load_model
    from pipeline.plan.workload import workload_from_input

    hand = _by_hand(workload_from_input(str(SAMPLE), load_model("smollm2-135m")).prompt_tokens)
    assert hand["colocated x2"] == pytest.approx(16.8, abs=0.1) and 24 * hand["s"] > hand["colocated x2"] + 2
    assert line.startswith(f"pools=auto: colocated x2; batch job: only the makespan counts, and colocated x2 "
                           f"finishes in {hand['colocated x2']:.3g} s"), line
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
    # The end summary sets the chosen layout's predicted makespan against the measured one, first
    # row read to last token (counted here from the request metrics), as the planner counts it.
    from pipeline.io.metrics import read_request_metrics

    m = read_request_metrics(tmp_path / "run").to_pydict()
    measured = max(t[-1] for t in m["token_times"] if t) - min(x for x in m["read_at"] if x is not None)
    predicted = choice["options"][choice["mode"]]["makespan_s"]
    layout = (f"{choice['prefill']}P:{choice['decode']}D" + (f", local < {choice['local_prefill_tokens']}"
                                                              if choice.get("local_prefill_tokens") else "")
              if choice["mode"] == "disaggregated" else f"colocated x{choice['prefill']}")
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith(f"pools=auto chose {layout}: "))
    said = [float(x) for x in re.findall(r"([\d.]+) s\b", line)]
    assert said[0] == pytest.approx(predicted, abs=0.5) and said[1] == pytest.approx(measured, abs=0.5), line
    ratio = float(re.search(r"([\d.]+)x the prediction", line)[1])
    assert ratio == pytest.approx(measured / predicted, abs=0.02), line
