"""The report of the synthetic run (:data:`tests.report.synthetic.REQUESTS` and ``STEPS``),
written once and read by the tests of its files and of its numbers."""

from __future__ import annotations

import pytest

from pipeline.report.write import write_report
from tests.report.synthetic import make_run


@pytest.fixture(scope="session")
def report(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("run"))
    return run, write_report(run)
