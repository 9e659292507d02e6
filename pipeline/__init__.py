"""pd-pipeline: offline batch inference with disaggregated prefill and decode."""

__version__ = "0.1.0"


def submit(*overrides: str, **kwargs):
    """Launch a job from Python; see :func:`pipeline.api.submit`."""
    from pipeline.api import submit as _submit

    return _submit(*overrides, **kwargs)


def join(run_dir, workers: int = 1):
    """Add workers to a running run; see :func:`pipeline.api.join`."""
    from pipeline.api import join as _join

    return _join(run_dir, workers)
