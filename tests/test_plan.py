"""The xP:yD planner (pipeline/plan.py), each number checked against a hand computation written
in the test or a published figure; no vLLM engine."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline import plan as P

ROOT = Path(__file__).resolve().parents[1]

# A toy model and machine with round numbers, so every result below can be worked by hand.
#   KV bytes/token = 2 x 5 layers x 1 KV head x 10 head dim x 2 bytes = 200 B
#   weights        = 5e6 params x 2 bytes = 1e7 B; no vocabulary, so N = params = 5e6
#   prefill FLOPs of a 1000-token prompt = 2 N L + 2 n_layer L^2 d_attn
#                  = 2 x 5e6 x 1000 + 2 x 5 x 1000^2 x 10 = 1e10 + 1e8 = 1.01e10
#   at 1.01e10 FLOP/s (MFU 1): S = 1.0 s
#   decode step, memory branch: (1e7 + n x 200 x c) / 1e8 B/s, c = 1000 + 100/2 = 1050 tokens
#                  = 0.1 s + 0.0021 s x n
#   compute branch: n x (2 x 5e6 + 4 x 5 x 1050 x 10) / 1.01e10 = 0.00101 s x n (never larger)
#   hand-off: 200 B x 1000 tokens = 2e5 B over 1e8 B/s = 2 ms
TOY = P.ModelShape(name="toy", layers=5, hidden=10, heads=1, kv_heads=1, head_dim=10, vocab=0,
                   params=5e6, dtype="bfloat16")
TOY_HW = P.Hardware("toy", peak_flops=1.01e10, mem_bw=1e8, memory_bytes=1e9, link_bw=1e8,
                    mfu=1.0, mbu=1.0, kv_cache_bytes=1e7, max_batch=24)


def toy_load(rate=None, count=None):
    return P.workload(1000, 100, rate=rate, count=count)


# ------------------------------------------------------------------------- KV and model shapes

def test_llama_70b_kv_per_token_prompt_and_transfer_match_published_figures():
    m = P.load_model("llama-3.1-70b")
    # 2 x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 B = 320 KiB (DESIGN.md, vLLM docs).
    assert m.kv_bytes_per_token == 327_680 == 320 * 1024
    # 8,192 tokens x 320 KiB = 2,560 MiB = 2.5 GiB.
    nbytes = 8192 * m.kv_bytes_per_token
    assert nbytes == pytest.approx(2.5 * 2**30, rel=1e-12)
    # 2.684e9 B / 50e9 B/s = 53.7 ms ("about 54 ms at 50 GB/s").
    assert P.kv_transfer_time(nbytes, P.hardware("h100")) == pytest.approx(0.054, abs=0.001)
    # tp devices send their shards over their own links: 4 x 50 GB/s.
    assert P.kv_transfer_time(nbytes, P.hardware("h100"), tp=4) == pytest.approx(0.0537 / 4, rel=0.01)


def test_parameter_counts_from_config_match_published_sizes():
    # Llama-3.1-70B: 80 x (8192 x (64 + 16) x 128 + 64 x 128 x 8192 + 3 x 8192 x 28672)
    #   + 2 x 128256 x 8192 = 80 x 855,638,016 + 2,101,346,304 = 70.55e9 (published 70.6B).
    cfg70 = {k: v for k, v in P.MODEL_PRESETS["llama-3.1-70b"].items() if k != "params"}
    assert P.count_params(cfg70) == 80 * 855_638_016 + 2_101_346_304
    assert P.count_params(cfg70) == pytest.approx(70.6e9, rel=0.002)
    cfg8 = {k: v for k, v in P.MODEL_PRESETS["llama-3.1-8b"].items() if k != "params"}
    assert P.count_params(cfg8) == pytest.approx(8.03e9, rel=0.002)


def test_model_from_a_config_json_directory(tmp_path):
    # SmolLM2-135M's config.json (the shipped model's shape).
    cfg = {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
           "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = P.load_model(str(tmp_path))
    # KV: 2 x 30 x 3 x 64 x 2 = 23,040 B/token.
    assert m.kv_bytes_per_token == 23_040
    # 30 x (576 x 15 x 64 + 576 x 576 + 3 x 576 x 1536) + 49152 x 576 (tied)
    #   = 30 x 3,538,944 + 28,311,552 = 134,479,872 (published: 135M).
    assert m.params == 134_479_872
    assert m.flop_params == 134_479_872 - 28_311_552
    with pytest.raises(ValueError, match="unknown model"):
        P.load_model(str(tmp_path / "missing"))


# ------------------------------------------------------------------------- queueing, Little's law

def test_md1_wait_hand_computed():
    # rho = 0.5, S = 2 s: mu = 0.5 /s, Wq = rho / (2 mu (1 - rho)) = 0.5 / (2 x 0.5 x 0.5) = 1.0 s.
    assert P.md1_wait(0.5, 2.0) == pytest.approx(1.0)
    # rho = 0.75, S = 1 s: Wq = 0.75 / (2 x 1 x 0.25) = 1.5 s.
    assert P.md1_wait(0.75, 1.0) == pytest.approx(1.5)
    # M/G/1 (Pollaczek-Khinchine), services 1 s and 3 s, 0.25 req/s: E[S] = 2, E[S^2] = 5,
    # rho = 0.5, Wq = 0.25 x 5 / (2 x 0.5) = 1.25 s; equal services reduce to M/D/1.
    assert P.mg1_wait(0.25, [1.0, 3.0]) == pytest.approx(1.25)
    assert P.mg1_wait(0.75, [1.0]) == pytest.approx(P.md1_wait(0.75, 1.0))
    with pytest.raises(ValueError, match="overloaded"):
        P.md1_wait(1.0, 1.0)
    with pytest.raises(ValueError, match="overloaded"):
        P.mg1_wait(0.5, [1.0, 3.0])


def test_prefill_time_hand_computed():
    assert P.prefill_flops(TOY, 1000) == pytest.approx(1.01e10)
    assert P.prefill_time(TOY, TOY_HW, 1000) == pytest.approx(1.0)
    assert P.prefill_time(TOY, TOY_HW, 1000, tp=2) == pytest.approx(0.5)


def test_decode_concurrency_is_the_littles_law_fixed_point():
    # 1.5 req/s x 100 tokens = r = 150 tokens/s; n = r x ITL(n) = 150 x (0.1 + 0.0021 n)
    # -> n = 15 / (1 - 0.315) = 21.8978; ITL = 0.1 + 0.0021 x 21.8978 = 0.145985 s.
    n, itl = P.decode_concurrency(TOY, TOY_HW, 1.5, 100, 1050)
    assert n == pytest.approx(15 / 0.685)
    assert itl == pytest.approx(0.1 + 0.0021 * 15 / 0.685)
    assert n == pytest.approx(1.5 * 100 * itl)  # Little: N = lambda x W
    assert P.decode_step_time(TOY, TOY_HW, n, 1050) == pytest.approx(itl)
    # r x 0.0021 >= 1 (r = 500 tokens/s): more KV to read per token than the worker can: overloaded.
    with pytest.raises(ValueError, match="overloaded"):
        P.decode_concurrency(TOY, TOY_HW, 5.0, 100, 1050)


def test_predict_rate_hand_computed_and_overload_messages():
    wl = toy_load(rate=1.5)
    p = P.predict(TOY, TOY_HW, wl, "disaggregated", prefill=2, decode=2)
    # per prefill worker 0.75 req/s, S = 1 s: rho = 0.75, Wq = 1.5 s; TTFT = 1.5 + 1 + 0.002 s.
    assert p.prefill_util == pytest.approx(0.75)
    assert p.ttft_s == pytest.approx(2.502)
    # per decode worker r = 75 tokens/s: n = 7.5 / (1 - 0.1575) = 8.9021, ITL = 0.118694 s;
    # decode utilisation = n / max batch 24 = 0.3709 (KV: 8.9 x 210 kB / 10 MB = 0.19).
    assert p.running == pytest.approx(7.5 / 0.8425)
    assert p.itl_s == pytest.approx(0.1 + 0.0021 * 7.5 / 0.8425)
    assert p.decode_util == pytest.approx(7.5 / 0.8425 / 24)
    # 1 prefill worker at 1.5 req/s x 1 s: rho = 1.5 -> needs at least 2.
    with pytest.raises(ValueError, match=r"prefill pool overloaded.*at least 2"):
        P.predict(TOY, TOY_HW, wl, "disaggregated", prefill=1, decode=2)
    # 3 req/s on 1 decode worker: r = 300, n = 30 / 0.37 = 81 > 24 sequences; 2 workers:
    # n = 21.9 <= 24 -> needs at least 2.
    with pytest.raises(ValueError, match=r"decode pool overloaded.*at least 2"):
        P.predict(TOY, TOY_HW, toy_load(rate=3.0), "disaggregated", prefill=4, decode=1)


# ------------------------------------------------------------------------- the split and the choice

def test_xp_yd_split_hand_worked():
    # 1.5 req/s, target 0.75:
    #  x = ceil(1.5 x 1 s / 0.75) = 2;
    #  y = 1: n = 21.90 -> 21.90 / 24 = 0.91 > 0.75; y = 2: n = 8.90 -> 0.37 <= 0.75 -> 2P:2D.
    #  colocated: 2 workers: rho = 0.75, gaps x4, r = 0.75 x 100 x 4 = 300 -> n = 81 > 24;
    #  3 workers: rho = 0.5, r = 0.5 x 100 x 2 = 100 -> n = 10 / 0.79 = 12.66 -> 0.53 -> x3.
    #  colocated step = 0.1 + 0.0021 x 12.66 = 0.12658 s, mean ITL 2 x that, worst + S = 1.12658 s;
    #  prefills land in 0.5 req/s x 0.25316 s = 12.7% of gaps.
    result = P.plan(TOY, TOY_HW, toy_load(rate=1.5), target_util=0.75, itl_target_s=0.5)
    d, c = result.disaggregated, result.colocated
    assert (d.prefill_workers, d.decode_workers) == (2, 2)
    assert c.prefill_workers == 3
    step = 0.1 + 0.0021 * 10 / 0.79
    assert c.itl_s == pytest.approx(2 * step)
    assert c.itl_worst_s == pytest.approx(step + 1.0)
    assert c.stall_fraction == pytest.approx(0.5 * 2 * step)
    # worst case 1.127 s > 0.5 s target, in 12.7% of gaps: disaggregate.
    assert result.recommendation == "disaggregated"
    assert result.overrides == "pools=disaggregated pools.prefill=2 pools.decode=2"


def test_recommendation_flips_with_itl_target_and_with_load():
    # Same load, a 2 s ITL target: the colocated worst case (1.127 s) fits -> colocated x3.
    loose = P.plan(TOY, TOY_HW, toy_load(rate=1.5), itl_target_s=2.0)
    assert loose.recommendation == "colocated"
    assert loose.overrides == "pools=colocated pools.prefill=3"
    # The flip sits at the worst case itself.
    step = 0.1 + 0.0021 * 10 / 0.79
    assert P.plan(TOY, TOY_HW, toy_load(rate=1.5), itl_target_s=step + 1.0 - 1e-6).recommendation == "disaggregated"
    assert P.plan(TOY, TOY_HW, toy_load(rate=1.5), itl_target_s=step + 1.0 + 1e-6).recommendation == "colocated"
    # 0.01 req/s with the 0.5 s target: worst case 1.1 s > 0.5 s, but a prefill lands in
    # 0.01 x 0.1012 s = 0.1% of gaps (< 1%), so the p99 ITL is not stalled: one colocated worker.
    # (rho = 0.01, r = 0.01 x 100 / 0.99 = 1.0101, n = 0.10101 / (1 - 0.0021212) = 0.10122,
    #  mean ITL = (0.1 + 0.0021 x 0.10122) / 0.99 = 0.101225 s.)
    light = P.plan(TOY, TOY_HW, toy_load(rate=0.01), itl_target_s=0.5)
    assert light.recommendation == "colocated"
    assert "load too small" in light.reason
    assert light.colocated.prefill_workers == 1
    assert (light.disaggregated.prefill_workers, light.disaggregated.decode_workers) == (1, 1)
    assert light.colocated.stall_fraction == pytest.approx(0.01 * 0.101225, rel=1e-4)


def test_batch_job_makespan_hand_computed():
    # 4 requests, 2 workers, no rate.
    # 1P:1D: prefill busy 4 x 1 s = 4 s; decode runs min(24, 4) = 4 at a time:
    #   ITL = 0.1 + 0.0021 x 4 = 0.1084 s, decode busy 100 x 0.1084 = 10.84 s;
    #   makespan = max(4 + 0.002 + 10.84, 1 + 0.002 + 10.84) = 14.842 s.
    # colocated x2: 2 requests each: 2 x 1 s + 100 x (0.1 + 0.0021 x 2) = 12.42 s -> colocated.
    result = P.plan(TOY, TOY_HW, toy_load(count=4), workers=2)
    assert result.disaggregated.makespan_s == pytest.approx(14.842)
    assert result.colocated.makespan_s == pytest.approx(12.42)
    assert result.recommendation == "colocated"
    assert result.overrides == "pools=colocated pools.prefill=2"


def test_bad_inputs_raise_one_line_value_errors():
    with pytest.raises(ValueError, match="rate must be > 0"):
        P.workload(100, 10, rate=-1.0)
    with pytest.raises(ValueError, match="rate.*or a request count"):
        P.workload(100, 10)
    with pytest.raises(ValueError, match="target utilisation"):
        P.plan(TOY, TOY_HW, toy_load(rate=1.0), target_util=1.0)
    with pytest.raises(ValueError, match="unknown hardware"):
        P.hardware("tpu")
    # A KV space smaller than one request (1000 + 100 tokens x 200 B = 220 kB).
    tiny = P.Hardware("tiny", 1e10, 1e8, 1e9, 1e8, kv_cache_bytes=1e5)
    with pytest.raises(ValueError, match="less than one request"):
        P.predict(TOY, tiny, toy_load(rate=0.1))


# ------------------------------------------------------------------------- calibration

def _shard(path: Path, rows: list[dict]) -> None:
    cols = ["prompt_tokens", "output_tokens", "queue_s", "prefill_s", "ttft_s", "decode_s", "kv_handoff_s", "error"]
    types = [pa.int32(), pa.int32(), pa.float64(), pa.float64(), pa.float64(), pa.float64(), pa.float64(), pa.string()]
    pq.write_table(pa.table({c: pa.array([r.get(c) for r in rows], t) for c, t in zip(cols, types)}), path)


def test_calibrate_fits_flops_bandwidth_and_link_by_hand(tmp_path):
    # Output shards of a made-up 1P:1D run of the toy model (written here, so the fit can be
    # worked by hand; a real run's shards have the same columns).
    row = dict(prompt_tokens=1000, output_tokens=101, queue_s=0.0, prefill_s=1.0, ttft_s=1.5,
               decode_s=10.0, kv_handoff_s=0.5)
    _shard(tmp_path / "shard-00000.parquet", [row, row, {**row, "ttft_s": 6.5}])
    _shard(tmp_path / "shard-00001.parquet", [{**row, "queue_s": 0.5, "prefill_s": 2.0, "ttft_s": 2.5},
                                              {"error": "text is null", "output_tokens": 0}])
    hw = P.calibrate(tmp_path, TOY, "cpu")
    # FLOP/s: 4 prompts x 1.01e10 FLOPs over the prefill busy time: shard 0 [0, 1] (3 rows
    # together) = 1 s, shard 1 [0.5, 2.5] = 2 s -> 4.04e10 / 3 s.
    assert hw.peak_flops == pytest.approx(4.04e10 / 3)
    # Bandwidth: each row 100 steps; per step 1e7 B of weights + KV of the rows decoding with
    # it, 200 B x (1000 + 101/2) = 210,100 B each, weighted by overlap:
    #   rows A, B [1.5, 11.5]: A + B + half of D [6.5, 16.5] = 2.5 x 210,100 -> 10,525,250 B
    #   row D: half of A, half of B, itself = 2 x 210,100 -> 10,420,200 B
    #   row C (shard 1, alone): 10,210,100 B
    #   (2 x 100 x 10,525,250 + 100 x 10,420,200 + 100 x 10,210,100) B / (4 x 10 s) = 1.04202e8 B/s
    assert hw.mem_bw == pytest.approx((2 * 10_525_250 + 10_420_200 + 10_210_100) * 100 / 40)
    # Link: 4 x 200 B x 1000 tokens over hand-off busy time 0.5 s + 0.5 s = 8e5 B/s.
    assert hw.link_bw == pytest.approx(8e5)
    assert (hw.mfu, hw.mbu, hw.kv_cache_bytes) == (1.0, 1.0, P.HARDWARE["cpu"].kv_cache_bytes)
    # The run's own workload: 4 good rows, the error row left out.
    wl = P.workload_from_run(tmp_path)
    assert (wl.count, wl.mean_prompt, wl.mean_output) == (4, 1000, 101)


# ------------------------------------------------------------------------- workload from Parquet

def test_workload_from_input_tokenizes_the_sample_with_the_shipped_model():
    # The real tokenizer and the summarize job's template (about 20 s: transformers' import).
    model = P.load_model("smollm2-135m")
    assert model.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
    wl = P.workload_from_input(str(ROOT / "data" / "sample"), model)
    rows = sum(pq.read_metadata(f).num_rows for f in (ROOT / "data" / "sample").glob("*.parquet"))
    assert wl.count == rows and len(wl.prompt_tokens) == rows and wl.rate is None
    job = yaml.safe_load((ROOT / "conf" / "job" / "summarize.yaml").read_text())
    assert wl.output_tokens == (job["sampling"]["max_new_tokens"],)
    # Every prompt holds the template ("Summarize the following document in one sentence.")
    # and the chat turn markers around a non-empty text: well over 10 tokens each.
    assert min(wl.prompt_tokens) > 10


# ------------------------------------------------------------------------- command line

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.plan", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_json_llama_70b_on_h100():
    p = _cli("--model", "llama-3.1-70b", "--hardware", "h100", "--prompt-tokens", "8192",
             "--output-tokens", "256", "--rate", "2.0", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["kv_bytes_per_token"] == 327_680
    # TP: 141.2 GB of weights <= half of 4 x 80 GB x 0.9 = 144 GB (2 devices: 72 GB, too few).
    # Prefill of 8192 tokens: N = 70.6e9 - 2 x 128256 x 8192 = 68.4987e9;
    #   2 N L + 2 x 80 x L^2 x 8192 = 1.12228e15 + 8.7961e13 = 1.21024e15 FLOPs
    #   / (4 x 989e12 x 0.5) = 0.6118 s; x = ceil(2.0 x 0.6118 / 0.75) = 2.
    dis = out["disaggregated"]
    assert dis["tp"] == 4
    assert dis["prefill_s"] == pytest.approx(0.6118, rel=1e-3)
    assert dis["prefill_workers"] == 2
    assert out["recommendation"] in ("colocated", "disaggregated")
    assert out["overrides"].startswith(f"pools={out['recommendation']} pools.prefill=")
    assert "model.prefill_tp=4 model.decode_tp=4" in out["overrides"]


def test_cli_readable_output_and_one_line_errors():
    p = _cli("--model", "llama-3.1-8b", "--hardware", "h200", "--prompt-tokens", "1000,3000",
             "--output-tokens", "200", "--rate", "5")
    assert p.returncode == 0, p.stderr
    assert "recommendation:" in p.stdout and "overrides: pools=" in p.stdout
    bad = _cli("--model", "llama-3.1-8b", "--prompt-tokens", "100", "--output-tokens", "10", "--rate", "-1")
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "rate must be > 0" in bad.stderr
    assert _cli("--model", "llama-3.1-8b", "--hardware", "tpu", "--prompt-tokens", "1",
                "--output-tokens", "1", "--rate", "1").returncode == 2


# ------------------------------------------------------------------------- decode host-DRAM tier (#7)

def test_erlang_c_and_dram_full_probability_hand_computed():
    # M/M/1 (c = 1): P(wait) = rho = 0.5.
    assert P.erlang_c(1, 0.5) == pytest.approx(0.5)
    # c = 2, a = 1 erlang: (a^2/2! x c/(c-a)) / (1 + a + a^2/2! x c/(c-a)) = 1 / (1 + 1 + 1) = 1/3.
    assert P.erlang_c(2, 1.0) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="overloaded"):
        P.erlang_c(2, 2.0)
    # c = 2, a = 1, nothing in transit: P(Nq >= j) = C rho^j = (1/3) x 0.5^j.
    assert P.dram_full_probability(2, 1.0, 0.0, 1) == pytest.approx(1 / 6)
    assert P.dram_full_probability(2, 1.0, 0.0, 3) == pytest.approx(1 / 24)
    # With 0.5 requests in transit (Poisson): P(Nq + Nt >= 1) = 1 - (5/6) x 0.606531 = 0.494558.
    assert P.dram_full_probability(2, 1.0, 0.5, 1) == pytest.approx(0.494558, abs=1e-6)
    assert P.dram_full_probability(2, 1.0, 0.5, 0) == 1.0


def _dis_prediction(prefill_workers, decode_workers, *, rate, prefill_s=1.0, transfer_s=0.002,
                    itl_s=0.00999, ttft_s=5.0):
    """A disaggregated prediction of the toy model with chosen numbers (so the DRAM tier can be
    worked by hand independently of the pool model)."""
    return P.Prediction(
        mode="disaggregated", prefill_workers=prefill_workers, decode_workers=decode_workers, tp=1,
        throughput=rate or 1.0, prefill_s=prefill_s, prefill_p99_s=prefill_s, kv_bytes=2e5,
        kv_transfer_s=transfer_s, prefill_util=0.5, queue_wait_s=0.0, ttft_s=ttft_s, running=1.0,
        itl_s=itl_s, itl_worst_s=itl_s, decode_util=0.5, stall_fraction=0.0, output_tokens_per_s=100.0)


# The toy model with a host tier: KV 200 B/token, KV cache 650,000 B, host link 2e8 B/s, 2 devices
# and 1e6 B of DRAM per node. Requests of 1000 + 100 tokens:
#   whole request 200 x 1100 = 220,000 B; prompt 200 x 1000 = 200,000 B
#   slots = floor(650,000 / 220,000) = 2 at full length; floor(650,000 / 200,000) = 3 at prompt
#   length -> up to 1 swapped out
#   load = 200,000 B / 2e8 B/s = 1 ms; a slot is held 1 ms + 100 x 9.99 ms = 1.0 s
DRAM_HW = P.replace(TOY_HW, kv_cache_bytes=6.5e5, h2d_bw=2e8, node_devices=2, node_dram_bytes=1e6)


def test_dram_tier_rate_hand_computed():
    # 3 req/s over 3 decode workers: 1 req/s each; a = 1 req/s x 1.0 s = 1 erlang on c = 2 slots:
    #   Erlang C = 1/3, Wq = (1/3) x 1.0 s / (2 - 1) = 0.3333 s; waiting (Little) 1 x 0.3333 = 1/3
    #   transit (pushing 2 ms + loading 1 ms) = 1 x 0.003 = 0.003; + 1 swapped out
    #   staged = 1.336333; x 1.2 = 1.6036 -> 2 requests = 440,000 B per worker;
    #   a node holds 2 // 1 = 2 workers: 880,000 B <= 1e6 B; 3 workers -> 2 nodes.
    wl = P.workload(1000, 100, rate=3.0)
    d = P.dram_tier(TOY, DRAM_HW, wl, _dis_prediction(3, 3, rate=3.0), headroom=1.2, itl_target_s=0.1)
    assert d.request_bytes == 220_000 and d.load_bytes == 200_000
    assert (d.slots, d.admitted, d.swapped) == (2, 3, 1)
    assert d.load_s == pytest.approx(0.001)
    assert d.residence_s == pytest.approx(1.0)
    assert d.offered == pytest.approx(1.0)
    assert d.wait_probability == pytest.approx(1 / 3)
    assert d.admit_wait_s == pytest.approx(1 / 3)
    assert d.waiting == pytest.approx(1 / 3)
    assert d.transit == pytest.approx(0.003)
    assert d.staged == pytest.approx(1 / 3 + 0.003 + 1)
    assert d.sized_requests == 2
    assert d.worker_bytes == 440_000
    assert (d.workers_per_node, d.decode_nodes) == (2, 2)
    assert d.node_bytes == 880_000 and d.fits
    # Room for 2 - 1 swapped = 1 more: P(Nq + Nt >= 1) = 1 - (1 - 1/6) e^-0.003 = 0.169163.
    assert d.full_probability == pytest.approx(0.169163, abs=1e-6)
    # <= 1%: P(Nq >= 5) = (1/3) / 32 = 1.04% is too many, P(Nq >= 6) = 0.52% (+ < 0.01% from
    # transit) is enough -> room 6 + 1 swapped = 7 requests.
    assert d.sized_1pct == 7
    # The load spans 1 / 9.99 = 0.1 decode step; not overlapped, a gap of 10.99 ms; TTFT 5 s +
    # 0.3333 s + 1 ms; the host link is busy 1 req/s x 1 ms = 0.1% of the time.
    assert d.load_steps == pytest.approx(0.001 / 0.00999)
    assert d.blocking_itl_s == pytest.approx(0.01099)
    assert d.ttft_s == pytest.approx(5.0 + 1 / 3 + 0.001)
    assert d.h2d_util == pytest.approx(0.001)
    # Headroom 2: ceil(2 x 1.336333) = 3 requests; a node of 2 workers needs 1,320,000 B > 1e6 B.
    big = P.dram_tier(TOY, DRAM_HW, wl, _dis_prediction(3, 3, rate=3.0), headroom=2.0)
    assert big.sized_requests == 3 and big.node_bytes == 1_320_000
    assert not big.fits and any("exceed" in n for n in big.notes)
    # 2 req/s per worker: a = 2 erlangs on 2 slots -> unbounded backlog, reported, not sized.
    over = P.dram_tier(TOY, DRAM_HW, P.workload(1000, 100, rate=2.0), _dis_prediction(1, 1, rate=2.0))
    assert over.sized_requests is None and over.admit_wait_s == float("inf")
    assert any("overloaded" in n for n in over.notes)
    with pytest.raises(ValueError, match="headroom"):
        P.dram_tier(TOY, DRAM_HW, wl, _dis_prediction(3, 3, rate=3.0), headroom=0.5)


def test_dram_tier_batch_backlog_hand_computed():
    # 1000 requests, 1P:1D, prefill 0.1 s each -> 10 req/s for P = 100 s. With both slots busy a
    # step is 0.1 + 0.0021 x 2 = 0.1042 s (memory bound, the toy's line), so a slot is held
    # 1 ms + 100 x 0.1042 s = 10.421 s and decode completes mu = 2 / 10.421 = 0.191920 req/s.
    # Peak backlog at the end of prefill: 1000 - 2 - 0.191920 x (100 - 10.421) = 980.808;
    # + transit 10 x 3 ms = 0.03, + 1 swapped = 981.838; x 1.2 = 1178.2 -> 1179 requests.
    wl = P.workload(1000, 100, count=1000)
    d = P.dram_tier(TOY, DRAM_HW, wl, _dis_prediction(1, 1, rate=None, prefill_s=0.1), headroom=1.2)
    mu = 2 / 10.421
    assert d.rate == pytest.approx(10.0)
    assert d.itl_s == pytest.approx(0.1042)
    assert d.residence_s == pytest.approx(10.421)
    assert d.waiting == pytest.approx(998 - mu * (100 - 10.421))
    assert d.admit_wait_s == pytest.approx(d.waiting / (2 * mu))
    assert d.staged == pytest.approx(998 - mu * 89.579 + 0.03 + 1)
    assert d.sized_requests == 1179
    assert d.full_probability is None and d.sized_1pct is None
    assert any("decode is the bottleneck" in n for n in d.notes)
    # 10 requests: all prefilled in 1 s, sooner than a slot frees (10.4 s): 10 - 2 = 8 wait.
    small = P.dram_tier(TOY, DRAM_HW, P.workload(1000, 100, count=10),
                        _dis_prediction(1, 1, rate=None, prefill_s=0.1))
    assert small.waiting == pytest.approx(8.0)


def test_node_dram_from_preset_or_proc_meminfo():
    assert P.node_dram(P.hardware("h200")) == 2 * 2**40 == P.node_dram(P.hardware("h100"))
    # cpu: this machine's MemTotal; the kernel's page count says the same.
    import os
    assert P.node_dram(P.hardware("cpu")) == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_cli_dram_tier_llama_70b_128k_on_h200():
    # The README's worked example. Llama-3.1-70B: 327,680 B/token; a request of 130,048 prompt +
    # 1,024 output tokens = 131,072 tokens x 327,680 B = 42,949,672,960 B = 40 GiB exactly.
    p = _cli("--model", "llama-3.1-70b", "--hardware", "h200", "--prompt-tokens", "130048",
             "--output-tokens", "1024", "--rate", "1.0", "--dram-tier", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    d = out["dram_tier"]
    assert d["request_bytes"] == 131072 * 327680 == 40 * 2**30
    # TP 4 (as for H100: 141.2 GB <= half of 4 x 141 GB x 0.9); KV cache 4 x 141e9 x 0.9 - 141.2e9
    # = 366.4e9 B; / 42.95e9 = 8.53 -> 8 slots; / 42.61e9 (prompt) = 8.60 -> 8: none swapped.
    assert (d["tp"], d["slots"], d["swapped"]) == (4, 8, 0)
    assert d["kv_capacity_bytes"] == pytest.approx(366.4e9)
    # Load: 130,048 x 327,680 = 42,614,128,640 B / (4 x 55e9 B/s) = 193.70 ms; push 213.07 ms.
    assert d["load_s"] == pytest.approx(42_614_128_640 / 220e9)
    assert d["load_s"] == pytest.approx(0.19370, abs=1e-5)
    assert d["transfer_s"] == pytest.approx(0.21307, abs=1e-5)
    # 1 req/s over 5 decode workers: 0.2 each. Decode step (memory bound):
    #   a = 141.2e9 / (4 x 4.8e12 x 0.7) = 10.506 ms, b = 327,680 x 130,560 / 13.44e12 = 3.1832 ms;
    #   r = 0.2 x 1024 = 204.8: n = r a / (1 - r b) = 2.151619 / 0.348085 = 6.1813,
    #   ITL = 10.5060 + 3.18318 x 6.1813 = 30.182 ms.
    assert out["disaggregated"]["decode_workers"] == 5 and d["rate"] == pytest.approx(0.2)
    assert d["itl_s"] == pytest.approx(0.030182, abs=1e-6)
    # A slot is held W = 0.19370 + 1024 x ITL = 31.10 s; a = 0.2 x W = 6.22 erlangs on c = 8.
    w = 0.19370 + 1024 * d["itl_s"]
    a = 0.2 * w
    assert d["offered"] == pytest.approx(a, rel=1e-4)
    # Erlang C from its closed form: (a^c / c! x c / (c - a)) / (sum_{k<c} a^k / k! + that).
    top = a ** 8 / math.factorial(8) * 8 / (8 - a)
    c = top / (sum(a ** k / math.factorial(k) for k in range(8)) + top)
    assert 0.40 < c < 0.42
    assert d["wait_probability"] == pytest.approx(c, rel=1e-4)
    wq = c * w / (8 - a)
    assert d["admit_wait_s"] == pytest.approx(wq, rel=1e-4)
    # Little's law: waiting 0.2 x Wq (~1.43) + in transit 0.2 x (0.21307 + 0.19370) = 0.08135.
    staged = 0.2 * wq + 0.2 * (0.21307 + 0.19370)
    assert d["staged"] == pytest.approx(staged, rel=1e-4)
    assert 1.5 < staged < 1.55
    # ceil(1.2 x 1.52) = 2 requests = 80 GiB per worker; 2 workers per 8-GPU node: 160 GiB of 2 TiB.
    assert d["sized_requests"] == math.ceil(1.2 * staged) == 2
    assert d["worker_bytes"] == 80 * 2**30 and d["node_bytes"] == 160 * 2**30
    assert d["node_dram_bytes"] == 2 * 2**40 and d["fits"]
    assert (d["workers_per_node"], d["decode_nodes"]) == (2, 3)
    # The load does not fit in a decode step: 193.70 ms / 30.182 ms = 6.42 steps.
    assert d["load_steps"] == pytest.approx(0.19370 / 0.030182, rel=1e-4)
    assert d["ttft_s"] == pytest.approx(out["disaggregated"]["ttft_s"] + wq + 0.19370, rel=1e-4)


def test_cli_dram_tier_readable_options_and_errors():
    args = ["--model", "llama-3.1-70b", "--hardware", "h200", "--prompt-tokens", "130048",
            "--output-tokens", "1024", "--rate", "1.0"]
    plain = _cli(*args)
    assert plain.returncode == 0 and "DRAM tier" not in plain.stdout
    assert "dram_tier" not in json.loads(_cli(*args, "--json").stdout)
    # Any DRAM option turns the section on: headroom 1.5 -> ceil(1.5 x 1.52) = 3 requests = 120
    # GiB per worker, 240 GiB per node, over a 200 GiB node; 110 GB/s halves the load: 42.61e9 B / 440e9 B/s = 96.85 ms.
    p = _cli(*args, "--dram-headroom", "1.5", "--node-dram", "200", "--h2d-bw", "110")
    assert p.returncode == 0, p.stderr
    assert "DRAM tier" in p.stdout and "= 3 requests = 120 GiB per worker; 240 GiB per decode node" in p.stdout
    assert "does NOT fit" in p.stdout and "= 96.9 ms =" in p.stdout
    bad = _cli(*args, "--h2d-bw", "0")
    assert bad.returncode == 2 and "--h2d-bw must be > 0" in bad.stderr
