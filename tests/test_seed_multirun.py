"""``model.seed`` (vLLM's engine seed) and a real Hydra multirun, on real engines: one sweep
``-m model.seed=3,4`` of a disaggregated run (1P:1D) over one sampled row without a per-row
seed, each point its own run directory and output. Checked against the independent source,
vLLM's own ``LLM.generate`` with ``seed=3`` on the same prompt and sampling: point 0 draws the
same tokens; point 1 (seed 4) draws others, so the seed reached the engine that samples (decode).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import COMMON, ROOT, run_pipeline

pytestmark = pytest.mark.e2e

TEXT = "Write one line about the sea at night."
SAMPLING = ["job.sampling.temperature=1.0", "job.sampling.max_new_tokens=16", "job.prompt_template='{text}'"]

# vLLM's offline API in its own process, with the engine settings a colocated engine of this
# config gets (dtype, context, seed ...), on the row's text in the model's chat template (what
# job.prompt_template='{text}' renders): the prompt's tokens and the sampled output tokens.
VLLM = """
import json, os, sys
from pipeline.config import compose
from pipeline.engine.build import engine_kwargs
from pipeline.engine.env import engine_env
from pipeline.engine.model import load_tokenizer, model_path

cfg = compose(json.loads(sys.argv[1]))
os.environ.update(engine_env(cfg, cpus=None, side_channel=None))
from vllm import LLM, SamplingParams, TokensPrompt

ids = load_tokenizer(cfg).apply_chat_template([{"role": "user", "content": sys.argv[2]}],
                                              add_generation_prompt=True, tokenize=True)
ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
llm = LLM(**engine_kwargs(cfg, "colocated", model_path(cfg)))
s = cfg.job.sampling
(out,) = llm.generate([TokensPrompt(prompt_token_ids=ids)],
                      SamplingParams(temperature=s.temperature, max_tokens=s.max_new_tokens))
print("RESULT " + json.dumps({"prompt": len(ids), "tokens": list(out.outputs[0].token_ids)}))
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    base = tmp_path_factory.mktemp("seed-sweep")
    (base / "input").mkdir()
    pq.write_table(pa.table({"id": ["sea"], "text": [TEXT]}), base / "input" / "sea.parquet")
    p = run_pipeline(*COMMON, "-m", "model.seed=3,4", "pools=disaggregated", *SAMPLING,
                     f"job.input={base / 'input'}", f"run.dir={base / 'runs'}", timeout=1200)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr[-4000:]}"
    return base, p


@pytest.fixture(scope="module")
def vllm_seed_3():
    overrides = [*COMMON, "model.seed=3", "pools=colocated", *SAMPLING]
    p = subprocess.run([sys.executable, "-c", VLLM, json.dumps(overrides), TEXT], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.split("RESULT ", 1)[1].splitlines()[0])


def test_multirun_runs_each_point_in_its_own_run_dir(sweep):
    base, p = sweep
    assert "== multirun: 2 points, 2 ok" in p.stdout, p.stdout
    for point, seed in ((0, 3), (1, 4)):
        assert f"== point {point}: model.seed={seed} | run dir {base / 'runs' / str(point)}" in p.stdout, p.stdout
        saved = (base / "runs" / str(point) / "config.yaml").read_text()
        assert f"seed: {seed}\n" in saved
        (row,) = pq.read_table(base / "runs" / str(point) / "output" / "sea.parquet").to_pylist()
        assert row["error"] is None and row["decode_worker"] and row["kv_tokens"] > 0


def test_model_seed_sets_the_engines_random_state(sweep, vllm_seed_3):
    base, _ = sweep
    rows = [pq.read_table(base / "runs" / str(point) / "output" / "sea.parquet").to_pylist()[0] for point in (0, 1)]
    assert rows[0]["prompt_tokens"] == vllm_seed_3["prompt"]
    assert rows[0]["generation_token_ids"] == vllm_seed_3["tokens"]
    assert rows[1]["generation_token_ids"] != rows[0]["generation_token_ids"]
