"""What can be known at start is checked at start (pipeline.preflight): each failure is one line,
exit status 2, naming the setting, before any engine or Slurm job starts. None of these tests
starts an engine: every run here is refused, a dry run, or a re-run with nothing to do."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import ConfigError, compose
from pipeline.preflight import preflight
from tests.helpers import ROOT, SAMPLE, one_line_error, refused, run_pipeline

CASES = ROOT.parent / "shared" / "cases"


def _case(tmp_path: Path, name: str) -> Path:
    """A writable copy of case ``name``'s input folder (../shared is read-only)."""
    src = CASES / name / "input"
    if not src.is_dir():
        pytest.skip(f"case {name} is not in {CASES}")
    dst = tmp_path / name / "input"
    for f in src.rglob("*"):
        if f.is_file():
            (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dst / f.relative_to(src))
    return dst


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- locations --------------------------------------------------------------------------------------

def test_output_is_or_lies_inside_the_input_is_refused_and_the_input_stays(tmp_path):
    """Case 04: job.output=job.input replaced the input file; now exit 2 and the input is untouched."""
    src = _case(tmp_path, "04-output-dir-is-input-dir")
    before = _files(src)
    run = tmp_path / "run"
    for output in (src, src / "out"):
        line = refused(f"job.input={src}", f"job.output={output}", f"run.dir={run}")
        assert "job.output" in line and "inside the input" in line, line
    # One file as input, its folder as output: the output shard would replace it.
    line = refused(f"job.input={src / 'notes.parquet'}", f"job.output={src}", f"run.dir={run}")
    assert "job.output" in line and "over the input shard" in line, line
    # run.dir inside the input is refused too (its checkpoints would become input shards).
    assert "run.dir" in refused(f"job.input={src}", f"run.dir={src / 'run'}")
    assert _files(src) == before and not run.exists()


def test_run_dir_under_a_regular_file_is_refused(tmp_path):
    """Case 05: run.dir=FILE/run was a traceback and exit 1; now one line naming run.dir."""
    src = _case(tmp_path, "05-output-not-writable")
    regular = tmp_path / "FILE"
    regular.write_text("not a folder")
    line = refused(f"job.input={src}", f"run.dir={regular / 'run'}")
    assert line.startswith("error: run.dir:") and str(regular) in line and "regular file" in line, line
    assert regular.read_text() == "not a folder"


def test_unwritable_output_is_refused_and_nothing_is_left(tmp_path):
    if os.geteuid() == 0:  # root writes through any mode bits
        output = Path("/sys/pd-pipeline-preflight-test")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        output = locked / "out"
    line = refused(f"job.input={SAMPLE}", f"job.output={output}", f"run.dir={tmp_path / 'run'}")
    assert line.startswith("error: job.output:") and "cannot create or write" in line, line
    assert not output.exists() and not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("s3fs") is not None, reason="s3fs is installed")
def test_a_scheme_without_its_fsspec_implementation_names_the_package(tmp_path):
    line = refused(f"job.input={SAMPLE}", "job.output=s3://bucket/x", f"run.dir={tmp_path / 'run'}")
    assert "job.output" in line and "s3fs" in line, line


def test_writability_marker_leaves_no_folder_behind(tmp_path):
    cfg = compose(["+job=summarize", f"run.root={tmp_path / 'outputs'}"])
    plan = preflight(cfg)
    assert not (tmp_path / "outputs").exists()
    assert plan.run_dir.parent == tmp_path / "outputs" / "summarize"
    assert plan.output == str(plan.run_dir / "output")


# -- the input schema ---------------------------------------------------------------------------

def test_input_columns_named_like_output_columns_are_refused_with_the_setting(tmp_path):
    """Case 03: the clash was found after every row had been generated; now at start."""
    src = _case(tmp_path, "03-input-has-output-columns")
    line = refused(f"job.input={src}", f"run.dir={tmp_path / 'run'}")
    assert line.startswith("error: job.input:"), line
    assert "generation, finish_reason, error" in line and "job.input_column_prefix=input_" in line, line
    assert not (tmp_path / "run").exists()
    # With a prefix the preflight accepts the input and says what the columns become.
    cfg = compose(["+job=summarize", f"job.input={src}", "job.input_column_prefix=input_",
                   f"run.dir={tmp_path / 'run'}"])
    assert preflight(cfg).renamed == {"generation": "input_generation", "finish_reason": "input_finish_reason",
                                      "error": "input_error"}
    # A prefix whose names are taken too is refused.
    pq.write_table(pa.table({"text": ["a"], "error": ["e"], "x_error": ["f"]}), tmp_path / "taken.parquet")
    cfg = compose(["+job=summarize", f"job.input={tmp_path / 'taken.parquet'}", "job.input_column_prefix=x_",
                   f"run.dir={tmp_path / 'run2'}"])
    with pytest.raises(ConfigError, match="job.input_column_prefix.*x_error"):
        preflight(cfg)


def test_text_column_missing_or_not_text_in_any_shard_is_refused(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"id": ["a"], "text": [b"\xff bytes are fine here"]}), src / "a.parquet")
    # A string column holding bytes that are not UTF-8 (unchecked, as some writers leave it): a row error later.
    raw = pa.array([b"fine", b"\xc3\x28 broken"], pa.binary())
    pq.write_table(pa.table({"id": ["b", "b2"], "text": pa.Array.from_buffers(pa.string(), 2, raw.buffers())}),
                   src / "b.parquet")
    (src / "c.parquet").write_text("not parquet: this shard fails on its own later, the others run")
    plan = preflight(compose(["+job=summarize", f"job.input={src}", f"run.dir={tmp_path / 'run'}"]))
    assert plan.rows == [1, 2, None] and list(plan.unreadable) == ["c.parquet"]
    described = plan.describe()
    assert "rows: 3" in described and "unreadable shard (it will fail, the others run): c.parquet" in described
    assert "prompt tokens: ~" in described, described
    pq.write_table(pa.table({"id": ["d"], "body": ["x"]}), src / "d.parquet")
    with pytest.raises(ConfigError, match="job.text_column: column 'text' is not in shard d.parquet"):
        preflight(compose(["+job=summarize", f"job.input={src}", f"run.dir={tmp_path / 'run'}"]))
    (src / "d.parquet").unlink()
    pq.write_table(pa.table({"id": ["e"], "text": [7]}), src / "e.parquet")
    line = refused(f"job.input={src}", f"run.dir={tmp_path / 'run'}")
    assert "job.text_column" in line and "e.parquet" in line and "int64" in line, line


# -- templates ------------------------------------------------------------------------------------

def test_text_twice_fills_both_slots(tmp_path):
    """Case 07: two {text} slots raised 'too many values to unpack' in every shard owner after
    the engines started; now the text goes into both, with the model's real tokenizer."""
    from pipeline.engine.model import load_tokenizer
    from pipeline.io.prompts import Renderer

    src = _case(tmp_path, "07-prompt-template-text-twice")
    cfg = compose(["+job=summarize", f"job.input={src}", f"run.dir={tmp_path / 'run'}",
                   "job.prompt_template='Note: {text} -- restate it in one line: {text}'"])
    preflight(cfg)
    tokenizer = load_tokenizer(compose(["+job=summarize"]))
    render = Renderer(cfg.job, tokenizer)
    text = pq.read_table(src / "notes.parquet").column("text")[0].as_py()
    ids, cut = render(text)
    prompt = tokenizer.decode(ids)
    assert not cut and prompt.count(text.strip()) == 2, prompt
    assert f"Note: {text} -- restate it in one line: {text}" in prompt
    want = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Note: {text} -- restate it in one line: {text}"}],
        add_generation_prompt=True, tokenize=True)
    assert ids == list(want["input_ids"] if hasattr(want, "keys") else want)


@pytest.mark.parametrize("template, words", [
    ("Summarize {title}: {text}", ["unknown placeholder {title}", "{text}"]),
    ("{text:>20}", ["{text:>20}", "format spec"]),
    ("{text!r}", ["{text!r}", "conversion"]),
    ("JSON like {\"a\": 1} then {text}", ["{{"]),
    ("a stray } then {text}", ["Single '}'", "{{ or }}"]),
    ("no slot at all", ["must contain {text}"]),
])
def test_bad_prompt_template_is_refused(tmp_path, template, words):
    line = refused(f"job.prompt_template={template!r}", f"run.dir={tmp_path / 'run'}")
    assert line.startswith("error: job.prompt_template:"), line
    for w in words:
        assert w in line, line
    assert not (tmp_path / "run").exists()


def test_system_prompt_and_rag_template_are_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"job.system_prompt: unknown placeholder \{role\}"):
        preflight(compose(["+job=summarize", "job.system_prompt='You are {role}'", f"run.dir={tmp_path / 'r'}"]))
    with pytest.raises(ConfigError, match=r"job.rag.template: unknown placeholder \{context\}"):
        preflight(compose(["+job=rag", "job.rag.template='{question} {passages} {context}'", f"run.dir={tmp_path / 'r'}"]))
    with pytest.raises(ConfigError, match=r"job.rag.template: must contain \{passages\}"):
        preflight(compose(["+job=rag", "job.rag.template='{question} only'", f"run.dir={tmp_path / 'r'}"]))
    # {{ and }} are literal braces, in the system prompt too.
    preflight(compose(["+job=summarize", "job.system_prompt='Answer in JSON: {{\"summary\": ...}}'",
                       f"run.dir={tmp_path / 'r'}"]))


# -- keys -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("override, key", [
    ("+model.bogus=1", "model.bogus"),
    ("+job.sampling.stops=[x]", "job.sampling.stops"),  # job.sampling.stop exists; a misspelling does not
    ("+run.bogus=true", "run.bogus"),
])
def test_plus_key_not_in_the_schema_is_refused(override, key):
    """Hydra adds a +key with the struct flag lifted and OmegaConf.to_object then dropped it."""
    line = one_line_error(run_pipeline("+job=summarize", override))
    assert line.startswith(f"error: {key}:"), line


def test_plus_key_into_a_free_form_field_is_kept():
    cfg = compose(["+job=summarize", "+cluster.additional_parameters.gres=gpu:1"])
    assert cfg.cluster.additional_parameters == {"gres": "gpu:1"}


# -- re-runs --------------------------------------------------------------------------------------

def _finished_run(tmp_path: Path, *args: str, checkpoint_only: bool = False) -> list[str]:
    """A run directory as a finished (or, ``checkpoint_only``, interrupted) run of ``args`` leaves it."""
    from pipeline.io.shards import list_shards
    from pipeline.runtime.rundir import RunDir

    cfg = compose(list(args))
    run = RunDir(cfg.run.dir)
    shards = list_shards(cfg.job.input)
    run.create(cfg, shards, cfg.job.output or str(run.path / "output"))
    if checkpoint_only:
        (run.path / "checkpoints" / shards[0].name).mkdir(parents=True)
        (run.path / "checkpoints" / shards[0].name / "part-00000.parquet").write_bytes(b"rows")
    else:
        for s in shards:
            run.mark_done(s, {"shard": s.name, "rows": 8, "errors": 0, "prompt_tokens": 1, "output_tokens": 1})
    return list(args)


def test_rerun_with_changed_settings_names_every_one(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    shutil.copyfile(SAMPLE / "part-00000.parquet", src / "part-00000.parquet")
    args = _finished_run(tmp_path, "+job=summarize", f"job.input={src}", f"run.dir={tmp_path / 'run'}")
    assert preflight(compose(args)).resumes
    line = one_line_error(run_pipeline(
        *args, "job.sampling.max_new_tokens=5", "job.prompt_template='Briefly: {text}'", "model.dtype=float32",
        "job.too_long=truncate", "job.id_column=doc", f"job.output={tmp_path / 'elsewhere'}"))
    changed = line.split("(changed: ")[1].split(")")[0].split(", ")
    assert sorted(changed) == sorted(["job.sampling.max_new_tokens", "job.prompt_template", "model.dtype",
                                      "job.too_long", "job.id_column", "job.output"]), line
    assert line.startswith("error: run.dir:"), line
    # A new file in the input folder changes which rows are read.
    shutil.copyfile(SAMPLE / "part-00001.parquet", src / "part-00001.parquet")
    with pytest.raises(ConfigError, match=r"changed: job.input \(files\)"):
        preflight(compose(args))


def test_rerun_over_row_checkpoints_is_checked_too(tmp_path):
    args = _finished_run(tmp_path, "+job=summarize", f"job.input={SAMPLE}", f"run.dir={tmp_path / 'run'}",
                         checkpoint_only=True)
    with pytest.raises(ConfigError, match=r"changed: job.sampling.seed, model.max_model_len"):
        preflight(compose([*args, "job.sampling.seed=3", "model.max_model_len=2048"]))
    # Settings that change speed, not results, may change.
    assert preflight(compose([*args, "job.batch_rows=4", "pools=colocated"])).resumes


# -- dry run --------------------------------------------------------------------------------------

def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
    root = tmp_path / "outputs"
    p = run_pipeline("+job=summarize", f"job.input={SAMPLE}", f"run.root={root}", "pools.prefill=2",
                     "--dry-run")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "shards: 3 (part-00000.parquet, part-00001.parquet, part-00002.parquet)" in out
    assert "rows: 24" in out and "pools: disaggregated 2P:1D" in out
    assert "prompt tokens: ~" in out and "estimate" in out
    assert "config:" in out and "dry_run: true" in out and "max_new_tokens: 48" in out
    # No run directory (so no decode endpoints, logs or jobs), nothing anywhere under run.root.
    assert not root.exists()
    # run.dry_run=true is the same; a dry run still refuses what a run would refuse.
    p = run_pipeline("+job=summarize", f"job.input={SAMPLE}", f"run.dir={tmp_path / 'run'}", "run.dry_run=true",
                     "job.prompt_template=x")
    assert p.returncode == 2 and "job.prompt_template" in p.stderr
    assert not (tmp_path / "run").exists()


def test_dry_run_of_json_lines_and_csv_counts_records_and_estimates_tokens(tmp_path):
    """The same 24 sample rows as JSON Lines and CSV shards: the dry run counts their records
    (not "from the Parquet footers") and estimates the prompt tokens from them as it does from
    Parquet: the same estimate (the same rows, rendered the same way)."""
    import csv
    import json

    rows = [r for f in sorted(SAMPLE.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    d = tmp_path / "in"
    d.mkdir()
    with open(d / "a.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows[:12])
    with open(d / "b.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows[12:])
    text = run_pipeline("+job=summarize", f"job.input={d}", f"run.dir={tmp_path / 'run'}", "--dry-run")
    parquet = run_pipeline("+job=summarize", f"job.input={SAMPLE}", f"run.dir={tmp_path / 'run'}", "--dry-run")
    assert text.returncode == parquet.returncode == 0, text.stderr + parquet.stderr
    assert "rows: 24 (counted record by record)" in text.stdout
    assert "rows: 24 (from the Parquet footers)" in parquet.stdout

    def estimate(out: str) -> str:
        return next(ln for ln in out.splitlines() if ln.startswith("prompt tokens: "))
    assert estimate(text.stdout) == estimate(parquet.stdout) and "~" in estimate(text.stdout)


def test_case_10_taken_ports_fail_at_start_naming_port_and_setting(tmp_path):
    import socket
    import time

    holders = []
    try:
        s0 = socket.socket()
        s0.bind(("127.0.0.1", 0))
        base = s0.getsockname()[1]
        s0.close()
        for port in (base, base + 10):  # the decode rank's and the prefill task's ports
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
            holders.append(s)
        t0 = time.monotonic()
        line = one_line_error(run_pipeline("+job=summarize", "run.progress=false", f"job.input={SAMPLE}",
                                            f"transport.base_port={base}", f"run.dir={tmp_path / 'run'}"))
        assert time.monotonic() - t0 < 30
        assert f"port {base} " in line and "transport.base_port" in line
        assert not (tmp_path / "run" / "logs").exists()  # no worker started
    finally:
        for s in holders:
            s.close()


# -- KV room for one request ------------------------------------------------------------------------
# SmolLM2-135M by hand (its config.json): 2 (K and V) x 30 layers x 3 KV heads x 64 head dim = 11,520
# elements per token, 46,080 B in float32; vLLM's CPU blocks are 128 tokens.
FP32_TOKEN, BLOCK = 2 * 30 * 3 * 64 * 4, 128


def _kv_check(*overrides: str) -> None:
    from pipeline.preflight.engine_args import local_model
    from pipeline.preflight.kv_fit import check_kv_fits

    cfg = compose(["+job=summarize", "model.dtype=float32", *overrides])
    model = local_model(cfg)
    if model is None:
        pytest.skip("the bundled model is not converted here (tools/setup.sh)")
    check_kv_fits(cfg, model)


def test_kv_room_for_one_request_is_checked_at_start_against_the_hand_count(tmp_path):
    # 8,192 tokens = 64 blocks x 128 x 46,080 B = 377,487,360 B = 0.3516 GiB of KV cache per engine.
    need = 64 * BLOCK * FP32_TOKEN
    assert need / 2**30 == pytest.approx(0.3516, abs=1e-4)
    _kv_check("model.max_model_len=8192", "model.kv_cache_gib=0.36")
    with pytest.raises(ConfigError, match=r"model.kv_cache_gib=0.35 .* model.max_model_len=8192 .* 0.352 GiB"):
        _kv_check("model.max_model_len=8192", "model.kv_cache_gib=0.35")
    # Colocated engines too; GPU workers size their cache from the device, so only vLLM knows.
    with pytest.raises(ConfigError, match="per colocated engine"):
        _kv_check("pools=colocated", "model.max_model_len=8192", "model.kv_cache_gib=0.35")
    _kv_check("model.max_model_len=8192", "model.kv_cache_gib=0.35", "cluster.gpus_per_task=1")
    # Decode blocks: vLLM keeps one back, so 4,096 tokens need 32 + 1 (the DRAM tier test's 65
    # blocks hold 8,192 on real vLLM); 128 + 1 with 32-token blocks.
    _kv_check("model.decode_kv_blocks=33")
    with pytest.raises(ConfigError, match=r"model.decode_kv_blocks=32 holds 3968 tokens.*at least 33 blocks"):
        _kv_check("model.decode_kv_blocks=32")
    with pytest.raises(ConfigError, match="at least 129 blocks"):
        _kv_check("model.decode_kv_blocks=64", "model.block_size=32")
    # The DRAM tier: 32 slots of 128 x 46,080 = 5,898,240 B = 0.1758 GiB for 4,096 tokens.
    _kv_check("offload=dram", "offload.dram_gib=0.18")
    with pytest.raises(ConfigError, match=r"offload.dram_gib=0.17 holds 30 KV blocks .* fewer than the 32"):
        _kv_check("offload=dram", "offload.dram_gib=0.17")
    # From the command line: one line, exit 2, before anything starts.
    line = refused("model.max_model_len=8192", "model.kv_cache_gib=0.1", f"run.dir={tmp_path / 'run'}")
    assert "model.kv_cache_gib=0.1" in line and "model.max_model_len=8192" in line and "model.dtype=bfloat16" in line
    assert not (tmp_path / "run").exists()
