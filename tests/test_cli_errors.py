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
