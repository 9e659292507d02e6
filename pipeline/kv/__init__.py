"""KV cache layout and transfer parameters."""
