"""The `rowdecoder` backend: prefill chunks, decode steps and verify passes in one C call
each (rowdecoder.py over kernels/rowdecoder.c), row-exact by construction.

Each row attends to its own key sequence: the slot's first `context` keys, then a
`path` of slot positions. A row on a request's main path (the chain from the pending
token) sees a prefix of the slot; a tree row off it sees the context, then its
ancestors and itself wherever the pass wrote them. Either is the sequence decoding
would have had, in that order, and every row's bits depend on that row alone, so
plain decoding and every verify pass agree without a probe.

Logits are numpy uint16 arrays of bf16 bits [rows, vocab]. The KV slots are numpy uint16
arrays (a SlotCache with `kv_dtype`), or any contiguous 2-byte storage the C forward can
address (tests hand it torch bf16 slots). A greedy pass asks for `choices`, which lm_head's
int8 screen answers while reading half its bytes (kernels/lmchoice.py).

    forward = RowForward(decoder, config, generation_config, key)
    logits = forward.prefill(cache, slot, prompt, 0)
    picked = forward.choices(cache, [(slot, cache.length(slot), tree)])
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from codespec.forward.base import Forward, Moves, Requests
from codespec.forward.rowdecoder import RowDecoder
from codespec.kernels import lmchoice


class RowForward(Forward):
    """The C row decoder behind the Forward protocol (base.py)."""

    name = "rowdecoder"
    kv_dtype = np.uint16  # bf16 bits
    device = "cpu"
    prefill_exact = True  # a prefill row is a decode step's view (rowdecoder.prefill_rows)
    min_rows = 1  # a one-row pass is a decode step: the same C call

    def __init__(self, decoder: RowDecoder, config: Any, generation_config: Any, key: dict[str, str],
                 *, screen: bool = True) -> None:
        """`key`: the machine-profile key (profile.py); `screen=False`: greedy passes compute
        full logits rather than lm_head's screen (tests that compare the two)."""
        self.decoder, self.config, self.generation_config = decoder, config, generation_config
        self._key, self._screen = key, screen
        self._bound: tuple[Any, tuple[Any, Any, int]] | None = None  # (cache, its slot addresses)

    def probe(self, stored: tuple[int, bool] | None) -> tuple[int, bool]:
        return 0, False  # each row reads its own keys: no blocks, no padding

    def profile_key(self) -> dict[str, str]:
        return dict(self._key)

    def _slots(self, cache: Any) -> tuple[Any, Any, int]:
        if self._bound is None or self._bound[0] is not cache:
            slots = self.decoder.slots(cache)  # checks the layout
            self.decoder.reach(cache.slot_tokens)
            self._bound = (cache, slots)
        return self._bound[1]

    def prefill(self, cache: Any, slot: int, prompt: Sequence[int], start: int) -> np.ndarray:
        return self.decoder.prefill(list(prompt), slot, start, cache.chunk, self._slots(cache),
                                    getattr(cache, "preempted", None))

    def logits(self, cache: Any, requests: Requests) -> np.ndarray:
        rows, path = plan_rows(requests)
        return self.decoder.forward(_tokens(requests), rows, path, self._slots(cache))

    def choices(self, cache: Any, requests: Requests) -> list[int]:
        if not self._screen:
            return self.argmax(self.logits(cache, requests))
        rows, path = plan_rows(requests)
        return self.decoder.choices(_tokens(requests), rows, path, self._slots(cache)).tolist()

    def argmax(self, logits: np.ndarray) -> list[int]:
        return lmchoice.first_max(logits).tolist()

    def tensor(self, logits: np.ndarray) -> Any:
        import torch  # sampled requests only: a greedy process never imports torch

        return torch.from_numpy(np.ascontiguousarray(logits)).view(torch.bfloat16)

    def keep(self, cache: Any, moves: Moves) -> None:
        for slot, start, path in moves:
            source = start + np.array([0, *path])
            for layer in (*cache.keys, *cache.values):
                kept = layer[slot]  # [kv_heads, positions, head_dim]: gather, then store
                kept[:, start : start + len(source)] = kept[:, source]


def _tokens(requests: Requests) -> list[int]:
    return [token for _, _, tree in requests for token in tree.tokens]


def plan_rows(requests: Sequence[tuple[int, int, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(rows [6, n], path) for `RowDecoder.forward` from (slot, slot length, tree) per
    request, in packing order: node i is written at length + i, rotated at length +
    depth; main-path rows see the slot's prefix, the others the context and their path.

    >>> from codespec.verify.tree import VerifyTree
    >>> rows, path = plan_rows([(3, 10, VerifyTree((9, 1, 2, 5), (-1, 0, 1, 0), (0, 1, 2, 1), ()))])
    >>> rows.tolist(), path.tolist()
    ([[3, 3, 3, 3], [10, 11, 12, 13], [10, 11, 12, 11], [11, 12, 13, 10], [0, 0, 0, 0], [0, 0, 0, 2]], [10, 13])
    """
    columns: list[list[int]] = [[] for _ in range(6)]
    path: list[int] = []
    for slot, start, tree in requests:
        _, main = tree.chains()[0]  # the main path: nodes [0, main)
        for node in range(len(tree)):
            on_main = node < main
            nodes = [] if on_main else tree.path(node)
            for column, value in zip(columns, (slot, start + node, start + tree.depths[node],
                                               start + node + 1 if on_main else start, len(path), len(nodes))):
                column.append(value)
            path.extend(start + n for n in nodes)
    return np.array(columns, dtype=np.int64).reshape(6, -1), np.array(path, dtype=np.int64)
