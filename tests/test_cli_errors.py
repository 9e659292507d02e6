"""Bad configuration and missing input end in one line naming the cause and a non-zero exit."""

from __future__ import annotations

import pytest

from tests.helpers import one_line_error, run_pipeline


def test_missing_input_path(tmp_path):
    missing = tmp_path / "nowhere"
    line = one_line_error(run_pipeline("+job=summarize", f"job.input={missing}", f"run.root={tmp_path}"))
    assert "job.input" in line and str(missing) in line


def test_input_without_parquet(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    line = one_line_error(run_pipeline("+job=summarize", f"job.input={tmp_path}", f"run.root={tmp_path}"))
    assert "no .parquet shards" in line


def test_dry_run_refuses_an_input_of_which_no_shard_is_readable(tmp_path):
    """A text file named ``docs.parquet`` as the only shard, or a folder whose every shard is
    unreadable: nothing would run, so the dry run (and the run) exit 2 naming the first and why,
    instead of "it will fail, the others run" with no others (issue #41). With some readable
    shards the others still run (tests/test_preflight.py)."""
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "docs.parquet").write_text("plain text, not Parquet\n")
    for where in (tmp_path / "one", tmp_path / "one" / "docs.parquet"):
        line = one_line_error(run_pipeline("+job=summarize", f"job.input={where}", f"run.root={tmp_path}", "--dry-run"))
        assert line.startswith("error: job.input: no shard is readable") and "its only shard, docs.parquet" in line
        assert "Parquet magic bytes not found" in line, line
    (tmp_path / "all").mkdir()
    (tmp_path / "all" / "a.parquet").write_bytes(b"PAR1")  # truncated: the magic bytes only
    (tmp_path / "all" / "b.parquet").write_text("x")
    line = one_line_error(run_pipeline("+job=summarize", f"job.input={tmp_path / 'all'}", f"run.root={tmp_path}",
                                       "--dry-run"))
    assert "no shard is readable" in line and "2 shards; the first, a.parquet:" in line


@pytest.mark.parametrize("name", ["docs.txt", "docs.tsv"])
def test_a_file_with_an_extension_not_read_is_refused_not_read_as_parquet(tmp_path, name):
    (tmp_path / name).write_text("id\ttext\n1\thello\n")
    line = one_line_error(run_pipeline("+job=summarize", f"job.input={tmp_path / name}", f"run.root={tmp_path}",
                                       "--dry-run"))
    ext = name[name.index("."):]
    assert f"job.input: {tmp_path / name}: {ext} files are not read" in line
    assert "Parquet (.parquet), JSON Lines (.jsonl, .json, .ndjson) and CSV (.csv)" in line
    # A glob that matches only such files says the same; a folder skips them (no shard there).
    line = one_line_error(run_pipeline("+job=summarize", f"job.input={tmp_path / '*'}", f"run.root={tmp_path / 'r'}",
                                       "--dry-run"))
    assert f"{ext} files are not read" in line
    assert "no .parquet shards" in one_line_error(run_pipeline("+job=summarize", f"job.input={tmp_path}",
                                                               f"run.root={tmp_path / 'r'}", "--dry-run"))


def test_unknown_job():
    line = one_line_error(run_pipeline("+job=translate"))
    assert "job/translate" in line and "summarize" in line


def test_no_job():
    assert "+job=" in one_line_error(run_pipeline())


@pytest.mark.parametrize("override, key", [
    ("pools.prefill=two", "pools.prefill"),
    ("pools.prefill=0", "pools.prefill"),
    ("transport.connector=Bogus", "transport.connector"),
    ("job.sampling.temperature=-1", "job.sampling.temperature"),
    ("job.no_such_key=1", "job.no_such_key"),
    ("pools=nope", "pools/nope"),
    ("pools.claim_dead_after_s=5", "pools.claim_dead_after_s"),  # under three heartbeats
])
def test_wrong_config_value(override, key):
    assert key.split(".")[-1] in one_line_error(run_pipeline("+job=summarize", override))


def test_rerun_of_finished_job_does_nothing_and_a_changed_config_is_refused(tmp_path):
    """A run directory whose shards are all done: the same job launches nothing; a job whose
    outputs would differ (another max_new_tokens) refuses to mix into it."""
    from tests.helpers import SAMPLE

    shard = SAMPLE / "part-00000.parquet"
    args = ["+job=summarize", f"job.input={shard}", f"run.dir={tmp_path / 'run'}"]
    # Lay out the run directory and mark its only shard done, as a finished run leaves it.
    from pipeline.config import compose
    from pipeline.io.shards import list_shards
    from pipeline.runtime.rundir import RunDir

    run = RunDir(tmp_path / "run")
    shards = list_shards(str(shard))
    run.create(compose(args), shards, str(tmp_path / "run" / "output"))
    run.mark_done(shards[0], {"rows": 8, "errors": 0, "prompt_tokens": 1, "output_tokens": 1})
    p = run_pipeline(*args)
    assert p.returncode == 0, p.stderr
    assert "nothing to do" in p.stdout and not list((tmp_path / "run" / "logs").iterdir())
    line = one_line_error(run_pipeline(*args, "job.sampling.max_new_tokens=5"))
    assert "job.sampling.max_new_tokens" in line


# Errors that say what to do (issue #41): each is one line, exit 2, and names what to write.

def test_job_without_plus_says_to_add_it():
    for args in (["job=summarize"], ["job=summarize", "--help"], ["-m", "job=summarize"]):
        line = one_line_error(run_pipeline(*args))
        assert "job=summarize: the config has no job to override; add one with +job=summarize" in line, line


@pytest.mark.parametrize("args", [
    ["job.prompt_template=Summarize:", "{text}"],  # what the shell passes for job.prompt_template=Summarize: {text}
    ["job.prompt_template=Summarize: {text}"],  # quoted for the shell only: Hydra reads the braces
])
def test_unquoted_template_with_braces_says_how_to_quote_it(args):
    line = one_line_error(run_pipeline("+job=summarize", *args, "--dry-run"))
    assert "quote it for the shell, and for Hydra inside" in line or "quote the value for Hydra" in line, line
    assert line.endswith("""'job.prompt_template="Summarize: {text}"'"""), line


def test_template_that_hydra_reads_as_a_dict_says_how_to_quote_it():
    line = one_line_error(run_pipeline("+job=summarize", "job.prompt_template={a: 1}", "--dry-run"))
    assert "job.prompt_template: Cannot convert 'dict' to string" in line
    assert line.endswith("""'job.prompt_template="{a: 1}"'"""), line


def test_the_quoting_example_of_help_runs_as_written():
    """``--help``'s example of a quoted template, split as a shell splits it, composes."""
    import shlex

    p = run_pipeline("--help")
    example = next(ln for ln in p.stdout.splitlines() if "job.prompt_template=" in ln).split(" (")[0]
    (arg,) = shlex.split(example)
    p = run_pipeline("+job=summarize", arg, "--cfg", "job", "--package", "job.prompt_template")
    assert p.returncode == 0 and p.stdout.strip() == "Summarize: {text}", (example, p.stdout, p.stderr)


@pytest.mark.parametrize("override, hint", [
    ("pools.prefil=2", "did you mean pools.prefill"),
    ("job.sampling.max_tokens=32", "did you mean job.sampling.max_new_tokens? (max_tokens is vLLM's name)"),
    ("+job.sampling.max_tokens=32", "did you mean job.sampling.max_new_tokens?"),
    ("model.tensor_parallel_size=2", "did you mean model.prefill_tp and model.decode_tp?"),
    ("job.sampling.temprature=0.5", "did you mean job.sampling.temperature"),
    ("job.max_model_len=64", "did you mean model.max_model_len?"),
])
def test_misspelt_key_names_the_nearest(override, hint):
    line = one_line_error(run_pipeline("+job=summarize", override, "--dry-run"))
    assert f"{override.lstrip('+').split('=')[0]}: Key" in line and hint in line, line


def test_unknown_command_is_named_as_one_with_the_list(tmp_path):
    """``pd-pipeline stauts DIR`` (the console script beside this Python) and ``python -m pipeline``."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).with_name("pd-pipeline")
    for p in (subprocess.run([str(script), "stauts", str(tmp_path)], capture_output=True, text=True, timeout=120),
              run_pipeline("stauts", str(tmp_path))):
        line = one_line_error(p)
        assert line.startswith("error: stauts: not a command (status, plan, report, prepare-model")
        assert "did you mean status?" in line
    assert "did you mean +job=summarize?" in one_line_error(run_pipeline("summarize"))
