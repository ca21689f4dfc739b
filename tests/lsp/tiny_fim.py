"""A tiny random-weight Qwen2 model on disk with a byte-level tokenizer that has the FIM
and repository tokens: `codespec lsp --model DIR` serves it in seconds on any CPU, so the
language server's protocol behaviour (every request answered, bounded resources) is
tested in the default suite, without the default model."""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|repo_name|>", "<|file_sep|>"]


def tiny_fim_model(path: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from tests.tiny import tiny_model

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL)
    vocab = tokenizer.get_vocab_size()
    model = tiny_model("qwen2", vocab_size=vocab, seed=3, dtype=torch.bfloat16, hidden_size=128,
                       num_attention_heads=2, num_key_value_heads=1, intermediate_size=256,
                       max_position_embeddings=8192)
    model.generation_config.eos_token_id = tokenizer.token_to_id("<|endoftext|>")
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
        "additional_special_tokens": SPECIAL[1:]}))
    return path
