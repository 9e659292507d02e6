"""pd-pipeline: offline batch inference with disaggregated prefill and decode."""

__version__ = "0.1.0"
