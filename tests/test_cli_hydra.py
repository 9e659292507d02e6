"""``python -m pipeline`` as a Hydra application: ``--help``, ``--cfg``, ``--info``, ``-m`` sweeps,
and ``submit`` with the same overrides. No test here starts an engine: every run is a dry run,
refused, printed, submitted through the real launcher to stand-ins for Slurm's sbatch and srun,
or launched through a stand-in for :func:`pipeline.run.start_job` (a local sweep, whose real
points would start engines)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pipeline.config import compose, to_yaml
from tests.helpers import ROOT, SAMPLE, run_pipeline
from tests.helpers import one_line_error

CONF = (ROOT / "conf").resolve()  # a link to the package's pipeline/conf, where Hydra reads it


def _dry_sweep(tmp_path: Path, *overrides: str):
    """A dry-run sweep into ``tmp_path``; an empty model cache keeps the tokenizer unloaded."""
    return run_pipeline("+job=summarize", "-m", *overrides, "run.dry_run=true", f"run.root={tmp_path / 'runs'}",
                        env={"PD_PIPELINE_CACHE": str(tmp_path / "cache")})


def _points(stdout: str) -> list[tuple[str, str, str]]:
    """(label, run dir, printed block) of each ``== point N: LABEL | run dir DIR`` section."""
    parts = re.split(r"^== point \d+: (.*) \| run dir (.*)$", stdout, flags=re.M)
    return [(parts[i], parts[i + 1], parts[i + 2].split("\n== multirun:")[0]) for i in range(1, len(parts), 3)]


def test_help_lists_every_group_and_its_options_from_conf():
    p = run_pipeline("--help")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    groups = sorted(d.name for d in CONF.iterdir() if d.is_dir())
    assert groups == sorted(["job", "model", "cluster", "pools", "transport", "offload"])
    for group in groups:
        line = next((ln for ln in lines if ln.startswith(f"{group}: ")), None)
        assert line is not None, f"{group} not in --help:\n{p.stdout}"
        options = line.split(": ", 1)[1].split("  (")[0].split(", ")
        assert options == sorted(f.stem for f in (CONF / group).glob("*.yaml")), line
    assert "chosen: local" in next(ln for ln in lines if ln.startswith("cluster: "))
    for flag in ("--cfg", "--info", "--multirun", "--hydra-help", "--dry-run", "key=value", "+job=NAME"):
        assert flag in p.stdout, flag
    # With a job and overrides: the choices follow them, and the composed config is shown.
    p = run_pipeline("--help", "+job=summarize", "pools=colocated")
    assert p.returncode == 0, p.stderr
    assert "pools: auto, colocated, disaggregated  (chosen: colocated)" in p.stdout
    assert to_yaml(compose(["+job=summarize", "pools=colocated"])) in p.stdout
    assert run_pipeline("--hydra-help").returncode == 0


def test_cfg_job_prints_the_composed_config_and_starts_nothing(tmp_path):
    args = ["+job=summarize", "pools=colocated", "job.sampling.temperature=0.5", f"run.root={tmp_path / 'runs'}"]
    p = run_pipeline("--cfg", "job", *args)
    assert p.returncode == 0, p.stderr
    expected = compose(args)
    assert p.stdout == to_yaml(expected)
    assert yaml.safe_load(p.stdout) == yaml.safe_load(to_yaml(expected))
    assert yaml.safe_load(p.stdout)["job"]["sampling"]["temperature"] == 0.5
    assert not (tmp_path / "runs").exists()
    # One part of it (-p), Hydra's own part, and both.
    p = run_pipeline("--cfg", "job", "-p", "job.sampling", *args)
    assert p.returncode == 0, p.stderr
    assert yaml.safe_load(p.stdout) == yaml.safe_load(to_yaml(expected))["job"]["sampling"]
    p = run_pipeline("--cfg", "hydra", *args)
    assert p.returncode == 0 and list(yaml.safe_load(p.stdout)) == ["hydra"], p.stderr
    p = run_pipeline("--cfg", "all", *args)
    assert p.returncode == 0, p.stderr
    assert set(yaml.safe_load(p.stdout)) == {"hydra", *yaml.safe_load(to_yaml(expected))}


@pytest.mark.parametrize("override, words", [
    ("pools.prefill=two", "pools.prefill"),
    ("pools=nope", "pools/nope"),
    ("+model.bogus=1", "model.bogus"),
    ("job.sampling.temperature=0,0.7", "-m"),  # a sweep without -m
    ("job.sampling.temperature=0,", "job.sampling.temperature=0,"),  # not Hydra's grammar
    ("run.stall_ms=0", "run.stall_ms"),
])
def test_a_bad_override_in_cfg_is_one_line_exit_2(override, words):
    assert words in one_line_error(run_pipeline("--cfg", "job", "+job=summarize", override))


def test_a_bad_flag_or_flags_together_are_one_line_exit_2():
    assert "--bogus" in one_line_error(run_pipeline("+job=summarize", "--bogus"))
    assert "only one of" in one_line_error(run_pipeline("+job=summarize", "--cfg", "job", "-m"))
    assert "job.nope" in one_line_error(run_pipeline("--cfg", "job", "-p", "job.nope", "+job=summarize"))


def test_info_is_hydras():
    p = run_pipeline("--info")
    assert p.returncode == 0, p.stderr
    assert "Config search path" in p.stdout and f"file://{CONF}" in p.stdout and "Defaults Tree" in p.stdout
    p = run_pipeline("--info", "defaults", "+job=summarize", "pools=colocated")
    assert p.returncode == 0, p.stderr
    assert "job/summarize" in p.stdout and "pools/colocated" in p.stdout
    assert "pools/nope" in one_line_error(run_pipeline("--info", "+job=summarize", "pools=nope"))


def test_multirun_dry_run_runs_each_point_in_its_own_run_dir(tmp_path):
    p = _dry_sweep(tmp_path, "job.sampling.temperature=0,0.7", "model.enforce_eager=true,false")
    assert p.returncode == 0, p.stderr
    points = _points(p.stdout)
    assert len(points) == 4, p.stdout
    seen = set()
    for index, (label, run_dir, block) in enumerate(points):
        assert "dry run: everything checked, nothing started" in block
        cfg = yaml.safe_load(block.split("\nconfig:\n", 1)[1])
        values = (cfg["job"]["sampling"]["temperature"], cfg["model"]["enforce_eager"])
        assert label == f"job.sampling.temperature={values[0]:g} model.enforce_eager={values[1]}", label
        assert cfg["run"]["dir"] == run_dir and Path(run_dir).name == str(index)
        assert Path(run_dir).parent.parent == tmp_path / "runs" / "summarize"
        seen.add(values)
    assert seen == {(0.0, True), (0.0, False), (0.7, True), (0.7, False)}
    assert len({Path(d).parent for _, d, _ in points}) == 1  # one sweep directory, one timestamp
    summary = p.stdout.split("== multirun: 4 points, 4 ok\n", 1)[1].splitlines()
    assert [ln.split(":")[0] for ln in summary] == ["point 0", "point 1", "point 2", "point 3"]
    assert not (tmp_path / "runs").exists()  # a dry run leaves nothing behind


@pytest.mark.parametrize("sweep, words", [
    ("job.sampling.temperature=0,-1", "job.sampling.temperature"),  # a bad value
    (f"job.input={SAMPLE},{SAMPLE / 'nowhere'}", "no such file"),  # a failed check at start
])
def test_a_sweep_with_one_invalid_point_exits_2_before_any_point_runs(tmp_path, sweep, words):
    p = _dry_sweep(tmp_path, "model.enforce_eager=true,false", sweep)
    line = one_line_error(p)
    assert line.startswith("error: point 1 (") and words in line, line
    assert "== point" not in p.stdout and "dry run" not in p.stdout


def test_two_points_writing_one_output_are_refused(tmp_path):
    line = one_line_error(_dry_sweep(tmp_path, "pools=colocated,disaggregated", f"job.output={tmp_path / 'out'}"))
    assert "job.output" in line and "points 0 and 1" in line


class _Handle:
    """A stand-in for :class:`pipeline.run.RunHandle`: launched nothing; ``wait`` records the call."""

    def __init__(self, cfg, fail: bool = False):
        self.cfg, self.fail, self.waited = cfg, fail, False
        self.run_dir, self.n_shards, self.nothing_to_do = Path(cfg.run.dir), 3, False
        self.job_ids = [f"{100 + int(self.run_dir.name)}", f"{200 + int(self.run_dir.name)}"]

    def wait(self, progress: bool = False):
        from pipeline.launch.watch import RunFailed

        self.waited = True
        if self.fail:
            raise RunFailed("prefill-0 failed, see its log")
        return SimpleNamespace(shards=3, shards_done=3, text=lambda: f"run dir: {self.run_dir}")


@pytest.fixture
def fake_start(monkeypatch, tmp_path):
    """Point launches go to :class:`_Handle` (point 0 fails when waited for); SIGTERM's handler,
    which ``main`` sets, is restored afterwards."""
    import pipeline.api  # noqa: F401 -- imported first, it keeps the real start_job for submit()
    import pipeline.run

    handles: list[_Handle] = []

    def start_job(cfg):
        handles.append(_Handle(cfg, fail=not handles))
        return handles[-1]

    monkeypatch.setattr(pipeline.run, "start_job", start_job)
    monkeypatch.setenv("PD_PIPELINE_CACHE", str(tmp_path / "cache"))
    before = signal.getsignal(signal.SIGTERM)
    yield handles
    signal.signal(signal.SIGTERM, before)


# Stand-ins for Slurm's commands, put first on PATH: the test Slurm comes up only for the
# slurm-marked tests (minutes, root). Everything before them is the real code: the checks, the
# run directories, submitit's SlurmExecutor writing each batch script and parsing sbatch's answer.
# sbatch keeps the script and answers as Slurm's does; srun must exist (submitit looks for it)
# and is never run (nothing runs the scripts).
_SBATCH = """#!/bin/sh
n=$(( $(ls "$SBATCH_LOG" | wc -l) + 100 ))
for script; do :; done
cp "$script" "$SBATCH_LOG/$n.sh"
echo "Submitted batch job $n"
"""


def test_multirun_on_slurm_submits_every_point_without_waiting(tmp_path):
    bin_dir, scripts = tmp_path / "bin", tmp_path / "sbatch"
    bin_dir.mkdir()
    scripts.mkdir()
    (bin_dir / "sbatch").write_text(_SBATCH)
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    # Nothing ever runs the jobs, so a launcher that waited for them would not return.
    p = run_pipeline("+job=summarize", "-m", "cluster=slurm", "pools.prefill=1,2", f"run.root={tmp_path / 'runs'}",
                     timeout=120, env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "SBATCH_LOG": str(scripts)})
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    # Submitted in order: point 0's decode job (100) and its prefill task (101), point 1's
    # decode job (102) and its array of two prefill tasks (103).
    assert "point 0: submitted jobs 101, 100 | pools.prefill=1" in p.stdout, p.stdout
    assert "point 1: submitted jobs 103_0, 103_1, 102 | pools.prefill=2" in p.stdout, p.stdout
    sent = {int(f.stem): f.read_text() for f in scripts.glob("*.sh")}
    assert sorted(sent) == [100, 101, 102, 103]
    options = {n: set(re.findall(r"^#SBATCH (\S+)$", text, re.M)) for n, text in sent.items()}
    # cluster=slurm's options on every job; the prefill tasks held until their point's decode job
    # has started; point 1's two tasks one array, both at once.
    for n in sent:
        assert {"--constraint=ib", "--cpus-per-task=8", "--gpus-per-task=1", "--mem=65536M", "--time=240",
                "--requeue", "--nodes=1"} <= options[n], options[n]
    assert {"--job-name=pd-decode-0"} <= options[100] and not any(o.startswith("--array") for o in options[100])
    assert {"--job-name=pd-prefill-0", "--dependency=after:100"} <= options[101]
    assert {"--job-name=pd-decode-1"} <= options[102]
    assert {"--job-name=pd-prefill-1", "--dependency=after:102", "--array=0-1%2"} <= options[103]
    # Each point's run directory was laid out and names its jobs; no job wrote a log.
    runs = sorted(tmp_path.glob("runs/summarize/*/*/jobs.json"))
    assert [r.parent.name for r in runs] == ["0", "1"]
    assert not list(tmp_path.glob("runs/**/*_log.out"))


def test_multirun_locally_runs_points_one_after_another_and_exits_with_the_worst(fake_start, tmp_path, capsys):
    from pipeline.__main__ import main

    status = main(["+job=summarize", "-m", "pools=colocated,disaggregated", f"run.root={tmp_path}"])
    captured = capsys.readouterr()
    assert status == 1, captured.out
    assert all(h.waited for h in fake_start) and len(fake_start) == 2
    assert "point 0: exit 1: run failed: prefill-0 failed" in captured.out
    assert "point 1: ok | pools=disaggregated" in captured.out
    assert "== multirun: 2 points, 1 ok" in captured.out


def test_submit_takes_the_same_overrides_and_a_sweep_returns_one_handle_per_point(tmp_path, monkeypatch):
    from pipeline.api import submit
    from pipeline.run import RunHandle

    monkeypatch.setenv("PD_PIPELINE_CACHE", str(tmp_path / "cache"))
    common = ["run.dry_run=true", f"run.root={tmp_path / 'runs'}"]
    one = submit("+job=summarize", "job.sampling.temperature=0.3", *common)
    assert isinstance(one, RunHandle) and one.cfg.job.sampling.temperature == 0.3
    for runs in (submit("-m", "job.sampling.temperature=0,0.7", *common),
                 submit("job.sampling.temperature=0,0.7", *common, multirun=True)):
        assert [r.cfg.job.sampling.temperature for r in runs] == [0.0, 0.7]
        assert [r.run_dir.name for r in runs] == ["0", "1"] and runs[0].run_dir.parent == runs[1].run_dir.parent
        assert all(r.plan is not None and r.nothing_to_do for r in runs)
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=r"^point 1 \(job.sampling.temperature=-1\)"):
        submit("-m", "job.sampling.temperature=0,-1", *common)


def test_joining_a_run_that_is_not_running_is_one_line_exit_2(tmp_path, capsys):
    from pipeline.__main__ import main

    assert main(["+job=summarize", "pools.prefill=+2"]) == 2
    assert "pools.prefill=+2 adds workers to a running run: name it with run.dir=" in capsys.readouterr().err
    assert main(["+job=summarize", f"run.dir={tmp_path}", "pools.prefill=+1"]) == 2
    assert "not a launched run directory" in capsys.readouterr().err
    for name in ("shards.json", "jobs.json", "stop"):
        (tmp_path / name).write_text("{}")
    assert main(["+job=summarize", f"run.dir={tmp_path}", "pools.prefill=+1"]) == 2
    err = capsys.readouterr().err
    assert f"that run has ended; run the job again with run.dir={tmp_path.resolve()} to resume it" in err, err
    assert not (tmp_path / "joined").exists()  # nothing was started
