"""Settings fit for the model and the hardware, and where each came from (issue #38, section 3;
the Slurm parts of issue #41, section 3): a model of one's own takes its context from its own
``config.json`` (cut on CPU workers to what one engine's KV cache holds), eager on CPU workers
and CUDA graphs on GPU workers; the bundled model keeps its preset; a setting the user gives
always wins; ``--dry-run`` prints each pool's resolved settings with their origin, names the
places Slurm's nodes may not see, and prints the sbatch options of each job it would submit.
No engine starts; figures are counted by hand from the model's config.

The model is a small Llama made here with random weights: 2 layers, 4 attention heads, 2 KV
heads of head dim 16, a context of 2048 tokens (``max_position_embeddings``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import compose
from pipeline.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 2048
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 16
BF16 = 2  # bytes
BLOCK_CPU = 128  # vLLM's default KV block on CPU (tokens)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from pipeline.engine.model import load_tokenizer

    folder = tmp_path_factory.mktemp("own") / "my-llama"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=KV_HEADS, max_position_embeddings=CONTEXT,
                         tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder)
    load_tokenizer(compose(["+job=summarize"])).save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["head_dim"] == HEAD_DIM
    return folder


def _plan(tmp_path: Path, *overrides: str):
    return preflight(compose(["+job=summarize", f"job.input={ROOT / 'data' / 'sample'}",
                              f"run.dir={tmp_path / 'run'}", *overrides]))


def _settings(plan, role: str) -> dict[str, tuple[str, str]]:
    return {s.name: (s.value, s.origin) for s in plan.engines[role]}


def test_own_model_takes_its_context_and_the_bundled_model_keeps_its_preset(model, tmp_path):
    own = _plan(tmp_path, f"model.path={model}")
    assert own.cfg.model.max_model_len == CONTEXT
    assert own.cfg.model.name == "my-llama"  # from the folder, not the bundled preset's name
    for role in ("prefill", "decode"):
        s = _settings(own, role)
        assert s["max_model_len"] == (f"{CONTEXT} tokens", "model: config.json max_position_embeddings"), s
        assert s["eager"] == ("yes", "default on CPU workers"), s
        assert s["TP"] == ("1", "default") and s["block size"] == ("128 tokens", "vLLM's default on CPU"), s
    # The bundled model keeps its preset's context and eager mode.
    bundled = _plan(tmp_path)
    s = _settings(bundled, "decode")
    assert s["max_model_len"] == ("4096 tokens", "preset") and s["eager"] == ("yes", "preset"), s


def test_on_cpu_the_context_is_cut_to_what_one_kv_cache_holds(model, tmp_path):
    # 0.0002 GiB a rank / (128 tokens x 2 (K, V) x 2 layers x 2 KV heads x 16 x 2 bytes) = 6 blocks;
    # vLLM keeps one back: 5 x 128 = 640 tokens.
    per_block = BLOCK_CPU * 2 * LAYERS * KV_HEADS * HEAD_DIM * BF16
    blocks = int(0.0002 * 2**30 // per_block)
    assert (blocks - 1) * BLOCK_CPU == 640
    plan = _plan(tmp_path, f"model.path={model}", "model.kv_cache_gib=0.0002")
    assert plan.cfg.model.max_model_len == 640
    s = _settings(plan, "prefill")
    assert s["max_model_len"][1].startswith(f"model: config.json max_position_embeddings {CONTEXT}, cut to"), s
    assert s["KV cache"] == ("0.0002 GiB a rank: 6 blocks, 640 tokens", "user"), s
    # With TP 2 on decode each rank holds half the KV heads: 13 blocks a rank, and prefill's 640 still decides.
    plan = _plan(tmp_path, f"model.path={model}", "model.kv_cache_gib=0.0002", "model.decode_tp=2")
    assert plan.cfg.model.max_model_len == 640
    assert _settings(plan, "decode")["KV cache"][0] == f"0.0002 GiB a rank: 13 blocks, {12 * BLOCK_CPU:,} tokens"


def test_a_setting_the_user_gives_wins(model, tmp_path):
    plan = _plan(tmp_path, f"model.path={model}", "model.max_model_len=1000", "model.enforce_eager=false",
                 "model.decode_tp=2")
    assert plan.cfg.model.max_model_len == 1000
    s = _settings(plan, "decode")
    assert s["max_model_len"] == ("1000 tokens", "user") and s["eager"] == ("no (CUDA graphs)", "user"), s
    assert s["TP"] == ("2", "user"), s
    # model=own picked by hand is the same as model.path alone; a model option of one's own wins over it.
    assert _plan(tmp_path, "model=own", f"model.path={model}").cfg.model.max_model_len == CONTEXT
    assert _plan(tmp_path, "model=smollm2-135m", f"model.path={model}").cfg.model.max_model_len == 4096


def test_gpu_workers_get_cuda_graphs_and_vllms_memory_share(model, tmp_path):
    """cluster=slurm-h100 (gpus_per_task: 1) stands in for GPU workers (none here): nothing
    starts, only the settings a GPU run would get are resolved. The KV cache there is vLLM's to
    size from the device, so the context is the model's own."""
    plan = _plan(tmp_path, f"model.path={model}", "cluster=slurm-h100", "model.kv_cache_gib=0.0002")
    assert plan.cfg.model.max_model_len == CONTEXT
    s = _settings(plan, "decode")
    assert s["eager"] == ("no (CUDA graphs)", "default on GPU workers"), s
    assert s["KV cache"][0].startswith("what 0.9 of each GPU's memory") and s["block size"][0] == "16 tokens", s
    s = _settings(_plan(tmp_path, f"model.path={model}", "cluster=slurm-h100", "model.gpu_memory_utilization=0.5"),
                  "prefill")
    assert s["KV cache"][0].startswith("what 0.5 of") and s["KV cache"][1] == "user", s


def _mount_type(path: str) -> str:
    """The file system type of the mount holding ``path``, read from /proc/mounts here."""
    best = ("", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, fstype = line.split()[:3]
        if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[0]):
            best = (mount, fstype)
    return best[1]


def test_on_slurm_a_model_on_a_local_file_system_is_named_at_start(model, tmp_path):
    shm = Path("/dev/shm") / f"pd-model-{os.getpid()}"
    assert _mount_type("/dev/shm") == "tmpfs"  # local to this machine
    shutil.copytree(model, shm)  # a copy: a link would lead back to this file system
    try:
        plan = _plan(tmp_path, f"model.path={shm}", "cluster=slurm")
        (warning,) = plan.warnings
        assert f"the model {shm} is on a local file system (tmpfs at /dev/shm)" in warning, warning
        plan = _plan(tmp_path, f"model.path={shm}", "cluster=slurm",
                     f"cluster.shared_paths=[/dev/shm,{sys.prefix},{tmp_path}]")
        assert plan.warnings == []
        # The test Slurm's nodes are namespaces of this machine: they see its files.
        assert _plan(tmp_path, f"model.path={shm}", "cluster=slurm-test").warnings == []
        # Locally nothing is named.
        assert _plan(tmp_path, f"model.path={shm}").warnings == []
    finally:
        shutil.rmtree(shm)


def test_dry_run_prints_the_settings_and_each_slurm_jobs_sbatch_options(model, tmp_path):
    p = subprocess.run([sys.executable, "-m", "pipeline", "+job=summarize", f"job.input={ROOT / 'data' / 'sample'}",
                        f"run.dir={tmp_path / 'run'}", f"model.path={model}", "cluster=slurm-test-nodes",
                        "pools.prefill=2", "pools.decode=3", "cluster.decode_ranks_per_node=2", "model.decode_tp=2",
                        "cluster.max_array_size=2", "cluster.shards_per_task=1", "--dry-run"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"  decode: TP 2 (user) | max_model_len {CONTEXT} tokens (model: config.json max_position_embeddings)" in out
    jobs = dict(re.findall(r"^  ((?:decode ranks|prefill array tasks) [\d-]+): (.*)$", out, re.M))
    # 3 decode ranks, 2 a node: two jobs; 3 shards, 1 a task: 3 array tasks in chunks of at most 2.
    assert list(jobs) == ["decode ranks 0-1", "decode ranks 2-2", "prefill array tasks 0-1", "prefill array tasks 2-2"], out
    assert "--ntasks-per-node=2" in jobs["decode ranks 0-1"] and "--ntasks-per-node=1" in jobs["decode ranks 2-2"]
    for job in ("decode ranks 0-1", "decode ranks 2-2"):
        assert "--partition=decode" in jobs[job] and "--time=30" in jobs[job] and "--mem=8192M" in jobs[job]
    assert "--array=0-1%2" in jobs["prefill array tasks 0-1"] and "--array=0-0%1" in jobs["prefill array tasks 2-2"]
    assert "--partition=prefill" in jobs["prefill array tasks 0-1"]
    assert "--dependency=after:JOBID:JOBID " in jobs["prefill array tasks 0-1"] + " "
    assert "--dependency=after:JOBID:JOBID,afterany:JOBID" in jobs["prefill array tasks 2-2"]
    assert not (tmp_path / "run").exists()  # a dry run writes nothing
