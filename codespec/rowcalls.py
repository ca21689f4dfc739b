"""Row-exact attention in few calls: one masked call per request instead of one per row.

attention.py needs every row of a verify pass to get, bit for bit, the attention output
of the decode step it stands for. The plain way is one call per row with exactly its
keys ("lean" calls): a 33-row draft then makes 33 calls per layer, each re-reading the
request's whole context (~40 us at 500 keys, ~75 us at 1.2k on the reference machine).

A call can answer many rows at once if each row's result does not depend on the others
or on how many keys the call holds. CPU flash attention (torch 2.13, bf16) gives that
when the keys are padded: every call attends to `padded_length(n)` keys (a multiple of
32, at least 512) and masks what a row may not see with -inf. The padding adds exact
zeros in whole vector lanes and never changes the 512-key blocks the kernel walks, so a
row gets the same bits alone (its own keys padded) or in a call with its request's
other rows; a plain decode step is such a call with one row. Measured: 3,196 rows
(contexts 3..2,000 keys, 1..33 rows a call) all equal; without the padding, or with a
multiple of 16, some differ. Costs at 1.2k keys, 7 query heads per KV head: 3 rows in
one call 60 us vs 116 us lean; 32 rows 268 vs 1,294 us; 1 row 46 vs 39 us.

Rows on the request's main path (the chain from the pending token) see a prefix of the
slot, so they share one call. A tree row off the main path sees the context and its own
ancestors, scattered in the slot: its chain (the rows below it that follow first
children, consecutive in the tree's depth-first order) attends in one call to a scratch
copy with the keys laid out as decoding would have them.

The invariance is a property of kernels, not of mathematics, so `probe` checks it on
the machine at hand (model dtype, head layout, device) and the verifier falls back to
lean calls where it fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

PAD_MULTIPLE = 32  # keys per call: a multiple of the widest vector the kernel sums over ...
MIN_KEYS = 512  # ... and at least one whole block of the kernel's key loop


def padded_length(keys: int) -> int:
    """Keys a padded call attends to when its longest row sees `keys`.

    >>> [padded_length(n) for n in (1, 512, 513, 1200)]
    [512, 512, 544, 1216]
    """
    return max(MIN_KEYS, -(-keys // PAD_MULTIPLE) * PAD_MULTIPLE)


@dataclass(frozen=True)
class Call:
    """One attention call answering packed rows first_row .. first_row + rows - 1."""

    slot: int
    first_row: int
    rows: int
    keys: int  # the call reads slot positions [0, keys) ...
    mask: torch.Tensor | None = None  # [rows * group, keys] additive (-inf: unseen); None: lean
    path: torch.Tensor | None = None  # ... or [0, context) and these positions (a chain off the main path)
    context: int = 0


def chains(tree: Any) -> list[tuple[int, int]]:
    """The tree's rows as chains [start, end): runs in which each node is its
    predecessor's child. Depth-first order makes every chain consecutive; the first is
    the main path, each other one starts at a node that is not its parent's first child.

    >>> from codespec.tree import VerifyTree
    >>> chains(VerifyTree((9, 1, 2, 3, 4, 5), (-1, 0, 1, 0, 3, 1), (0, 1, 2, 1, 2, 2), ()))
    [(0, 3), (3, 5), (5, 6)]
    """
    found, begin = [], 0
    for node in range(1, len(tree)):
        if tree.parents[node] != node - 1:
            found.append((begin, node))
            begin = node
    found.append((begin, len(tree)))
    return found


def plan_calls(requests: Sequence[tuple[int, int, Any]], *, padded: bool, group: int,
               dtype: torch.dtype, device: Any) -> tuple[Call, ...]:
    """The calls of one verify pass. `requests`: (slot, slot length before the pass, tree)
    in packing order; `group`: query heads per KV head. Padded: one call per chain of
    the tree (`chains`); the main path reads the slot, every other chain a scratch copy
    of the context followed by its ancestors and itself. Lean: one call per row."""
    calls: list[Call] = []
    first = 0
    for slot, start, tree in requests:
        for begin, end in chains(tree):
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
    seen = first_seen + torch.arange(rows, device=device)
    keys = padded_length(first_seen + rows - 1)
    return Call(slot, first_row, rows, keys, _mask(seen, keys, group, dtype), path, context)


def _mask(seen: torch.Tensor, keys: int, group: int, dtype: torch.dtype) -> torch.Tensor:
    allowed = torch.arange(keys, device=seen.device)[None, :] < seen.repeat_interleave(group)[:, None]
    return torch.zeros(allowed.shape, dtype=dtype, device=seen.device).masked_fill(~allowed, float("-inf"))


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, call: Call,
           scale: float | None) -> torch.Tensor:
    """One call: query [heads, rows, dim] (this call's rows), keys/values [1, kv_heads,
    call.keys, dim]; returns [rows, heads, dim]. The query heads that share a KV head
    are rows of one product, row by row (row 0's heads first)."""
    heads, rows, dim = query.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    packed = query.view(kv_heads, group, rows, dim).transpose(1, 2).reshape(1, kv_heads, rows * group, dim)
    out = F.scaled_dot_product_attention(packed, keys, values, attn_mask=call.mask, scale=scale)
    return out.view(kv_heads, rows, group, dim).transpose(0, 1).reshape(rows, heads, dim)


@torch.inference_mode()
def probe(dtype: torch.dtype, device: Any, kv_heads: int, group: int, dim: int) -> bool:
    """Whether padded calls give every row the bits it gets alone, for this head layout
    on this machine: contexts around the kernel's block edges, 1 to 33 rows a call."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    longest = 1100

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device, dtype)

    keys, values = rand(1, kv_heads, padded_length(longest), dim), rand(1, kv_heads, padded_length(longest), dim)
    queries = rand(kv_heads * group, 33, dim)

    def call(start: int, first: int, rows: int) -> torch.Tensor:
        # rows first..first+rows-1 of a chain whose pending token sits at `start`
        c = _chain_call(0, 0, rows, start + first + 1, group, dtype, device)
        return attend(queries[:, first : first + rows], keys[:, :, : c.keys], values[:, :, : c.keys], c, None)

    for start in (0, 5, 30, 95, 470, 490, 505, 510, 1000, 1020, 1050):
        for rows in (2, 3, 9, 17, 33):
            together = call(start, 0, rows)
            for i in range(rows):
                if not torch.equal(together[i], call(start, i, 1)[0]):
                    return False
    return True
