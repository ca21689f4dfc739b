"""Tiny random-weight causal LMs for tests: real transformers models, float64 by default.

float64 keeps logits free of near-ties that batched and incremental forwards could
resolve differently, so a lossless test fails only when the algorithm is wrong. A large
`initializer_range` gives logits a scale of ~10, which makes greedy output fall into the
repeating loops that exercise both accepted and rejected drafts.

>>> m = tiny_model("llama", vocab_size=64, seed=1)
>>> m.config.model_type, m.dtype
('llama', torch.float64)
"""

from __future__ import annotations

from typing import Any, Literal

import torch

Arch = Literal["qwen2", "llama"]


def tiny_config(arch: Arch = "qwen2", vocab_size: int = 128, **overrides: Any) -> Any:
    from transformers import LlamaConfig, Qwen2Config

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, as in the default model
        max_position_embeddings=2048,
        initializer_range=0.15,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    common.update(overrides)
    config_cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[arch]
    return config_cls(**common)


def tiny_model(
    arch: Arch = "qwen2", vocab_size: int = 128, seed: int = 0, dtype: torch.dtype = torch.float64, **overrides: Any
) -> Any:
    """A randomly initialised `Qwen2ForCausalLM` or `LlamaForCausalLM` in eval mode."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch, vocab_size, **overrides)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()
