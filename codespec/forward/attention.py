"""Attention over the KV slots, row-exact so that speculation changes no output.

Where the row decoder runs (decoder.py: Qwen2/Llama on rowgemm's CPUs) decode steps and
verify passes do not come here: it attends in C, each row over its own keys. This
module serves prefill chunks everywhere, and passes on every other model and machine.

The verifier packs every request's rows of a pass into one sequence (batch dimension
1) and hands this module a `Plan`: where each row's keys and values are written (slot,
position) and which keys each row attends to. The model's attention layers call
`slot_attention`, which reads the slots of `SlotCache`.

Why row-exact. Lossless speculation needs a verify pass's logits for row i to equal
those of plain decoding at that position, bit for bit, or a near-tie can resolve
differently. Measured on the default model (bf16, CPU): a FIM completion changed at a
one-ULP logit tie (17.375 vs 17.25). Two causes, both handled:
* attention: one query against a masked block of keys and the same query against its
  unmasked prefix sum in different orders. So in decode and verify passes every row
  attends in a way that does not depend on the rest of the pass: by default one call per
  chain of a request's tree, laid out so that every row meets the same kernel shapes
  (whole 512-key blocks, whole tokens per query block: rowcalls.py; a decode step is
  such a call with one row), or, where `rowcalls.probe` finds that layout does not keep
  rows exact, one lean call per row with exactly its keys (the decode step's own call);
* matmuls: bf16 linear layers give identical rows for row counts up to a machine's
  kernel switch (32 on an Intel VM, none up to 64 on an AVX-512 BF16 EPYC);
  rowblocks.py probes it and multiplies verify passes in blocks below it (row by row
  where even three rows break). A single row may take a GEMV kernel with another
  summation order, so the verifier pads one-row passes to two.
So a row's output depends only on its own token, position and keys: not on the batch,
the tree around it, or the draft length.

Prefill chunks (`Plan.prefill`) attend with one masked call per chunk; the chunk grid
is absolute (kvcache.py), so a reused prefix and a fresh prefill compute the same KV.

Sliding-window models are not supported: every row attends to its whole context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from codespec.forward import rowcalls

NAME = "codespec_slots"
PLAN_KEY = "codespec_plan"


@dataclass(frozen=True)
class Plan:
    cache: Any  # SlotCache
    write_slots: torch.Tensor  # [rows] int64
    write_positions: torch.Tensor  # [rows] int64
    prefill: tuple[int, int, int] | None = None  # (slot, start, rows): a prefill chunk
    prefill_mask: torch.Tensor | None = None  # [rows, start + rows] bool
    calls: tuple[rowcalls.Call, ...] = ()  # row-exact verify (rowcalls.py)


def slot_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, heads, rows, dim]
    key: torch.Tensor,  # [1, kv_heads, rows, dim] (already written to the slots)
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    plan: Plan | None = kwargs.pop(PLAN_KEY, None)
    if plan is None:  # a forward not driven by the verifier (e.g. model.generate): plain sdpa
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    keys = plan.cache.keys[module.layer_idx]  # [slots, kv_heads, slot_tokens, dim]
    values = plan.cache.values[module.layer_idx]
    _, heads, rows, dim = query.shape
    out = query.new_zeros(1, rows, heads, dim)  # [1, rows, heads, dim], as transformers expects
    if plan.prefill is not None:
        slot, start, n = plan.prefill
        span = slice(slot, slot + 1), slice(None), slice(0, start + n)
        attended = F.scaled_dot_product_attention(
            query, keys[span], values[span], attn_mask=plan.prefill_mask, scale=scaling, enable_gqa=True
        )
        return attended.transpose(1, 2), None
    scratch: tuple[int, torch.Tensor, torch.Tensor] | None = None  # (slot, keys, values)
    for call in plan.calls:
        if call.path is None:
            k = keys[call.slot : call.slot + 1, :, : call.keys]
            v = values[call.slot : call.slot + 1, :, : call.keys]
        else:
            # Tree rows off the main path attend to the context and their ancestors,
            # which are not contiguous in the slot. Copy the request's context once per
            # layer into a scratch buffer laid out like the slot, then write each call's
            # path (a chain's ancestors and itself) after it: one context copy per
            # request, not one per row (a gather per row made such rows cost ~2.5x a
            # chain row at 1k tokens of context).
            if scratch is None or scratch[0] != call.slot:
                scratch = (call.slot, keys.new_empty(1, *keys.shape[1:]), values.new_empty(1, *values.shape[1:]))
                scratch[1][:, :, : call.context] = keys[call.slot : call.slot + 1, :, : call.context]
                scratch[2][:, :, : call.context] = values[call.slot : call.slot + 1, :, : call.context]
            end = call.context + call.path.shape[0]
            scratch[1][:, :, call.context : end] = keys[call.slot : call.slot + 1].index_select(2, call.path)
            scratch[2][:, :, call.context : end] = values[call.slot : call.slot + 1].index_select(2, call.path)
            # masked padding must hold finite numbers: its zero weights times NaN are NaN
            scratch[1][:, :, end : call.keys] = 0
            scratch[2][:, :, end : call.keys] = 0
            k, v = scratch[1][:, :, : call.keys], scratch[2][:, :, : call.keys]
        answered = slice(call.first_row, call.first_row + call.rows)
        out[0, answered] = rowcalls.attend(query[0, :, answered], k, v, call, scaling)
    return out, None


def uses_sliding_window(config: Any) -> bool:
    return bool(getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True))


def install(model: Any) -> None:
    """Route `model`'s attention through the slots (every pass then needs a Plan)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, slot_attention)
    # forwards the verifier does not drive (model.generate) fall back to sdpa: give them sdpa's masks
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
