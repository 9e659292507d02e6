"""The package as a user installs it: a wheel built from this checkout, installed into a fresh
virtualenv, run as ``pd-pipeline`` from a directory outside the checkout. No engine starts: help,
dry runs and printed configs only (~30 s, most of it the interpreter importing torch).

The fresh venv sees this interpreter's dependencies through a ``.pth`` file naming its
site-packages directory; ``.pth`` files inside a directory added that way are not processed, so
the editable install of pd-pipeline there (its finder is started by a ``.pth``) stays out, and
``import pipeline`` can only find the wheel's copy, which the first test checks. The wheel is built
once per session (``tests.conftest.installed``); ``pools=auto``'s real run uses it too
(``tests/plan/test_auto.py``)."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from tests.helpers import ROOT

USER_JOB = """\
# A user's own job: the shipped summarize job with its own prompt and input.
defaults:
  - summarize
  - _self_
name: mine
input: {input}
prompt_template: "List three keywords of this text.\\n\\n{{text}}"
sampling:
  max_new_tokens: 12
"""
USER_CLUSTER = """\
# A site preset: the local launcher with the site's own limits.
defaults:
  - local
  - _self_
name: mysite
cpu_bind: auto
timeout_min: 17
"""


def _wheel_options(wheel: Path, group: str) -> list[str]:
    """The options of a config group as the wheel's file list has them."""
    names = zipfile.ZipFile(wheel).namelist()
    return sorted(Path(n).stem for n in names if n.startswith(f"pipeline/conf/{group}/") and n.endswith(".yaml"))


def test_the_wheel_is_what_runs(installed):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([str(installed.venv / "bin" / "python"), "-c",
                        "import pipeline, pipeline.config as c; print(pipeline.__file__); print(c.CONF_DIR)"],
                       cwd=installed.work, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    module, conf = p.stdout.split()
    assert Path(module) == installed.site / "pipeline" / "__init__.py"
    assert Path(conf) == installed.site / "pipeline" / "conf"
    assert not Path(module).is_relative_to(ROOT)


def test_help_lists_the_packaged_groups_and_the_commands(installed):
    p = installed.run("--help")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    for group in ("job", "cluster", "model", "pools"):
        line = next(ln for ln in lines if ln.startswith(f"{group}: "))
        assert line.split(": ", 1)[1].split("  (")[0].split(", ") == _wheel_options(installed.wheel, group), line
    assert "summarize" in _wheel_options(installed.wheel, "job")
    for command in ("status", "plan", "report", "prepare-model"):
        assert any(ln.startswith(f"{command} ") for ln in lines), command
        assert installed.run(command, "--help").returncode == 0, command
    assert "--config-dir" in p.stdout


def test_the_shipped_job_finds_its_packaged_input(installed):
    p = installed.run("+job=summarize", "--dry-run", f"run.root={installed.base / 'runs'}")
    assert p.returncode == 0, p.stderr
    sample = installed.site / "pipeline" / "data" / "sample"
    shards = sorted(sample.glob("*.parquet"))
    assert shards and all(f"pipeline/data/sample/{s.name}" in zipfile.ZipFile(installed.wheel).namelist() for s in shards)
    cfg = yaml.safe_load(p.stdout.split("\nconfig:\n", 1)[1])
    assert cfg["job"]["input"] == str(sample)
    assert f"shards: {len(shards)} " in p.stdout
    assert f"rows: {sum(pq.read_metadata(s).num_rows for s in shards)} " in p.stdout
    assert not (installed.base / "runs").exists()  # a dry run starts nothing


def test_a_user_config_dir_adds_a_job_and_a_cluster(installed, tmp_path):
    user = tmp_path / "myproject"
    (user / "job").mkdir(parents=True)
    (user / "cluster").mkdir()
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["first text", "second text"]}), inputs / "part-0.parquet")
    (user / "job" / "mine.yaml").write_text(USER_JOB.format(input=inputs))
    (user / "cluster" / "mysite.yaml").write_text(USER_CLUSTER)
    mine, mysite = yaml.safe_load(USER_JOB.format(input=inputs)), yaml.safe_load(USER_CLUSTER)

    p = installed.run("--config-dir", str(user), "+job=mine", "cluster=mysite", "--cfg", "job")
    assert p.returncode == 0, p.stderr
    cfg = yaml.safe_load(p.stdout)
    assert cfg["job"]["name"] == "mine" and cfg["job"]["prompt_template"] == mine["prompt_template"]
    assert cfg["job"]["input"] == str(inputs)
    assert cfg["job"]["sampling"]["max_new_tokens"] == 12
    assert cfg["job"]["text_column"] == "text"  # from the shipped summarize job it extends
    assert {k: cfg["cluster"][k] for k in ("name", "cpu_bind", "timeout_min")} == \
        {k: mysite[k] for k in ("name", "cpu_bind", "timeout_min")}
    assert cfg["cluster"]["launcher"] == "local"  # from the shipped local preset

    # -cd is the same flag; the dry run reads the user's input.
    p = installed.run("-cd", str(user), "+job=mine", "cluster=mysite", "--dry-run", f"run.root={tmp_path / 'runs'}")
    assert p.returncode == 0, p.stderr
    assert "shards: 1 " in p.stdout and "rows: 2 " in p.stdout
    p = installed.run("--help", "--config-dir", str(user))
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("job: "))
    assert line.split(": ", 1)[1].split("  (")[0].split(", ") == sorted([*_wheel_options(installed.wheel, "job"), "mine"])

    p = installed.run("--config-dir", str(tmp_path / "absent"), "+job=summarize", "--dry-run")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("error: "), p.stderr
    assert str(tmp_path / "absent") in p.stderr


def _setup(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``bash tools/setup.sh ARGS`` of the checkout in ``cwd`` (always with --dry-run or a bad
    argument here: nothing is installed)."""
    base = {k: v for k, v in os.environ.items() if k != "PD_PIPELINE_BUILD"}
    return subprocess.run(["bash", str(cwd / "tools" / "setup.sh"), *args], env={**base, **env},
                          capture_output=True, text=True, timeout=60)


def test_setup_refuses_an_unknown_argument_or_build():
    p = _setup(ROOT, "--bogus")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("setup.sh: unknown argument '--bogus' (usage: bash tools/setup.sh [--gpu | --cpu]")
    p = _setup(ROOT, "--dry-run", PD_PIPELINE_BUILD="tpu")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "PD_PIPELINE_BUILD=tpu: give gpu or cpu" in p.stderr


def test_setup_can_be_told_the_build_and_its_stamp_names_it(tmp_path):
    """``--gpu`` / ``--cpu`` / ``PD_PIPELINE_BUILD`` pick the build without asking nvidia-smi (a
    flag wins over the variable), and the stamp that makes a second run a no-op is per build."""
    import hashlib
    import shutil

    (tmp_path / "tools").mkdir()
    for name in ("pyproject.toml", "tools/setup.sh"):
        shutil.copy(ROOT / name, tmp_path / name)
    assert _setup(tmp_path, "--gpu", "--dry-run").stdout == \
        "setup: vLLM gpu build (asked for): would install it into .venv, then convert the default model\n"
    assert "vLLM gpu build (asked for)" in _setup(tmp_path, "--dry-run", PD_PIPELINE_BUILD="gpu").stdout
    assert "vLLM cpu build (asked for)" in _setup(tmp_path, "--cpu", "--dry-run", PD_PIPELINE_BUILD="gpu").stdout
    assert "build (detected)" in _setup(tmp_path, "--dry-run").stdout
    digest = hashlib.sha256((tmp_path / "pyproject.toml").read_bytes() + (tmp_path / "tools/setup.sh").read_bytes())
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / f".setup-{digest.hexdigest()[:16]}-cpu").touch()
    assert _setup(tmp_path, "--cpu", "--dry-run").stdout == "setup: vLLM cpu build (asked for): .venv is up to date\n"
    assert "would install" in _setup(tmp_path, "--gpu", "--dry-run").stdout
    assert sorted(p.name for p in (tmp_path / ".venv").iterdir()) == \
        [f".setup-{digest.hexdigest()[:16]}-cpu"]  # nothing installed
