"""pd-pipeline: offline batch inference with disaggregated prefill and decode."""

__version__ = "0.1.0"


def submit(*overrides: str, **kwargs):
    """Launch a job from Python; see :func:`pipeline.api.submit`."""
    from pipeline.api import submit as _submit

    return _submit(*overrides, **kwargs)
