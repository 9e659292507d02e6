"""The Python API page (docs/api.md) and the command-line page (docs/cli.md), generated from the
code: signatures and docstrings (``inspect``) of what ``pipeline`` exports and what it returns,
and the ``--help`` of ``pd-pipeline`` and of each of its commands (their argparse parsers).

``python -m tools.manual api > docs/api.md`` and ``python -m tools.manual cli > docs/cli.md``
regenerate the pages (from the checkout's root); ``tests/test_manual.py`` fails when a page
differs from what this prints. It lives in tools/, not in the package: it imports the package's
entry points, the top of its layers (tests/test_layers.py).

Help text is formatted for a fixed width (:data:`COLUMNS`), without colour, so the pages do not
depend on the terminal they were made in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import io
import os
import re
import signal
import sys
import textwrap

COLUMNS = 100  # argparse's help width is this minus 2
# (section title, module, the word after pd-pipeline) of each command, in the order of the page
COMMANDS = [("status", "pipeline.status"), ("plan", "pipeline.plan.cli"), ("report", "pipeline.report.cli"),
            ("prepare-model", "pipeline.model.prepare")]
SECTION = re.compile(r"^(Args|Arguments|Returns|Raises|Yields):\s*$")


def markdown(doc: str | None) -> str:
    """A docstring as Markdown: ``x`` and :role:`x` to `x` (``~a.b`` to `b`), a ``::`` block
    to a fenced Python block, and an ``Args:`` / ``Returns:`` / ``Raises:`` section to a list."""
    if not doc:
        return ""
    text = re.sub(r":\w+:`(~?)([^`]*)`", lambda m: f"``{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}``",
                  inspect.cleandoc(doc))
    text = re.sub(r"``((?:(?!``|\n\s*\n).)+?)``", lambda m: "`" + " ".join(m.group(1).split()) + "`", text, flags=re.S)
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if SECTION.match(line):
            out += ["", f"**{line.strip().rstrip(':')}:**", ""]
            i += 1
            entries: list[str] = []
            named = line.strip() in ("Args:", "Arguments:", "Raises:")  # else one paragraph
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                item = lines[i].strip()
                if item and (not entries or named and len(lines[i]) - len(lines[i].lstrip()) <= 4):
                    entries.append(item)
                elif item:
                    entries[-1] += " " + item
                i += 1
            if not named:
                out[-2] += " " + " ".join(entries)
            for entry in entries if named else []:
                name, sep, rest = entry.partition(": ")
                out.append(f"- `{name}`: {rest}" if sep and " " not in name else f"- {entry}")
            out.append("")
            continue
        if line.rstrip().endswith("::") and i + 1 < len(lines):
            out.append(line.rstrip()[:-1])
            i += 1
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                block.append(lines[i])
                i += 1
            out += ["", "```python", *textwrap.dedent("\n".join(block)).strip("\n").splitlines(), "```", ""]
            continue
        out.append(line)
        i += 1
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip("\n")


class _Annotation:
    """An annotation kept as the source wrote it (``from __future__ import annotations``)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def signature(name: str, func) -> str:
    """``name(params) -> return`` with the annotations as written in the source."""
    sig = inspect.signature(func)
    def plain(a):
        return a if a is inspect.Parameter.empty else _Annotation(a if isinstance(a, str) else inspect.formatannotation(a))
    sig = sig.replace(parameters=[p.replace(annotation=plain(p.annotation)) for p in sig.parameters.values()
                                  if p.name != "self"], return_annotation=plain(sig.return_annotation))
    return f"{name}{sig}"


def _block(code: str, lang: str = "python") -> list[str]:
    return ["", f"```{lang}", code.rstrip("\n"), "```", ""]


def _function(title: str, name: str, func) -> list[str]:
    return [f"## `{title}`", *_block(signature(name, func)), markdown(func.__doc__), ""]


def _members(cls) -> list[str]:
    """Each public method and property of ``cls``, in the order of its source."""
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            ret = inspect.signature(member.fget).return_annotation
            typ = "" if ret is inspect.Parameter.empty else f": {ret}"
            out += [f"### `{cls.__name__}.{name}`", *_block(f"{cls.__name__}.{name}{typ}  # property"),
                    markdown(member.fget.__doc__), ""]
        elif inspect.isfunction(member):
            out += [f"### `{cls.__name__}.{name}()`", *_block(signature(f"{cls.__name__}.{name}", member)),
                    markdown(member.__doc__), ""]
    return out


def _field_comments(cls) -> dict[str, str]:
    """Each dataclass field's comment in the source: the comment lines right above it and the
    one on its line."""
    lines = inspect.getsource(cls).splitlines()
    out = {}
    for f in dataclasses.fields(cls):
        i = next(i for i, ln in enumerate(lines) if re.match(rf"\s+{f.name}\s*:", ln))
        above = []
        for ln in reversed(lines[:i]):
            if not ln.strip().startswith("#"):
                break
            above.insert(0, ln.strip().lstrip("#").strip())
        _, _, own = lines[i].partition("  # ")
        out[f.name] = " ".join(above + ([own.strip()] if own else []))
    return out


def _class(cls, fields: bool = False) -> list[str]:
    out = [f"## `{cls.__name__}`", "", markdown(cls.__doc__), ""]
    if fields:
        comments = _field_comments(cls)
        out += ["Fields:", ""] + [f"- `{f.name}: {f.type}`" + (f": {markdown(comments[f.name])}" if comments[f.name] else "")
                                  for f in dataclasses.fields(cls)] + [""]
    return out + _members(cls)


def api() -> str:
    """docs/api.md, Markdown."""
    import pipeline
    from pipeline import api as api_module
    from pipeline.launch.watch import RunFailed
    from pipeline.run import RunHandle, Summary

    out = ["# Python API", "",
           "<!-- Generated by `python -m tools.manual api > docs/api.md` from the docstrings of",
           "pipeline/api.py and pipeline/run.py; edit those, not this page. -->", "",
           markdown(api_module.__doc__), "",
           f"`{pipeline.__name__}` exports `submit` and `join` (`pipeline.api`'s, below). A run's",
           "settings are the configuration's keys ([reference](reference.md)).", ""]
    out += _function("submit", "submit", api_module.submit)
    out += _function("join", "join", api_module.join)
    out += _class(RunHandle)
    out += _class(Summary, fields=True)
    out += _class(RunFailed)
    out += _function("sweep", "pipeline.api.sweep", api_module.sweep)
    out += _class(api_module.Point, fields=True)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip("\n") + "\n"


@contextlib.contextmanager
def _fixed_terminal():
    """Help formatted for :data:`COLUMNS` columns, without colour."""
    saved = {k: os.environ.get(k) for k in ("COLUMNS", "NO_COLOR")}
    os.environ.update(COLUMNS=str(COLUMNS), NO_COLOR="1")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _main_help() -> str:
    """``pd-pipeline --help`` as it prints it (its SIGTERM handler put back afterwards)."""
    from pipeline.__main__ import main

    handler = signal.getsignal(signal.SIGTERM)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            status = main(["--help"])
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert status == 0, "pd-pipeline --help failed"
    return buf.getvalue()


def _exit_status(doc: str | None) -> str:
    """The ``Exit status ...`` sentences of a ``main`` docstring."""
    m = re.search(r"[Ee]xit status:?\s*(.*)", " ".join((doc or "").split()))
    return f"Exit status: {markdown(m.group(1))}" if m else ""


def cli() -> str:
    """docs/cli.md, Markdown."""
    from pipeline import __main__ as entry

    with _fixed_terminal():
        main_help = _main_help()
        helps = [(word, importlib.import_module(module)) for word, module in COMMANDS]
        helps = [(word, mod, mod.parser().format_help()) for word, mod in helps]
    out = ["# Command line", "",
           "<!-- Generated by `python -m tools.manual cli > docs/cli.md` from the commands' own",
           "--help (pipeline/__main__.py, status.py, plan/cli.py, report/cli.py, model/prepare.py);",
           "edit those, not this page. -->", "",
           "`pd-pipeline` (the command the package installs) is `python -m pipeline`: the same",
           "arguments, output and exit statuses. Its first word is either an override (a run) or one",
           "of the commands below. Each section is the command's `--help` as it prints it.", "",
           "Commands: " + ", ".join(f"[`{w}`](#pd-pipeline-{w})" for w, _ in COMMANDS) + ".", "",
           "## `pd-pipeline`", "",
           "A run: `pd-pipeline +job=NAME [group=option ...] [key=value ...] [flags]`, a Hydra",
           "application. `--dry-run` checks everything and prints what would run, starting nothing;",
           "`--cfg job` prints the composed configuration; `-m` runs a sweep. Every key is in the",
           "[configuration reference](reference.md).", "",
           _exit_status(entry.main.__doc__), *_block(main_help, "text")]
    for word, mod, text in helps:
        out += [f"## `pd-pipeline {word}`", "",
                f"The same as `python -m {mod.__name__.removesuffix('.cli')}`. {_exit_status(mod.main.__doc__)}",
                *_block(text, "text")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip("\n") + "\n"


PAGES = {"api": api, "cli": cli}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in PAGES:
        print("usage: python -m tools.manual api|cli  (prints docs/api.md or docs/cli.md)", file=sys.stderr)
        return 2
    sys.stdout.write(PAGES[argv[0]]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
