"""Pool shapes refused at start (pipeline.preflight.layout), without an engine: TP sizes the
model's heads do not allow, and TP or block sizes vLLM's NIXL connector cannot carry between the
pools with the transport chosen. The head counts are SmolLM2-135M's (its config.json: 9
attention heads, 3 KV heads) unless a test says otherwise; the rules are vLLM 0.32's, quoted in
the module's docstring."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError, compose
from pipeline.preflight.layout import check_pool_layouts
from tests.helpers import SAMPLE, refused

SMOLLM2 = {"num_attention_heads": 9, "num_key_value_heads": 3}
PULL, PUSH = "transport=nixl_pull", "transport=nixl_push"


def _check(*overrides: str, hf=SMOLLM2) -> None:
    check_pool_layouts(compose(["+job=summarize", *overrides]), hf)


@pytest.mark.parametrize("overrides", [
    # TP sizes SmolLM2 allows (1, 3, 9), in both directions where the builder takes them
    ("model.prefill_tp=3",), ("model.decode_tp=3",), ("model.prefill_tp=3", "model.decode_tp=9"),
    (PUSH, "model.prefill_tp=9"),
    # block sizes: on GPU workers pull READs whole prefill blocks into larger decode blocks
    (PULL, "cluster.gpus_per_task=1", "model.prefill_block_size=16", "model.decode_block_size=32"),
    (PULL, "cluster.gpus_per_task=1", "model.block_size=16", "model.decode_block_size=64"),  # prefill falls back
    (PUSH, "model.prefill_block_size=64", "model.decode_block_size=64"),
    ("pools=colocated", "model.block_size=64"),
    # the DRAM tier with TP on CPU workers: each rank its own heads' bytes of a block
    ("offload=dram", "model.prefill_tp=3"), ("offload=dram", "model.decode_tp=3"),
])
def test_shapes_the_connector_carries_are_accepted(overrides):
    _check(*overrides)


@pytest.mark.parametrize("overrides,words", [
    (("model.prefill_tp=2",), ["model.prefill_tp=2", "9 attention heads and 3 KV heads",
                               "TP sizes that work here: 1, 3, 9"]),
    (("pools=colocated", "model.prefill_tp=4"), ["model.prefill_tp=4", "TP sizes that work here"]),
    # the decode pool READs (pull) from prefill ranks whose KV heads are replicated (9 > 3)
    ((PULL, "model.prefill_tp=9"), ["model.prefill_tp=9 and model.decode_tp=1",
                                    "above the model's 3 KV heads", "lower model.prefill_tp=9 to at most 3"]),
    # the prefill pool WRITEs (push) into decode ranks whose KV heads are replicated
    ((PUSH, "model.prefill_tp=3", "model.decode_tp=9"), ["the decode pool's TP is larger than the prefill pool's"]),
    ((PULL, "cluster.gpus_per_task=1", "model.prefill_block_size=32", "model.decode_block_size=16"),
     ["model.prefill_block_size=32 and model.decode_block_size=16", "NixlConnector (decode READs)",
      "the decode block size must be a multiple of the prefill one", "swap them"]),
    ((PULL, "cluster.gpus_per_task=1", "model.prefill_block_size=32", "model.decode_block_size=48"),
     ["must be a multiple"]),
    # vLLM's push connector asserts on both sides: seen here as the decode engine dying at the
    # first request ("Local block size 128 is not divisible by remote block size 256")
    ((PUSH, "model.prefill_block_size=256", "model.decode_block_size=128"),
     ["NixlPushConnector (prefill WRITEs)", "the pools need the same block size"]),
    ((PUSH, "cluster.gpus_per_task=1", "model.prefill_block_size=16", "model.decode_block_size=32"),
     ["the pools need the same block size"]),
    # on CPU the connector takes these, and every row came out wrong (module doc): refused
    ((PULL, "model.prefill_block_size=64", "model.decode_block_size=128"),
     ["on CPU workers the pools need the same block size", "scrambled"]),
    # only one side set: the other is vLLM's CPU default, named as such
    ((PULL, "model.prefill_block_size=256"), ["vLLM's default block size 128 (decode)"]),
    (("offload=dram", "model.prefill_block_size=64", "model.decode_block_size=128"),
     ["the DRAM tier (offload=dram) holds the KV in blocks of one size"]),
    (("model.block_size=16",), ["model.block_size=16 (prefill)", "multiple of 32"]),
])
def test_shapes_vllm_cannot_run_are_refused_naming_both_settings(overrides, words):
    with pytest.raises(ConfigError) as err:
        _check(*overrides)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_tp_sizes_that_are_not_multiples_of_each_other_are_refused():
    # A model of 12 heads (12 KV heads) takes TP 4 and TP 6 each, but a rank of the TP-6 pool
    # would need KV heads from parts of two ranks of the TP-4 pool.
    hf = {"num_attention_heads": 12, "num_key_value_heads": 12}
    _check("model.prefill_tp=4", "model.decode_tp=4", hf=hf)
    with pytest.raises(ConfigError, match="the larger TP size must be a multiple of the smaller"):
        _check("model.prefill_tp=4", "model.decode_tp=6", hf=hf)


def test_gpu_workers_take_block_sizes_the_cpu_kernel_does_not():
    _check("model.block_size=16", "cluster.gpus_per_task=1")


def test_the_command_refuses_at_start_in_one_line():
    line = refused(f"job.input={SAMPLE}", "model.prefill_tp=2", "--dry-run")
    assert "model.prefill_tp=2" in line and "9 attention heads and 3 KV heads" in line, line


def test_a_workers_cores_are_dealt_out_among_its_tp_ranks():
    """VLLM_CPU_OMP_THREADS_BIND of an engine of TP n: one core list per rank, joined by '|'
    (vLLM's CPU worker asserts there is one per local rank: 'Given number of CPU id list ['0']
    doesn't match local world size 3' was the error of a TP-3 engine given one list)."""
    from pipeline.engine.env import omp_bind

    assert omp_bind("0,1", 1) == "0,1"
    assert omp_bind("0", 3) == "0|0|0"
    assert omp_bind("0,1", 3) == "0|1|0"
    assert omp_bind("0-3", 2) == "0,1|2,3"
    assert omp_bind("0-4", 2) == "0,1,2|3,4"
    assert omp_bind("4,6-8", 3) == "4,6|7|8"


def test_one_core_list_per_worker_cycles_over_the_workers(tmp_path):
    """cluster.prefill_cpus / decode_cpus "0;1": worker i on the i-th list, cycled (how the
    elastic bench puts 4 workers of any xP:yD split two to a core on the 2-core test Slurm); the
    local launcher hands each worker its own (submitit's jobs, read back), and a malformed list
    is a ConfigError naming the key."""
    from pipeline.engine.env import worker_cpus
    from pipeline.launch.local import _task_starter

    assert [worker_cpus("0;1", i) for i in range(5)] == ["0", "1", "0", "1", "0"]
    assert worker_cpus("0,1", 3) == "0,1" and worker_cpus(None, 2) is None
    assert worker_cpus("2-3;0;1", 4) == "0"

    cfg = compose(["+job=summarize", "pools=colocated", "pools.prefill=3", "cluster.prefill_cpus='1;0'"])
    submitted = []

    class Ex:  # records what would start: the local executor would start an engine per worker
        def submit(self, fn, *args):
            submitted.append(args)

    start = _task_starter(cfg, type("Run", (), {"path": tmp_path})(), Ex())
    for i in range(3):
        start(i)
    assert [a[1] for a in submitted] == ["1", "0", "1"]
    with pytest.raises(ConfigError, match="cluster.decode_cpus"):
        compose(["+job=summarize", "cluster.decode_cpus='0;;1'"])


@pytest.mark.parametrize("overrides,words", [
    (("offload=dram", "model.prefill_tp=3", "cluster.gpus_per_task=1"),
     ["model.prefill_tp=3 and model.decode_tp=1 with the DRAM tier", "heads innermost", "offload=none"]),
    (("offload=dram", "model.prefill_tp=9"), ["above the model's 3 KV heads", "at most 3"]),
])
def test_dram_tier_shapes_it_cannot_hold_are_refused(overrides, words):
    with pytest.raises(ConfigError) as e:
        _check(*overrides)
    for w in words:
        assert w in str(e.value), str(e.value)
