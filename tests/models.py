"""Small models of other architectures for the tests, made from a config with random weights
(transformers ``from_config``, seeded; DESIGN.md section 2d): nothing is fetched and nothing
binary is committed. Each uses the bundled model's tokenizer (vocabulary 49,152) and its chat
template, so the same prompts run on every model; its initial weights are scaled up (x4) so that
greedy picks stay away from near-ties and float32 runs compare token for token.

``python -m tests.models NAME DIR`` writes one to ``DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

VOCAB = 49152

# name -> (transformers model type, config fields). Shapes chosen for what each stands for.
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    # Qwen2-style: attention bias on q/k/v, 2 KV heads (TP 2 per pool possible).
    "qwen2-bias": ("qwen2", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)),
    # Mistral-style sliding window shorter than the prompts (a few hundred tokens).
    "mistral-window": ("mistral", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, sliding_window=64,
                                       max_position_embeddings=4096)),
    # 8 KV heads of head dim 128 (TP 2, 4 and 8 divide), as Llama 3 8B/70B have.
    "llama-kv8-hd128": ("llama", dict(hidden_size=1024, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=8, head_dim=128,
                                      max_position_embeddings=4096)),
    # A head dim that is not hidden size / heads (Qwen3: 128 hidden, 4 heads, head dim 64).
    "qwen3-headdim": ("qwen3", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                    max_position_embeddings=2048)),
}


def make_model(name: str, folder: Path, seed: int = 0) -> Path:
    """Write the test model ``name`` (a key of :data:`ARCHITECTURES`) to ``folder`` in float32
    safetensors with the bundled tokenizer; returns ``folder``. Deterministic for a seed."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from pipeline.config import compose
    from pipeline.engine.model import load_tokenizer

    model_type, fields = ARCHITECTURES[name]
    tokenizer = load_tokenizer(compose(["+job=summarize"]))
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, tie_word_embeddings=True,
                                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                  torch_dtype="float32", **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    make_model(sys.argv[1], Path(sys.argv[2]))
