"""vLLM engine arguments from the config (model.engine_kwargs, model.prefill_engine_kwargs,
model.decode_engine_kwargs, model.seed): how they are composed and merged
(pipeline.engine.build) and what is refused at start (pipeline.preflight.engine_args). No engine
starts here: the real config composition, the real AsyncEngineArgs class and vLLM's own config
validation (create_engine_config, which reads the model's config.json only)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from pipeline.config import ConfigError, compose
from pipeline.engine.build import (
    OWNED, ROLE_DEFAULTS, ROLE_SETTINGS, engine_kwargs, pipeline_engine_kwargs, role_engine_kwargs, user_engine_kwargs,
)
from pipeline.preflight.engine_args import KV_SHARED, local_model, check_engine_args
from tests.helpers import ROOT, SAMPLE, one_line_error, run_pipeline

ROLES = ("prefill", "decode", "colocated")


def _cfg(*overrides: str):
    return compose(["+job=summarize", *overrides])


def _refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        check_engine_args(_cfg(*overrides))
    return str(err.value)


@pytest.fixture(scope="module")
def engine_args_cls():
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs


# -- composition and merging ------------------------------------------------------------------------

def test_engine_kwargs_take_keys_with_and_without_plus():
    """Hydra closes dicts of a structured config (only +key adds a key); these three stay open."""
    for plus in ("", "+"):
        cfg = _cfg(f"{plus}model.engine_kwargs.max_num_seqs=8", f"{plus}model.decode_engine_kwargs.compilation_config.mode=0")
        assert cfg.model.engine_kwargs == {"max_num_seqs": 8}
        assert cfg.model.decode_engine_kwargs == {"compilation_config": {"mode": 0}}
        assert type(cfg.model.engine_kwargs) is dict and cfg.model.prefill_engine_kwargs == {}
    assert _cfg("model.prefill_engine_kwargs={max_num_batched_tokens:4096}").model.prefill_engine_kwargs == {
        "max_num_batched_tokens": 4096}
    with pytest.raises(ConfigError, match="model.bogus"):  # the schema's other keys stay closed
        _cfg("+model.bogus=1")


def test_merge_order_pool_over_shared_pipeline_last():
    cfg = _cfg("model.engine_kwargs.max_num_seqs=8", "model.engine_kwargs.enable_prefix_caching=false",
               "model.decode_engine_kwargs.max_num_seqs=2", "model.prefill_engine_kwargs.enable_prefix_caching=true",
               "model.prefill_chunk_tokens=512", "model.decode_kv_blocks=64", "model.seed=7", "model.dtype=float32")
    prefill, decode, colocated = (engine_kwargs(cfg, role, "/m") for role in ROLES)
    assert (prefill["max_num_seqs"], prefill["enable_prefix_caching"], prefill["max_num_batched_tokens"]) == (8, True, 512)
    assert (decode["max_num_seqs"], decode["enable_prefix_caching"], decode["num_gpu_blocks_override"]) == (2, False, 64)
    # colocated engines take model.engine_kwargs only, and neither pool's own setting
    assert (colocated["max_num_seqs"], colocated["enable_prefix_caching"]) == (8, False)
    assert "max_num_batched_tokens" not in colocated and "num_gpu_blocks_override" not in colocated
    for kw in (prefill, decode, colocated):
        assert (kw["seed"], kw["dtype"], kw["model"], kw["disable_log_stats"]) == (7, "float32", "/m", True)
    assert user_engine_kwargs(cfg, "decode")["max_num_seqs"] == (2, "model.decode_engine_kwargs")
    assert user_engine_kwargs(cfg, "colocated")["max_num_seqs"] == (8, "model.engine_kwargs")


def test_owned_arguments_come_last_even_unchecked():
    """Were a config to skip the checks at start, the pipeline's own arguments still win."""
    cfg = _cfg("model.max_model_len=1024")
    cfg.model.engine_kwargs.update(max_model_len=99, seed=5, disable_log_stats=False)
    kw = engine_kwargs(cfg, "decode", "/m")
    assert (kw["max_model_len"], kw["seed"], kw["disable_log_stats"]) == (1024, 0, True)


def test_prefill_engines_schedule_in_step_unless_asked():
    """A prefill engine's finished request leaves at the end of its own step (async scheduling
    off, pipeline.engine.build.ROLE_DEFAULTS); a user's value wins except with the DRAM tier."""
    assert engine_kwargs(_cfg(), "prefill", "/m")["async_scheduling"] is False
    for role in ("decode", "colocated"):
        assert "async_scheduling" not in engine_kwargs(_cfg(), role, "/m")
    asked = _cfg("+model.prefill_engine_kwargs.async_scheduling=true")
    assert engine_kwargs(asked, "prefill", "/m")["async_scheduling"] is True
    check_engine_args(asked)


def test_nixl_progress_delay_is_20_ms_on_a_cpu_1_ms_on_a_gpu_unless_set(monkeypatch):
    """NIXL's progress thread waits 20 ms per poll() by default on this CPU machine (its wake-ups
    share the forward pass's core), 1 ms on a GPU, and what transport.nixl_progress_delay_us says
    when set, for both pools' connectors. The GPU is a stand-in (``_on_cpu`` returning False):
    there is none here."""
    import pipeline.engine.build as build

    def delay(*overrides: str, role: str = "decode") -> int:
        return build.kv_transfer_config(_cfg(*overrides), role).kv_connector_extra_config["progress_delay_us"]

    assert delay(role="prefill") == delay(role="decode") == 20_000
    assert delay("offload=dram", "model.max_model_len=32768") == 20_000
    assert delay("transport.nixl_progress_delay_us=0") == 0
    assert delay("transport.nixl_progress_delay_us=1000", role="prefill") == 1000
    monkeypatch.setattr(build, "_on_cpu", lambda: False)
    assert build.progress_delay_us(_cfg()) == 1000
    assert build.progress_delay_us(_cfg("transport.nixl_progress_delay_us=5000")) == 5000


def test_seed_defaults_to_zero_as_before():
    for role in ROLES:
        assert pipeline_engine_kwargs(_cfg(), role)["seed"] == 0


def test_every_argument_the_pipeline_sets_is_owned_or_a_role_setting(engine_args_cls):
    """A field build_engine sets must be refused in the dicts (OWNED) or checked against its
    setting (ROLE_SETTINGS); otherwise a user's value would be overridden without a word."""
    fields = {f.name for f in dataclasses.fields(engine_args_cls)}
    cfg = _cfg("offload=dram", "model.prefill_chunk_tokens=512", "model.decode_kv_blocks=64", "model.block_size=32")
    for role in ROLES:
        assert set(pipeline_engine_kwargs(cfg, role)) <= set(OWNED)
        assert set(role_engine_kwargs(cfg, role)) <= set(ROLE_SETTINGS[role])
    assert {"model", "kv_transfer_config"} <= set(OWNED)
    # Real fields of this vLLM (a rename in an upgrade fails here, not silently).
    names = set(OWNED) | set(KV_SHARED) | {k for r in (*ROLE_SETTINGS.values(), *ROLE_DEFAULTS.values()) for k in r}
    assert names <= fields, names - fields


def test_merged_arguments_build_real_engine_args(engine_args_cls):
    cfg = _cfg("model.engine_kwargs.max_num_seqs=8", "model.decode_engine_kwargs.max_num_seqs=2", "model.seed=3")
    args = engine_args_cls(**engine_kwargs(cfg, "decode", "/m"))
    assert (args.max_num_seqs, args.seed, args.model) == (2, 3, "/m")


# -- refused at start --------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, expected", [
    (["model.engine_kwargs.max_num_seq=8"], "model.engine_kwargs.max_num_seq: not a vLLM engine argument"
                                            " (a field of AsyncEngineArgs); did you mean max_num_seqs"),
    (["model.decode_engine_kwargs.kv_cahce_dtype=fp8"], "did you mean kv_cache_dtype"),
    (["model.engine_kwargs._api_process_count=2"], "model.engine_kwargs._api_process_count: not a vLLM engine argument"),
    (["model.engine_kwargs.kv_transfer_config={}"], "model.engine_kwargs.kv_transfer_config: set by the pipeline; transport="),
    (["model.decode_engine_kwargs.tensor_parallel_size=2"], "set by the pipeline; use model.prefill_tp / model.decode_tp"),
    (["model.prefill_engine_kwargs.max_model_len=99"], "set by the pipeline; use model.max_model_len"),
    (["model.engine_kwargs.dtype=float16"], "set by the pipeline; use model.dtype"),
    (["model.engine_kwargs.seed=3"], "model.engine_kwargs.seed: set by the pipeline; use model.seed"),
    (["model.engine_kwargs.block_size=32"], "use model.block_size"),
    (["model.engine_kwargs.disable_log_stats=false"], "RUN_DIR/metrics/workers"),
    (["model.engine_kwargs.max_num_seqs=abc"], "model.engine_kwargs.max_num_seqs: vLLM refuses 'abc' for max_num_seqs: "
                                               "Input should be a valid integer"),
    (["model.engine_kwargs.max_num_seqs=2.5"], "vLLM refuses 2.5 for max_num_seqs"),
    (["model.prefill_engine_kwargs.enable_prefix_caching=[1]"], "vLLM refuses [1] for enable_prefix_caching"),
    (["model.engine_kwargs.kv_cache_dtype=fp9"], "vLLM refuses 'fp9' for kv_cache_dtype: Input should be 'auto'"),
    (["model.engine_kwargs.compilation_config.bogus=1"], "for compilation_config: bogus: Unexpected keyword argument"),
    # prefill and decode must agree on the KV layout
    (["model.prefill_engine_kwargs.kv_cache_dtype=fp8"],
     "model.prefill_engine_kwargs.kv_cache_dtype='fp8' and the decode engines' kv_cache_dtype (unset: vLLM's default "
     "'auto') differ: prefill and decode must agree on the KV cache's element type"),
    (["model.engine_kwargs.kv_cache_dtype=fp8", "model.decode_engine_kwargs.kv_cache_dtype=auto"],
     "model.engine_kwargs.kv_cache_dtype='fp8' and model.decode_engine_kwargs.kv_cache_dtype='auto' differ"),
    (["model.decode_engine_kwargs.quantization=fp8"], "must agree on the weights that compute the KV"),
    (["offload=dram", "model.engine_kwargs.kv_cache_dtype=fp8"],
     "model.engine_kwargs.kv_cache_dtype='fp8': the DRAM tier (offload=dram) sizes its slots from model.dtype"),
    # a pool's own setting against the same field in the dicts
    (["model.prefill_chunk_tokens=512", "model.prefill_engine_kwargs.max_num_batched_tokens=1024"],
     "model.prefill_engine_kwargs.max_num_batched_tokens=1024 conflicts with model.prefill_chunk_tokens, which sets "
     "the prefill engines' max_num_batched_tokens to 512: keep one"),
    (["model.prefill_chunk_tokens=512", "model.engine_kwargs.max_num_batched_tokens=1024"],
     "model.engine_kwargs.max_num_batched_tokens=1024 conflicts with model.prefill_chunk_tokens"),
    (["model.decode_kv_blocks=64", "model.decode_engine_kwargs.num_gpu_blocks_override=32"],
     "conflicts with model.decode_kv_blocks"),
    (["offload=dram", "model.prefill_engine_kwargs.async_scheduling=true"], "conflicts with offload=dram"),
])
def test_refused_with_the_setting_named(overrides, expected):
    assert expected in _refused(*overrides)


@pytest.mark.parametrize("overrides", [
    [],
    ["model.engine_kwargs.max_num_seqs=8", "model.decode_engine_kwargs.max_num_seqs=2",
     "model.engine_kwargs.enable_prefix_caching=false", "model.prefill_engine_kwargs.enable_prefix_caching=true"],
    ["model.engine_kwargs.kv_cache_dtype=fp8"],  # the same on both pools
    ["model.prefill_engine_kwargs.kv_cache_dtype=fp8", "pools=colocated"],  # colocated: engine_kwargs only
    ["model.prefill_chunk_tokens=512", "model.prefill_engine_kwargs.max_num_batched_tokens=512"],  # same value
    ["model.prefill_chunk_tokens=512", "model.decode_engine_kwargs.max_num_batched_tokens=4096"],  # another pool
    ["offload=dram", "model.prefill_engine_kwargs.async_scheduling=false", "model.decode_engine_kwargs.async_scheduling=true"],
    ["model.engine_kwargs.max_num_seqs=null", "model.decode_engine_kwargs.compilation_config.mode=0"],
])
def test_accepted(overrides):
    check_engine_args(_cfg(*overrides))


def test_vllm_own_validation_refuses_what_an_engine_would():
    """Values of the right type that vLLM's configs refuse (create_engine_config, no engine)."""
    cfg = _cfg()
    if local_model(cfg) is None:
        pytest.skip("the bundled model is not converted here (python -m pipeline converts it on a first run)")
    line = _refused("model.engine_kwargs.max_num_seqs=0")
    assert line.startswith("model.engine_kwargs / model.prefill_engine_kwargs: vLLM refuses the prefill engines' "
                           "arguments:") and "max_num_seqs: Input should be greater than or equal to 1" in line, line
    line = _refused("model.decode_engine_kwargs.max_num_seqs=64", "model.decode_engine_kwargs.max_num_batched_tokens=32")
    assert "vLLM refuses the decode engines' arguments" in line
    assert "max_num_batched_tokens (32) must be greater than or equal to max_num_seqs (64)" in line, line
    line = _refused("pools=colocated", "model.engine_kwargs.max_num_seqs=0")
    assert line.startswith("model.engine_kwargs: vLLM refuses the colocated engines' arguments"), line


def test_environment_is_left_as_it_was():
    """vLLM's import and config validation set LD_PRELOAD and others; workers must not inherit them."""
    before = dict(os.environ)
    check_engine_args(_cfg("model.engine_kwargs.max_num_seqs=8"))
    with pytest.raises(ConfigError):
        check_engine_args(_cfg("model.engine_kwargs.max_num_seqs=0", "model.engine_kwargs.kv_cache_dtype=fp8"))
    assert dict(os.environ) == before


def test_nothing_set_imports_nothing_from_vllm():
    code = ("import sys; from pipeline.config import compose; from pipeline.preflight.engine_args import "
            "check_engine_args; check_engine_args(compose(['+job=summarize'])); "
            "assert not [m for m in sys.modules if m.startswith('vllm')]")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]


def test_without_vllm_the_pipeline_own_checks_still_run():
    """A host where vLLM does not import (a login node): owned fields and agreement are still
    refused; names and values are left to the engines."""
    code = ("import sys; sys.modules['vllm'] = None\n"
            "from pipeline.config import compose, ConfigError\n"
            "from pipeline.preflight.engine_args import check_engine_args\n"
            "for ov in (['model.engine_kwargs.seed=1'], ['model.prefill_engine_kwargs.kv_cache_dtype=fp8'], "
            "['model.engine_kwargs.max_num_seq=8']):\n"
            "    try: check_engine_args(compose(['+job=summarize', *ov])); print('accepted')\n"
            "    except ConfigError as e: print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = p.stdout.splitlines()[-3:]
    assert p.returncode == 0 and lines[0] == "model.engine_kwargs.seed: set by the pipeline; use model.seed", p
    assert lines[1].startswith("model.prefill_engine_kwargs.kv_cache_dtype='fp8' and the decode engines'"), lines
    assert lines[2] == "accepted", lines


def test_command_line_refusal_is_one_line_exit_2(tmp_path):
    """Through python -m pipeline: vLLM's import says nothing on stderr; nothing is started."""
    line = one_line_error(run_pipeline("+job=summarize", "run.progress=false", f"job.input={SAMPLE}",
                                        f"run.dir={tmp_path / 'run'}", "model.decode_engine_kwargs.max_num_seq=2"))
    assert line == ("error: model.decode_engine_kwargs.max_num_seq: not a vLLM engine argument (a field of "
                    "AsyncEngineArgs); did you mean max_num_seqs or max_num_active_seqs or max_num_queued_reqs?"), line
    assert not (tmp_path / "run").exists()


def test_vllm_refusing_the_pipeline_own_arguments_is_said(caplog):
    """model.max_model_len past the model's own context (8192): vLLM refuses even the pipeline's
    own arguments, so it cannot check the user's (max_num_seqs=0, which it refuses above). The
    run is not refused for it, but a warning names the setting left unchecked and vLLM's error,
    compared here with vLLM's own refusal of that length asked directly."""
    import logging

    cfg = _cfg("model.max_model_len=100000", "model.engine_kwargs.max_num_seqs=0")
    model = local_model(cfg)
    if model is None:
        pytest.skip("the bundled model is not converted here (python -m pipeline converts it on a first run)")
    from vllm.engine.arg_utils import AsyncEngineArgs

    with pytest.raises(Exception) as refused:
        AsyncEngineArgs(model=model, max_model_len=100000).create_engine_config()
    vllm_says = refused.value.errors()[0]["msg"]
    assert "max_model_len (100000)" in vllm_says
    caplog.set_level(logging.WARNING, "pipeline.preflight.engine_args")
    check_engine_args(cfg)
    said = [r.getMessage() for r in caplog.records if r.name == "pipeline.preflight.engine_args"]
    assert len(said) == 1, said  # one warning for both pools: the same error
    assert said[0].startswith("model.engine_kwargs: not checked by vLLM's own validation here"), said
    assert "for the prefill and decode engines" in said[0] and vllm_says in said[0], said
    caplog.clear()
    check_engine_args(_cfg("model.engine_kwargs.max_num_seqs=8"))  # checked: nothing to say
    assert [r for r in caplog.records if r.name == "pipeline.preflight.engine_args"] == []
