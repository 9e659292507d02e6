"""The manual (README.md, docs/) against the code: the configuration reference is what the schema
generates, every relative link points at a file and heading that exist, and every block marked
runnable runs (as a dry run: nothing starts). How to mark a block: docs/development.md."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config.reference import reference

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^(\s*)<!-- runnable((?:\s+\w+=\S+)*)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+)(\w*)\s*$")
# words that start a command, and the `python -m pipeline` command they are
COMMANDS = {"pipeline": [], "pipeline.plan": ["plan"], "pipeline.status": ["status"],
            "pipeline.report": ["report"], "pipeline.model.prepare": ["prepare-model"]}
INFO_FLAGS = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i"}


def test_reference_is_current():
    page = (ROOT / "docs" / "reference.md").read_text()
    assert page == reference(), ("docs/reference.md is out of date: run "
                                 "python -m pipeline.config.reference > docs/reference.md")


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens,
    ``-1``, ``-2`` ... after a repeated one."""
    out, seen, fenced = set(), {}, False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*)$", line)):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_points_at_a_file_and_heading():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no heading #{anchor} in {dest.name}")
    assert not broken, "\n".join(broken)


def blocks(page: Path) -> list[tuple[int, dict[str, str], str]]:
    """(line, marker options, text) of each fenced block right after a ``<!-- runnable -->``."""
    lines = page.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        options = dict(o.split("=", 1) for o in m.group(2).split())
        j = i + 1
        fence = FENCE.match(lines[j]) if j < len(lines) else None
        assert fence, f"{page.name}:{i + 1}: a runnable marker must be followed by a fenced block"
        indent, ticks = fence.group(1), fence.group(2)
        body = []
        for k in range(j + 1, len(lines)):
            if lines[k].strip() == ticks:
                break
            body.append(lines[k][len(indent):] if lines[k].startswith(indent) else lines[k])
        out.append((j + 1, options, "\n".join(body) + "\n"))
    return out


def commands(text: str) -> list[list[str]]:
    """Each command of a bash block, as words: continuation lines joined, comments dropped."""
    return [w for w in (shlex.split(c, comments=True) for c in text.replace("\\\n", " ").splitlines()) if w]


def pipeline_argv(words: list[str], runs: Path) -> list[str]:
    """The ``python -m pipeline`` arguments that check ``words`` without starting anything: a
    job run becomes a dry run under ``runs``; a command given a placeholder (``RUN_DIR``) its
    ``--help``."""
    if words[0] == "pd-pipeline":
        args = words[1:]
    elif len(words) >= 3 and words[0].endswith("python") and words[1] == "-m" and words[2] in COMMANDS:
        args = COMMANDS[words[2]] + words[3:]
    else:
        raise AssertionError(f"not a pipeline command: {shlex.join(words)}")
    if args and args[0] in ("plan", "status", "report", "prepare-model"):
        placeholder = any(re.fullmatch(r"[A-Z][A-Z_]+", a) for a in args[1:])
        return args[:1] + ["--help"] if placeholder or args[0] == "prepare-model" else args
    if INFO_FLAGS & set(args) or not any(a.startswith("+job=") for a in args):
        return args
    return args + ["run.dry_run=true", f"run.root={runs}"]


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: p.name)
def test_runnable_blocks_run(page, tmp_path):
    """Each page's runnable blocks in order, in a folder of their own that sees the checkout's
    ``data/`` and ``conf/``: a ``file=PATH`` block is written there, a ``cd`` moves into a
    folder, every other line is a pipeline command that must end with the block's ``exit``
    status (0 unless marked)."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("data", "conf"):
        (work / name).symlink_to(ROOT / name)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PD_PIPELINE_CACHE": str(tmp_path / "cache")}
    failed = []
    for line, options, text in blocks(page):
        if "file" in options:
            dest = work / options["file"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
            continue
        cwd = work
        for words in commands(text):
            if words[0] == "cd":
                cwd = cwd / words[1]
                continue
            argv = pipeline_argv(words, tmp_path / "runs")
            p = subprocess.run([sys.executable, "-m", "pipeline", *argv], cwd=cwd, env=env,
                               capture_output=True, text=True, timeout=120)
            if p.returncode != int(options.get("exit", 0)):
                failed.append(f"{page.name}:{line}: {shlex.join(words)} -> exit {p.returncode}\n{p.stderr[-800:]}")
    assert not failed, "\n".join(failed)
