"""``python -m pipeline.plan``: see :func:`pipeline.plan.cli.main`."""

import sys

from pipeline.plan.cli import main

sys.exit(main())
