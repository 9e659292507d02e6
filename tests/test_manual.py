"""The Python API page (docs/api.md) and the command-line page (docs/cli.md) are what
``tools/manual.py`` generates from the code: docstrings and signatures, and each command's
``--help``. No engine starts (about a second)."""

from __future__ import annotations

import os
import re

import pytest

from tests.helpers import ROOT
from tools import manual


@pytest.mark.parametrize("name", sorted(manual.PAGES))
def test_page_is_current(name):
    page = (ROOT / "docs" / f"{name}.md").read_text()
    assert page == manual.PAGES[name](), (f"docs/{name}.md is out of date: run "
                                          f"python -m tools.manual {name} > docs/{name}.md")


def test_the_pages_do_not_depend_on_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert manual.cli() == (ROOT / "docs" / "cli.md").read_text()
    assert os.environ["COLUMNS"] == "40" and "NO_COLOR" not in os.environ  # put back


@pytest.mark.parametrize("name", sorted(manual.PAGES))
def test_no_sphinx_markup_is_left(name):
    text = re.sub(r"^```.*?^```$", "", (ROOT / "docs" / f"{name}.md").read_text(), flags=re.S | re.M)
    for mark in ("``", ":func:", ":class:", ":mod:", ":meth:", ":data:", "::\n"):
        assert mark not in text, mark


def test_an_unknown_page_is_refused(capsys):
    assert manual.main(["bogus"]) == 2
    assert "api|cli" in capsys.readouterr().err
