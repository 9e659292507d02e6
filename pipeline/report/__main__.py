"""``python -m pipeline.report``: see :mod:`pipeline.report.cli`."""

import sys

from pipeline.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
