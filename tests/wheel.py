"""A wheel built from this checkout, installed into a fresh virtualenv that sees this
interpreter's dependencies (not its editable pd-pipeline), run as ``pd-pipeline`` from a directory
outside the checkout: :func:`install_wheel`, built once per session (``tests.conftest.installed``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.helpers import ROOT


class Installed:
    """The wheel, the venv it is installed in, and a working directory outside the checkout."""

    def __init__(self, base: Path):
        self.base = base
        self.venv = base / "venv"
        self.work = base / "work"
        self.wheel: Path | None = None

    @property
    def site(self) -> Path:
        return next((self.venv / "lib").glob("python*/site-packages"))

    def run(self, *args: str, timeout: float = 120, empty_cache: bool = True) -> subprocess.CompletedProcess:
        """``pd-pipeline ARGS`` (the console script the wheel installed) from :attr:`work`;
        ``empty_cache``: with a cache of its own, empty (no tokenizer loaded), else the user's
        (the converted model, for a real run)."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        if empty_cache:
            env["PD_PIPELINE_CACHE"] = str(self.base / "cache")
        return subprocess.run([str(self.venv / "bin" / "pd-pipeline"), *args], cwd=self.work, env=env,
                              capture_output=True, text=True, timeout=timeout)


def install_wheel(base: Path) -> Installed:
    """Build the wheel of this checkout and install it into a fresh venv under ``base``."""
    inst = Installed(base)
    # Build from a copy of what the wheel is made of, so the build leaves nothing in the checkout.
    src = inst.base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "pipeline", src / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = inst.base / "wheels"
    # This venv's setuptools when it is recent enough (no index needed), else pip's isolated build.
    isolation = ["--no-build-isolation"] if _has_setuptools(77) else []
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", *isolation, "-q",
                    "-w", str(wheels)], check=True, capture_output=True, timeout=300)
    (inst.wheel,) = wheels.glob("pd_pipeline-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(inst.venv)], check=True, timeout=120)
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (inst.site / "_main_venv_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(inst.venv / "bin" / "python"), "install",
                    "--no-deps", "-q", str(inst.wheel)], check=True, capture_output=True, timeout=300)
    inst.work.mkdir()
    return inst


def _has_setuptools(major: int) -> bool:
    """setuptools >= ``major`` is importable here (pyproject's build requirement)."""
    from importlib.metadata import PackageNotFoundError, version

    try:  # its metadata, not an import: importing setuptools replaces distutils for the session
        return int(version("setuptools").split(".")[0]) >= major
    except PackageNotFoundError:
        return False
