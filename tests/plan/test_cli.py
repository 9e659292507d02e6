"""``python -m pipeline.plan`` (pipeline/plan/cli.py): JSON and readable output, DRAM-tier options
and one-line errors, checked against hand computations and published figures."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.helpers import ROOT


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
    assert dis["prefill_tp"] == dis["decode_tp"] == 4
    assert dis["devices"] == 4 * (dis["prefill_workers"] + dis["decode_workers"])
    assert dis["prefill_s"] == pytest.approx(0.6118, rel=1e-3)
    assert dis["prefill_workers"] == 2
    # Colocated, by hand: w workers prefill at rho = 2.0 x 0.6118 / w, so w = 2 (rho = 0.6118 <=
    # 0.75); the gaps stretch by 1 / (1 - 0.6118) = 2.5762. A decode step at TP 4 reads the
    # weights, 141.2e9 B / (4 x 3.35e12 x 0.7 B/s) = 0.015053 s, plus per sequence its KV,
    # 327,680 B x (8192 + 256 / 2) tokens / 9.38e12 B/s = 2.9065e-4 s (compute, 8.1e-5 s per
    # sequence, is the smaller branch). Little's law: r = 2.0 / 2 x 256 x 2.5762 = 659.5, n =
    # r x 0.015053 / (1 - r x 2.9065e-4) = 12.283 sequences; step = 0.015053 + 12.283 x
    # 2.9065e-4 = 0.018623 s; ITL = 0.018623 x 2.5762 = 0.047977 s. Worst case ITL + p99 prefill
    # = 0.018623 + 0.6118 = 0.6305 s > the 0.1 s target (rule 1 does not hold), and prefills
    # land in 2.0 / 2 x 0.047977 = 4.80% of a worker's gaps >= 1% (nor does rule 2): disaggregated.
    colo = out["colocated"]
    assert colo["prefill_workers"] == 2 and colo["running"] == pytest.approx(12.283, rel=1e-3)
    assert colo["itl_s"] == pytest.approx(0.047977, rel=1e-3)
    assert colo["itl_worst_s"] == pytest.approx(0.6305, rel=1e-3)
    assert colo["stall_fraction"] == pytest.approx(0.047977, rel=1e-3)
    assert out["recommendation"] == "disaggregated"
    assert out["overrides"].startswith("pools=disaggregated pools.prefill=2 pools.decode=")
    assert "model.prefill_tp=4 model.decode_tp=4" in out["overrides"]


def test_cli_each_pool_its_own_tp_and_every_device_priced():
    """--prefill-tp 8 --decode-tp 4 on the case above, by hand: the prefill of 8192 tokens takes
    1.21024e15 FLOPs / (8 x 989e12 x 0.5) = 0.3059 s (twice as fast as at TP 4); x = ceil(2.0 x
    0.3059 / 0.75) = 1. The KV of a prompt, 8192 x 327,680 B = 2.684e9 B, moves over min(8, 4) =
    4 links of 50 GB/s (each decode device takes its KV heads from two prefill devices over its
    own link): 0.01342 s. A decode worker is 4 devices, as before, so the decode side is
    unchanged. The cost counts each pool's devices: x x 8 + y x 4 at 2.0 per device-hour."""
    p = _cli("--model", "llama-3.1-70b", "--hardware", "h100", "--prompt-tokens", "8192",
             "--output-tokens", "256", "--rate", "2.0", "--prefill-tp", "8", "--decode-tp", "4",
             "--device-hour-price", "2.0", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    dis, colo = out["disaggregated"], out["colocated"]
    assert (dis["prefill_tp"], dis["decode_tp"]) == (8, 4)
    assert dis["prefill_s"] == pytest.approx(0.3059, rel=1e-3)
    assert dis["prefill_workers"] == 1
    assert dis["kv_transfer_s"] == pytest.approx(8192 * 327_680 / (4 * 50e9), rel=1e-3)
    same = json.loads(_cli("--model", "llama-3.1-70b", "--hardware", "h100", "--prompt-tokens", "8192",
                           "--output-tokens", "256", "--rate", "2.0", "--tp", "4", "--json").stdout)["disaggregated"]
    assert (dis["decode_workers"], dis["itl_s"]) == (same["decode_workers"], pytest.approx(same["itl_s"]))
    assert dis["devices"] == 8 * dis["prefill_workers"] + 4 * dis["decode_workers"]
    assert colo["prefill_tp"] == colo["decode_tp"] == 8 and colo["devices"] == 8 * colo["prefill_workers"]
    costs = {c["option"]: c for c in out["costs"]}
    d = costs[f"disaggregated {dis['prefill_workers']}P:{dis['decode_workers']}D"]
    assert (d["prefill_devices"], d["decode_devices"]) == (8 * dis["prefill_workers"], 4 * dis["decode_workers"])
    assert d["price_per_hour"] == pytest.approx(2.0 * dis["devices"])
    # Colocated at TP 8, by hand as in the test above: one worker prefills at rho = 2.0 x 0.3059 =
    # 0.6118 (stretch 2.5762); its step reads the weights in 141.2e9 / (8 x 3.35e12 x 0.7) =
    # 0.0075267 s plus 1.45325e-4 s per sequence; r = 2.0 x 256 x 2.5762 = 1319.0, n = r x
    # 0.0075267 / (1 - r x 1.45325e-4) = 12.283, step = 0.0093116 s, ITL = 0.023990 s. Worst
    # case 0.0093116 + 0.3059 = 0.3152 s > 0.1 s, and prefills land in 2.0 x 0.023990 = 4.80% of
    # the gaps: disaggregated, with each pool's TP in its overrides.
    assert colo["prefill_workers"] == 1 and colo["itl_s"] == pytest.approx(0.023990, rel=1e-3)
    assert colo["itl_worst_s"] == pytest.approx(0.3152, rel=1e-3)
    assert colo["stall_fraction"] == pytest.approx(0.047980, rel=1e-3)
    assert out["recommendation"] == "disaggregated"
    assert "model.prefill_tp=8 model.decode_tp=4" in out["overrides"]


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


def test_cli_dram_tier_llama_70b_128k_on_h200():
    # The worked example of docs/long-contexts.md. Llama-3.1-70B: 327,680 B/token; a request of 130,048 prompt +
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
    # A request holds its prompt's KV in DRAM from before its prefill (queue 30.11 s + prefill
    # 20.21 s, the split's own prediction) through the push (0.21307 s), the wait for a slot and
    # its slot (W) to the end of its decode. Little's law: 0.2 x that = 17.76 requests.
    dis = out["disaggregated"]
    hold = dis["queue_wait_s"] + dis["prefill_s"] + 0.21307 + wq + w
    assert d["hold_s"] == pytest.approx(hold, rel=1e-4)
    assert d["upstream"] == pytest.approx(0.2 * (dis["queue_wait_s"] + dis["prefill_s"] + 0.21307), rel=1e-4)
    assert d["decoding"] == pytest.approx(a, rel=1e-4)
    staged = 0.2 * hold
    assert d["staged"] == pytest.approx(staged, rel=1e-4)
    assert 17.7 < staged < 17.8
    # ceil(1.2 x 17.76) = 22 requests x 42,614,128,640 B (prompt KV) = 873.1 GiB per worker; 2
    # workers per 8-GPU node: 1,746 GiB of 2 TiB.
    assert d["sized_requests"] == math.ceil(1.2 * staged) == 22
    assert d["worker_bytes"] == 22 * 42_614_128_640 and d["node_bytes"] == 2 * 22 * 42_614_128_640
    assert d["prefill_hold_s"] == pytest.approx(0.21307, abs=1e-5)
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
    # Any DRAM option turns the section on: headroom 1.5 -> ceil(1.5 x 17.7) = 27 requests x 39.69
    # GiB = 1,072 GiB per worker, 2,143 GiB per node, over a 200 GiB node; 110 GB/s halves the
    # load: 42.61e9 B / 440e9 B/s = 96.85 ms.
    p = _cli(*args, "--dram-headroom", "1.5", "--node-dram", "200", "--h2d-bw", "110")
    assert p.returncode == 0, p.stderr
    assert "DRAM tier" in p.stdout and "= 27 requests = 1072 GiB of prompt KV per worker; 2143 GiB per decode node" in p.stdout
    assert "does NOT fit" in p.stdout and "= 96.9 ms =" in p.stdout
    bad = _cli(*args, "--h2d-bw", "0")
    assert bad.returncode == 2 and "--h2d-bw must be > 0" in bad.stderr


def test_cli_help_describes_the_planner():
    p = _cli("--help")
    assert p.returncode == 0, p.stderr
    assert "The xP:yD planner: size the prefill and decode pools" in p.stdout
    assert "--dram-tier" in p.stdout and "issue" not in p.stdout


def test_cli_prices_each_option_per_million_output_tokens():
    args = ["--model", "llama-3.1-70b", "--hardware", "h100", "--prompt-tokens", "8192",
            "--output-tokens", "256", "--rate", "2.0"]
    plain = _cli(*args)
    assert "cost:" not in plain.stdout and "costs" not in json.loads(_cli(*args, "--json").stdout)
    priced = [*args, "--device-hour-price", "3.5", "--prefill-device-hour-price", "4"]
    out = json.loads(_cli(*priced, "--json").stdout)
    # 2 req/s x 256 = 512 output tokens/s for both options (a rate is served as it comes).
    # 2P:1D of 4 devices each: 8 prefill devices x 4 + 4 decode devices x 3.5 (the general price)
    # = 46/hour -> 46 / (512 x 3600) x 1e6 = 24.957 per million. Colocated x2: 8 devices x 3.5 =
    # 28/hour -> 15.191.
    dis, colo = out["costs"]
    assert (out["disaggregated"]["prefill_workers"], out["disaggregated"]["decode_workers"]) == (2, 1)
    assert (dis["prefill_devices"], dis["decode_devices"], dis["price_per_hour"]) == (8, 4, 46.0)
    assert dis["per_million_output_tokens"] == pytest.approx(46 / (512 * 3600) * 1e6) == pytest.approx(24.957, abs=1e-3)
    assert (colo["option"], colo["price_per_hour"]) == ("colocated x2", 28.0)
    assert colo["per_million_output_tokens"] == pytest.approx(15.191, abs=1e-3)
    text = _cli(*priced).stdout
    assert ("cost: disaggregated 2P:1D: 8 prefill + 4 decode devices, 46/hour at 512 output tokens/s "
            "= 25 per million output tokens") in text
    assert "cost: colocated x2: 8 devices, 28/hour at 512 output tokens/s = 15.2 per million output tokens" in text
    assert text.index("recommendation:") < text.index("cost:") < text.index("overrides:")
    # Everything the plain report printed is still there.
    assert all(line in text.splitlines() for line in plain.stdout.splitlines())


def test_cli_kv_cache_dtype_fp8_halves_kv_and_says_so():
    args = ["--model", "llama-3.1-70b", "--hardware", "h100", "--prompt-tokens", "8192",
            "--output-tokens", "256", "--rate", "2.0"]
    auto = json.loads(_cli(*args, "--json").stdout)
    fp8 = json.loads(_cli(*args, "--kv-cache-dtype", "fp8", "--json").stdout)
    # 327,680 B -> 163,840 B per token; 8192 x 163,840 B / (4 x 50e9 B/s) = 6.71 ms (bf16: 13.42 ms).
    assert (auto["kv_bytes_per_token"], fp8["kv_bytes_per_token"]) == (327_680, 163_840)
    assert fp8["disaggregated"]["kv_transfer_s"] == pytest.approx(8192 * 163_840 / 200e9)
    assert fp8["disaggregated"]["kv_transfer_s"] == pytest.approx(auto["disaggregated"]["kv_transfer_s"] / 2)
    assert fp8["model"]["kv_cache_dtype"] == "fp8" and fp8["model"]["dtype"] == "bfloat16"
    text = _cli(*args, "--kv-cache-dtype", "fp8_e5m2").stdout
    assert "KV cache   160 KiB/token (KV cache dtype fp8_e5m2 = float8_e5m2, 1 byte per element)" in text
    assert "320 KiB/token (KV cache dtype auto = bfloat16, 2 bytes per element)" in _cli(*args).stdout
    # The DRAM tier's sizing follows: (130,048 + 1,024) tokens x 163,840 B = 20 GiB per request.
    dram = json.loads(_cli("--model", "llama-3.1-70b", "--hardware", "h200", "--prompt-tokens", "130048",
                           "--output-tokens", "1024", "--rate", "1.0", "--dram-tier", "--kv-cache-dtype", "fp8",
                           "--json").stdout)
    assert dram["dram_tier"]["request_bytes"] == 20 * 2**30
    bad = _cli(*args, "--kv-cache-dtype", "int3")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "KV cache dtype 'int3'" in bad.stderr


def test_cli_batch_rows_default_and_option():
    args = ["--model", "llama-3.1-8b", "--hardware", "h100", "--prompt-tokens", "2000",
            "--output-tokens", "256", "--count", "1000", "--workers", "4"]
    # Default: the pipeline's job.batch_rows, 16 rows in flight per worker, so colocated x4
    # decodes at most 16 sequences at a time (not 128, vLLM's max_num_seqs).
    out = json.loads(_cli(*args, "--json").stdout)
    assert out["colocated"]["rows_in_flight"] == 16 and out["colocated"]["running"] == 16
    wide = json.loads(_cli(*args, "--batch-rows", "128", "--json").stdout)
    assert wide["colocated"]["running"] == 128
    assert wide["colocated"]["makespan_s"] < out["colocated"]["makespan_s"]
    text = _cli(*args).stdout
    assert "TTFT p50" in text and "note: 16 rows in flight per prefill or colocated worker" in text
    bad = _cli(*args, "--batch-rows", "0")
    assert bad.returncode == 2 and "--batch-rows must be >= 1" in bad.stderr


def test_cli_tp_given_for_a_model_past_eight_devices(tmp_path):
    """Where every pool's TP is given, the planner does not ask auto_tp (which refuses a model
    whose weights need more than 8 devices): Llama-3.1-70B's config with 4 times the layers
    (about 4 x 141 GB of bf16 weights, more than half of 8 x 80 GB x 0.9) on h100 at TP 16."""
    from pipeline.plan.model import MODEL_PRESETS

    cfg = dict(MODEL_PRESETS["llama-3.1-70b"])
    cfg["num_hidden_layers"] *= 4
    cfg["params"] *= 4
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    args = ["--model", str(tmp_path / "config.json"), "--hardware", "h100", "--prompt-tokens", "8192",
            "--output-tokens", "256", "--rate", "0.5", "--json"]
    refused = _cli(*args)
    assert refused.returncode == 2 and "devices per worker" in refused.stderr, refused.stderr
    for tp in (["--tp", "16"], ["--prefill-tp", "16", "--decode-tp", "16"]):
        p = _cli(*args, *tp)
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert out["disaggregated"]["prefill_tp"] == out["disaggregated"]["decode_tp"] == 16


def test_a_disaggregated_recommendation_says_elastic_pools_make_it_a_starting_point():
    """Issue #40: the readable plan of the case above (disaggregated, by hand in
    test_cli_json_llama_70b_on_h100) says that with pools.elastic=true the split is a starting
    point the pools rebalance from; a colocated recommendation says nothing of it."""
    p = _cli("--model", "llama-3.1-70b", "--hardware", "h100", "--prompt-tokens", "8192",
             "--output-tokens", "256", "--rate", "2.0")
    assert p.returncode == 0, p.stderr
    assert "recommendation: disaggregated" in p.stdout
    assert ("note: a split is the plan's guess from prompts and max output lengths; with pools.elastic=true the "
            "pipeline takes it as a starting point and rebalances at run time") in p.stdout
    p = _cli("--model", "smollm2-135m", "--hardware", "cpu", "--prompt-tokens", "200", "--output-tokens", "64",
             "--count", "24")
    assert p.returncode == 0, p.stderr
    assert "recommendation: colocated" in p.stdout and "pools.elastic" not in p.stdout
