"""Row-exact attention in few calls, with one kernel shape for every row of every pass.

attention.py needs every row of a verify pass to get, bit for bit, the attention output
of the decode step it stands for. The plain way is one call per row with exactly its
keys ("lean" calls): each row then runs the very call its decode step runs, but a
33-row draft makes 33 calls per layer, each re-reading the request's whole context.

A call can answer many rows at once if no row's result depends on what else is in the
call. torch's CPU flash attention is a loop of small GEMMs: for each block of up to
`Q_BLOCK` query rows (while a call has fewer than `Q_SPLIT_LIMIT`), for each block of
`KEY_BLOCK` keys, scores = q @ k.T, an online-softmax update, and acc += p @ v. The GEMM
shapes, and with them the kernels' summation orders, follow the call's query rows and
its key count. Measured on an AMD EPYC (avx512_bf16, torch 2.13): keys padded only to a
multiple of 32 left a short last key block whose length varied with the pass, and a
token's query heads straddling two 32-row query blocks met a tail block of another
size; either changed a row's bits (20 of 6,650 rows at contexts past 1.2k).

So every padded call is laid out so that a row only ever meets the same GEMM shapes:
* keys are padded to whole `KEY_BLOCK` blocks (`padded_length`): every key block is full,
  and a block a row may not see at all is masked to -inf, which adds exactly nothing to
  the online softmax (the running sum times exp(0) = 1, plus zeros);
* a token's query heads fill `head_slots(group)` rows, a power of two that divides
  `Q_BLOCK` (the default model: 7 heads -> 8 rows, the eighth a zero query), so a token
  never straddles query blocks and a query block holds 1..Q_BLOCK/slots whole tokens;
* a call holds at most `tokens_per_element` tokens per batch element (fewer than
  `Q_SPLIT_LIMIT` query rows, so the kernel keeps `Q_BLOCK`-row query blocks); a longer
  chain is split into balanced batch elements that share the keys (a stride-0 view).
What is left to vary is how many whole tokens a query block holds and at which offset a
token sits: a finite set that `probe` checks exhaustively on the machine at hand (every
block size, every offset, one to several key blocks, one or more batch elements). Where
it fails, the verifier uses lean calls, whose shapes equal the decode step's by
construction (plain decoding then runs lean calls too: the reference moves with it).

Rows on the request's main path (the chain from the pending token) see a prefix of the
slot, so they share one call. A tree row off the main path sees the context and its own
ancestors, scattered in the slot: its chain (the rows below it that follow first
children, consecutive in the tree's depth-first order) attends in one call to a scratch
copy with the keys laid out as decoding would have them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

# the torch-free layout arithmetic lives in rowplan.py
from codespec.forward.rowplan import Q_BLOCK, head_slots, padded_length, tokens_per_element


@dataclass(frozen=True)
class Call:
    """One attention call answering packed rows first_row .. first_row + rows - 1."""

    slot: int
    first_row: int
    rows: int
    keys: int  # the call reads slot positions [0, keys) ...
    mask: torch.Tensor | None = None  # [elements, 1, tokens * slots, keys] additive (-inf: unseen); None: lean
    path: torch.Tensor | None = None  # ... or [0, context) and these positions (a chain off the main path)
    context: int = 0
    elements: int = 1  # batch elements of a padded call ...
    tokens: int = 1  # ... each holding this many token positions (the last ones may be padding)


def plan_calls(requests: Sequence[tuple[int, int, Any]], *, padded: bool, group: int,
               dtype: torch.dtype, device: Any) -> tuple[Call, ...]:
    """The calls of one verify pass. `requests`: (slot, slot length before the pass, tree)
    in packing order; `group`: query heads per KV head. Padded: one call per chain of
    the tree (`chains`); the main path reads the slot, every other chain a scratch copy
    of the context followed by its ancestors and itself. Lean: one call per row."""
    calls: list[Call] = []
    first = 0
    for slot, start, tree in requests:
        for begin, end in tree.chains():
            # the main path reads the slot; another chain a scratch copy: the context,
            # then its path (ancestors, then the chain itself)
            path = None if begin == 0 else torch.tensor(tree.path(end - 1), device=device) + start
            first_seen = start + tree.depths[begin] + 1  # the chain's row j sees first_seen + j keys
            if padded:
                calls.append(_chain_call(slot, first + begin, end - begin, first_seen, group, dtype, device,
                                         path, start))
            else:
                calls.extend(Call(slot, first + begin + j, 1, first_seen + j, None,
                                  None if path is None else path[: first_seen + j - start], start)
                             for j in range(end - begin))
        first += len(tree)
    return tuple(calls)


def _chain_call(slot: int, first_row: int, rows: int, first_seen: int, group: int, dtype: torch.dtype,
                device: Any, path: torch.Tensor | None = None, context: int = 0) -> Call:
    """A padded call for `rows` consecutive rows of a chain, row j seeing first_seen + j keys."""
    elements = -(-rows // tokens_per_element(group))
    tokens = -(-rows // elements)  # balanced: elements * tokens >= rows, the rest padding
    seen = first_seen + torch.arange(elements * tokens, device=device)
    seen[rows:] = 1  # padding tokens see one key: a finite softmax, discarded
    keys = padded_length(first_seen + rows - 1)
    return Call(slot, first_row, rows, keys, _mask(seen, keys, elements, head_slots(group), dtype), path, context,
                elements, tokens)


def _mask(seen: torch.Tensor, keys: int, elements: int, slots: int, dtype: torch.dtype) -> torch.Tensor:
    allowed = torch.arange(keys, device=seen.device)[None, :] < seen[:, None]  # [tokens, keys]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=seen.device).masked_fill(~allowed, float("-inf"))
    tokens = seen.shape[0] // elements
    # every query row of a token (its heads and their padding) sees the token's keys
    return mask.view(elements, 1, tokens, 1, keys).expand(-1, -1, -1, slots, -1).reshape(
        elements, 1, tokens * slots, keys)


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, call: Call,
           scale: float | None) -> torch.Tensor:
    """One call: query [heads, rows, dim] (this call's rows), keys/values [1, kv_heads,
    call.keys, dim]; returns [rows, heads, dim]. Lean calls pack a row's query heads as
    the rows of one product; padded calls lay each token out in `head_slots` rows."""
    heads, rows, dim = query.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    if call.mask is None:
        packed = query.view(kv_heads, group, rows, dim).transpose(1, 2).reshape(1, kv_heads, rows * group, dim)
        out = F.scaled_dot_product_attention(packed, keys, values, scale=scale)
        return out.view(kv_heads, rows, group, dim).transpose(0, 1).reshape(rows, heads, dim)
    slots, elements, tokens = head_slots(group), call.elements, call.tokens
    laid = query.new_zeros(kv_heads, slots, elements * tokens, dim)  # [kv_heads, slots, tokens, dim]
    laid[:, :group, :rows] = query.view(kv_heads, group, rows, dim)
    laid = laid.view(kv_heads, slots, elements, tokens, dim).permute(2, 0, 3, 1, 4).reshape(
        elements, kv_heads, tokens * slots, dim)
    out = F.scaled_dot_product_attention(
        laid, keys.expand(elements, -1, -1, -1), values.expand(elements, -1, -1, -1), attn_mask=call.mask,
        scale=scale)  # [elements, kv_heads, tokens * slots, dim]
    out = out.view(elements, kv_heads, tokens, slots, dim)[:, :, :, :group]
    return out.permute(0, 2, 1, 3, 4).reshape(elements * tokens, heads, dim)[:rows]


# Where the probe puts a chain's pending token: around key-block edges, so rows of one
# call span one to four key blocks and cross block boundaries within the call.
PROBE_STARTS = (0, 5, 470, 505, 1000, 1020, 1530, 2040)


@torch.inference_mode()
def probe(dtype: torch.dtype, device: Any, kv_heads: int, group: int, dim: int) -> bool:
    """Whether padded calls give every row the bits its one-row (decode) call gives, for
    this head layout on this machine. Exhaustive over what a padded call can vary: every
    number of tokens in a query block and every offset of a token in it (chains of 1 to
    2 * Q_BLOCK / slots rows), calls of several batch elements, and one to four key blocks."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    per_element = tokens_per_element(group)
    lengths = sorted({*range(2, 2 * Q_BLOCK // head_slots(group) + 1), per_element, per_element + 1,
                      2 * per_element + 3})
    longest = max(PROBE_STARTS) + max(lengths) + 1

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device, dtype)

    keys, values = rand(1, kv_heads, padded_length(longest), dim), rand(1, kv_heads, padded_length(longest), dim)
    queries = rand(kv_heads * group, max(lengths), dim)

    def call(start: int, first: int, rows: int) -> torch.Tensor:
        # rows first..first+rows-1 of a chain whose pending token sits at `start`
        c = _chain_call(0, 0, rows, start + first + 1, group, dtype, device)
        return attend(queries[:, first : first + rows], keys[:, :, : c.keys], values[:, :, : c.keys], c, None)

    for start in PROBE_STARTS:
        alone = torch.cat([call(start, i, 1) for i in range(max(lengths))])
        for rows in lengths:
            if not torch.equal(call(start, 0, rows), alone[:rows]):
                return False
    return True
