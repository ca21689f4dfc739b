"""Row-exact attention: a verify pass computes each row exactly as a decode step would.

Why. Lossless speculation needs the verify pass's logits for row i to equal those of
plain decoding at that position, bit for bit, or a near-tie can resolve differently.
Measured on the default model (bf16, CPU): final hidden states differed by up to 0.6
between a q=11 pass and 11 decode steps, and a FIM completion changed at a one-ULP
logit tie (17.375 vs 17.25). Two causes, both fixed here and in the verifier:
* attention: one query against a masked block of keys and the same query against its
  unmasked causal prefix sum in different orders;
* matmuls: bf16 linear layers give identical rows for any row count of two or more,
  but a single row takes a GEMV kernel with another summation order (the MLP's
  4864 -> 896 down projection differs by 1e-3). The verifier pads one-row passes to two.

How. During decode and verify passes (the verifier passes `codespec_rows=n`) every
real row i of a chain attends through one lean call, the same for a decode step and a
verify pass: one query position, no mask, keys sliced to its causal prefix. The
prefill, identical in both modes, keeps transformers' fused sdpa path. Cost: q small
attention calls per layer instead of one (docs/decisions.md has the numbers), which
buys output identical to `--no-spec` in bfloat16.

Only for models without sliding-window attention; others keep the masked path.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

NAME = "codespec_rows"
ROWS_FLAG = "codespec_rows"


def row_exact_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [batch, heads, q, dim]
    key: torch.Tensor,  # [batch, kv_heads, kv_len, dim], the pass's q positions last
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """sdpa for the prefill; one lean sdpa call per real row for decode and verify passes.

    `codespec_rows=n` marks the pass: rows 0..n-1 are a chain, rows past n are padding
    whose output is discarded (zeros here). A row's query heads are packed per KV head
    (grouped-query attention: the heads sharing a KV head are rows of one call)."""
    real_rows = kwargs.pop(ROWS_FLAG, 0)
    if not real_rows:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    batch, heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    out = query.new_zeros(batch, q_len, heads, dim)  # [batch, q, heads, dim], as transformers expects
    for i in range(real_rows):
        end = kv_len - (q_len - 1 - i)  # row i sees the cache and the chain up to itself
        packed = query[:, :, i].reshape(batch, kv_heads, heads // kv_heads, dim)
        rows = F.scaled_dot_product_attention(packed, key[:, :, :end], value[:, :, :end], scale=scaling)
        out[:, i] = rows.reshape(batch, heads, dim)
    return out, None


def install(model: Any) -> bool:
    """Switch `model` to row-exact attention when it supports it; True if it did."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    config = model.config
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager", NAME):
        return False
    AttentionInterface.register(NAME, row_exact_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return True
