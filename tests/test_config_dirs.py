"""User config directories (``--config-dir DIR`` / ``-cd DIR``, ``hydra.searchpath=[file://DIR]``)
join the shipped config groups everywhere the shipped options are used: composition, the help's
group listing, sweeps; and where the shipped configuration and data live (in the package). In
process, no engine: every run is a printed config or a dry run."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml

import pipeline
import pipeline.__main__ as cli
from pipeline.api import sweep
from pipeline.config import CONF_DIR, DATA_DIR, ConfigError, compose, groups, split_searchpath, sweep_points
from tests.helpers import ROOT

JOB = {"defaults": ["summarize", "_self_"], "name": "mine", "prompt_template": "Title this:\n\n{text}",
       "sampling": {"max_new_tokens": 9}}
CLUSTER = {"defaults": ["local", "_self_"], "name": "mysite", "cpu_bind": "auto", "timeout_min": 33}


@pytest.fixture
def user(tmp_path) -> Path:
    """A user's config directory: ``job/mine.yaml``, ``cluster/mysite.yaml`` and a
    ``job/summarize.yaml`` that the shipped option of that name shadows."""
    d = tmp_path / "conf"
    (d / "job").mkdir(parents=True)
    (d / "cluster").mkdir()
    (d / "job" / "mine.yaml").write_text(yaml.safe_dump(JOB))
    (d / "cluster" / "mysite.yaml").write_text(yaml.safe_dump(CLUSTER))
    (d / "job" / "summarize.yaml").write_text(yaml.safe_dump({**JOB, "name": "not-the-shipped-one"}))
    return d


@pytest.fixture(autouse=True)
def _keep_signals(monkeypatch):
    """cli.main installs a SIGTERM handler for a run; not in pytest's own process."""
    monkeypatch.setattr(signal, "signal", lambda *a: None)


def _shipped(group: str) -> list[str]:
    return sorted(f.stem for f in (ROOT / "conf" / group).glob("*.yaml"))


def test_the_configuration_and_sample_data_ship_in_the_package():
    package = Path(pipeline.__file__).resolve().parent
    assert CONF_DIR == package / "conf" and DATA_DIR == package / "data"
    # The checkout's top-level conf/ and data/ are the same directories.
    assert (ROOT / "conf").resolve() == CONF_DIR and (ROOT / "data").resolve() == DATA_DIR
    cfg = compose(["+job=summarize"])
    assert cfg.job.input == str(DATA_DIR / "sample") and sorted((DATA_DIR / "sample").glob("*.parquet"))
    rag = compose(["+job=rag"])
    assert Path(rag.job.input).is_file() and Path(rag.job.rag.corpus).is_file()
    assert Path(rag.job.input).is_relative_to(DATA_DIR)


def test_searchpath_adds_the_users_options(user):
    sp = f"hydra.searchpath=[file://{user}]"
    cfg = compose([sp, "+job=mine", "cluster=mysite"])
    assert cfg.job.name == "mine" and cfg.job.prompt_template == JOB["prompt_template"]
    assert cfg.job.sampling.max_new_tokens == 9
    assert cfg.job.input == compose(["+job=summarize"]).job.input  # what it extends
    assert (cfg.cluster.name, cfg.cluster.cpu_bind, cfg.cluster.timeout_min) == ("mysite", "auto", 33)
    # A shipped option of the same name wins, as with Hydra's own hydra.searchpath.
    assert compose([sp, "+job=summarize"]).job.name == "summarize"
    # Without the directory the user's options are unknown, and the error lists what there is.
    with pytest.raises(ConfigError, match=r"job/mine.*available: " + ", ".join(_shipped("job"))):
        compose(["+job=mine"])
    listed = groups([sp])
    assert listed["job"] == (sorted({*_shipped("job"), "mine"}), None)
    assert listed["cluster"][0] == sorted({*_shipped("cluster"), "mysite"})


def test_config_dir_flag_and_its_short_form(user, capsys):
    for flag in ("--config-dir", "-cd"):
        assert cli.main([flag, str(user), "+job=mine", "cluster=mysite", "--cfg", "job"]) == 0
        printed = yaml.safe_load(capsys.readouterr().out)
        assert printed["job"]["prompt_template"] == JOB["prompt_template"]
        assert printed["cluster"]["timeout_min"] == CLUSTER["timeout_min"]
    assert cli.main(["--help", "-cd", str(user)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("cluster: "))
    assert line.split(": ", 1)[1].split("  (")[0].split(", ") == sorted({*_shipped("cluster"), "mysite"})


def test_a_sweep_sees_the_users_options(user, tmp_path):
    sp = f"hydra.searchpath=[file://{user}]"
    points = sweep_points([sp, "+job=mine", "cluster=glob(my*)", "job.sampling.temperature=0,0.5"])
    assert [swept for _, swept in points] == [["cluster=mysite", "job.sampling.temperature=0"],
                                              ["cluster=mysite", "job.sampling.temperature=0.5"]]
    pts = sweep(sp, "+job=mine", "job.sampling.temperature=0,0.5", "run.dry_run=true", f"run.root={tmp_path}")
    assert [(p.cfg.job.name, p.cfg.job.sampling.temperature) for p in pts] == [("mine", 0.0), ("mine", 0.5)]


def test_a_missing_config_dir_is_one_line_exit_2(tmp_path, capsys):
    absent = tmp_path / "absent"
    assert cli.main(["--config-dir", str(absent), "+job=summarize", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(absent) in err
    with pytest.raises(ConfigError, match=str(absent)):
        compose([f"hydra.searchpath=[file://{absent}]", "+job=summarize"])
    with pytest.raises(ConfigError, match=str(absent)):
        groups([f"hydra.searchpath=[file://{absent}]"])


def test_split_searchpath_reads_hydras_grammar(user, tmp_path, monkeypatch):
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(tmp_path)
    dirs, rest = split_searchpath(["+job=x", f"hydra.searchpath=[file://{user},'file://other']",
                                   f"++hydra.searchpath=[{user}]", "a=1"])
    assert dirs == [f"file://{user}", f"file://{other}", f"file://{user}"] and rest == ["+job=x", "a=1"]
    with pytest.raises(ConfigError, match="list of directories"):
        split_searchpath(["hydra.searchpath={a: 1}"])


def test_a_first_word_naming_a_command_runs_it(capsys):
    assert cli.main(["status", "--help"]) == 0
    assert "RUN_DIR" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["plan", "--help"])
    assert exc.value.code == 0 and "--hardware" in capsys.readouterr().out


def test_a_run_made_when_the_data_lay_in_the_checkout_is_the_same_config():
    """Run directories written before the data moved into the package name the checkout's
    data/ (now a link): a re-run there is not refused as another input or corpus."""
    from dataclasses import replace

    from pipeline.preflight.rerun import rerun_changes

    new = compose(["+job=rag"])
    old = replace(new, job=replace(new.job, input=str(ROOT / "data" / "rag" / "questions.parquet"),
                                   rag=replace(new.job.rag, corpus=str(ROOT / "data" / "rag" / "corpus.parquet"))))
    assert old.job.rag.corpus != new.job.rag.corpus
    assert rerun_changes(old, new) == []
    moved = replace(new, job=replace(new.job, rag=replace(new.job.rag, corpus=str(ROOT / "README.md"))))
    assert rerun_changes(moved, new) == ["job.rag.corpus"]
