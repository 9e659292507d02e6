"""Model resolution: turn a model config into a local model directory vLLM can load."""

from pipeline.model.resolve import resolve_model_path

__all__ = ["resolve_model_path"]
