"""A pass's rows as the cuda backend's bucket reads them (forward/cuda/forward.py).

Every row of a pass is (token, position, slot, write position, context, path): the row
attends to its slot's first `context` positions, then to `path` (its ancestors off its
tree's contiguous main chain, and itself), and writes its K and V at the write position.
`pass_rows` says it one row at a time, as the reference; `fill_staging` writes a bucket's
share of a pass's rows (`tree_rows` of a verify pass, `chain_rows` of a prefill chunk)
into its staging buffer in one numba call, because on a GPU this is host work on the
pass's critical path: done in Python it took ~90 us for a 64-row pass (5 us for one
row), beside a ~1.5 ms pass on an H100.

>>> from types import SimpleNamespace as Tree
>>> tree = Tree(tokens=(7, 8, 9), parents=(-1, 0, 0), depths=(0, 1, 1))
>>> [row[4:] for row in pass_rows([(0, 10, tree)])]   # node 2's parent is node 0, not node 1
[(11, []), (12, []), (11, [12])]
>>> staging = np.zeros(META_FIELDS * 4 + 4 * 4, dtype=np.int64)
>>> fill_staging(staging, tree_rows([(0, 10, tree)]), first=0, bucket=4)
3
>>> staging[CONTEXT * 4:CONTEXT * 4 + 4].tolist()   # the padding row sees nothing
[11, 12, 11, 0]
>>> int(staging[META_FIELDS * 4 + 2 * 4])   # row 2's path: position 12
12
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from numba import njit

META_FIELDS = 8  # ids, positions, write slot, write position, KV source row, slot, context, path length
TOKEN, POSITION, WRITE_SLOT, WRITE, SOURCE, SLOT, CONTEXT, PATH_LEN = range(META_FIELDS)


def pass_rows(requests: Sequence[tuple[int, int, Any]]):
    """Each row of a pass, in packing order: (token, position, slot, write position,
    context, path), where the row attends to its slot's first `context` positions and
    then to `path` (its ancestors off the contiguous main chain, and itself)."""
    for slot, start, tree in requests:
        lineage: list[list[int]] = []  # ancestors-or-self of each node, root first
        for node, parent in enumerate(tree.parents):
            lineage.append((lineage[parent] if parent >= 0 else []) + [node])
        for node, ancestry in enumerate(lineage):
            contiguous = 0
            while contiguous < len(ancestry) and ancestry[contiguous] == contiguous:
                contiguous += 1
            yield (tree.tokens[node], start + tree.depths[node], slot, start + node, start + contiguous,
                   [start + j for j in ancestry[contiguous:]])


@dataclass
class PassRows:
    """A pass's trees, concatenated: node i of request r is row offsets[r] + i."""

    tokens: np.ndarray  # [rows]
    parents: np.ndarray  # [rows], within the row's tree
    depths: np.ndarray  # [rows]
    offsets: np.ndarray  # [requests + 1]
    slots: np.ndarray  # [requests]
    starts: np.ndarray  # [requests], each slot's length before the pass

    def __len__(self) -> int:
        return self.tokens.size


def tree_rows(requests: Sequence[tuple[int, int, Any]]) -> PassRows:
    """A verify pass's rows (the `pass_rows` of its (slot, start, tree) requests)."""
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    offsets, slots, starts = [0], [], []
    for slot, start, tree in requests:  # lists, then one array each: a one-row step is the common pass
        tokens += tree.tokens
        parents += tree.parents
        depths += tree.depths
        offsets.append(len(tokens))
        slots.append(slot)
        starts.append(start)
    return PassRows(*(np.array(values, dtype=np.int64) for values in (tokens, parents, depths, offsets, slots, starts)))


def chain_rows(prompt: Sequence[int], slot: int, begin: int, end: int) -> PassRows:
    """A prefill chunk's rows, positions begin..end of the slot: a chain, each row seeing
    the positions before it and itself."""
    n = end - begin
    return PassRows(np.asarray(prompt[begin:end], dtype=np.int64), np.arange(-1, n - 1, dtype=np.int64),
                    np.arange(n, dtype=np.int64), np.array([0, n], dtype=np.int64),
                    np.array([slot], dtype=np.int64), np.array([begin], dtype=np.int64))


def fill_staging(staging: np.ndarray, rows: PassRows, first: int, bucket: int) -> int:
    """Lay rows first.. (a bucket's worth) out as the bucket's metadata [META_FIELDS *
    bucket] then path [bucket, bucket] (a row's path: at most `bucket` nodes, which the
    engine keeps to by cutting deeper branches first: Forward.max_tail); padding rows
    repeat the first row's token, position and write, and attend to nothing. Returns the
    real rows."""
    deepest = _fill_bucket(rows.tokens, rows.parents, rows.depths, rows.offsets, rows.slots, rows.starts,
                           first, staging, bucket)
    assert deepest <= bucket, f"a row's path of {deepest} nodes is longer than the bucket ({bucket} rows)"
    return min(bucket, len(rows) - first)


@njit(cache=True, nogil=True)
def _fill_bucket(tokens, parents, depths, offsets, slots, starts, first, staging, bucket):  # pragma: no cover
    """fill_staging's layout; returns the longest path met (a longer path than `bucket`
    nodes is measured, not written: the caller refuses it). A tree's main chain is the prefix of nodes 0..m-1 whose parents are
    their predecessors (depth-first order, verify/tree.py); a node past it walks up to
    the chain: the nodes it passes are its path, the chain node it reaches ends its
    contiguous context."""
    meta = staging[: META_FIELDS * bucket].reshape((META_FIELDS, bucket))
    path = staging[META_FIELDS * bucket:].reshape((bucket, bucket))
    path[:] = 0
    n = min(bucket, tokens.size - first)
    tail = np.empty(bucket, dtype=np.int64)
    deepest = 0
    r = np.searchsorted(offsets, first, side="right") - 1
    chained = -1  # the main chain's length in request r (-1: not yet known)
    for i in range(n):
        row = first + i
        while row >= offsets[r + 1]:
            r += 1
            chained = -1
        lo, start = offsets[r], starts[r]
        if chained < 0:
            chained = 1
            while lo + chained < offsets[r + 1] and parents[lo + chained] == chained - 1:
                chained += 1
        node = row - lo
        k = 0
        j = node
        while j >= chained:
            if k < bucket:
                tail[k] = j
            k += 1
            j = parents[lo + j]
        deepest = max(deepest, k)
        if k <= bucket:  # root first: tail[k - 1] is the topmost node off the chain
            for t in range(k):
                path[i, t] = start + tail[k - 1 - t]
        meta[TOKEN, i] = tokens[row]
        meta[POSITION, i] = start + depths[row]
        meta[WRITE_SLOT, i] = slots[r]
        meta[WRITE, i] = start + node
        meta[SOURCE, i] = i
        meta[SLOT, i] = slots[r]
        meta[CONTEXT, i] = start + j + 1
        meta[PATH_LEN, i] = k
    for i in range(n, bucket):
        meta[TOKEN, i] = meta[TOKEN, 0]
        meta[POSITION, i] = meta[POSITION, 0]
        meta[WRITE_SLOT, i] = meta[WRITE_SLOT, 0]
        meta[WRITE, i] = meta[WRITE, 0]
        meta[SOURCE, i] = 0
        meta[SLOT, i] = meta[SLOT, 0]
        meta[CONTEXT, i] = 0
        meta[PATH_LEN, i] = 0
    return deepest
