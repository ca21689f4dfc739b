"""The verifier: chunked prefill, and verify passes over many requests' draft trees at once.

State between passes: a request's KV slot holds every committed token except the last
one, the *pending* token, whose KV the next pass computes. A pass feeds each request's
pending token (node 0) and its draft tree (nodes 1..) at positions L + depth, where L
is the slot's length; logits row i is the model's distribution after node i, so the
rows of a node's children check them:

    chain    pending  d0   d1   d2          model's choices  a0 a1 a2 a3
    accepted while d_i == a_i; the bonus is a_j at the first mismatch j (or a_k)

With draft [d0, d1, d2] and choices [d0, d1, x, y] the pass accepts 2 draft tokens and
commits [d0, d1, x]; x becomes the new pending token. The KV of pending, d0 and d1 is
kept (for a tree, the accepted path is compacted to follow the context); the rest is
left past the slot's length, to be overwritten.

An empty draft makes the pass a plain decode step: speculation off runs the same code.
The pass itself is the backend's (forward/base.py: every row equals the decode step it
stands for), chosen once at start-up; this module is the same for all of them. Greedy
acceptance is one rule for every backend: `accept_choices` over each row's first
maximum, which the row decoder finds through lm_head's int8 screen.

    verifier = Verifier(forward, cache)
    logits = verifier.prefill(slot, prompt_ids)
    results = verifier.verify([Item(slot, VerifyTree.chain(first, draft))])
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from codespec.forward.base import Forward
from codespec.forward.rowplan import padded_length
from codespec.verify.tree import Accept, Item, VerifyResult, VerifyTree, accept_choices  # noqa: F401 (Accept: re-exported)


class Verifier:
    """Prefill and verify passes of one backend over the KV slots."""

    def __init__(self, forward: Forward, cache: Any, probes: tuple[int, bool] | None = None) -> None:
        """`cache`: the SlotCache (engine/kvcache.py). `probes`: the stored (row block, padded
        attention) of this machine's profile; the backend measures them when none is given
        and it needs them."""
        self.forward, self.cache = forward, cache
        self.forward_s = 0.0  # spent inside the forward's calls (stats.HostClock)
        self.overlapped_s = 0.0  # spent in `during` work while a launched pass ran
        self.row_block, self.padded_rows = forward.probe(probes)
        # what a pass's rows read, for the cost model: padded calls read whole key blocks
        self.key_span = padded_length if self.padded_rows else None
        cache.exact_prefix = forward.prefill_exact  # kvcache's docstring

    def prefill(self, slot: int, prompt_ids: Sequence[int], start: int = 0) -> Any:
        """Compute the KV of prompt_ids[start:] in the passes `cache.spans` gives (whole
        chunks on the absolute grid, the last chunk in sub-chunks; chunks from anywhere
        with an exact prefill); returns the logits after the prompt's last token: [1, vocab]."""
        prompt = list(prompt_ids)
        assert 0 <= start < len(prompt) <= self.cache.slot_tokens
        self.cache.spans(len(prompt), start)  # asserts that a prefill resumes at a pass boundary
        with self._in_forward():
            logits = self.forward.prefill(self.cache, slot, prompt, start)
        self.cache.prefilled(slot, prompt)
        return logits

    def first(self, logits: Any, accept: Accept | None = None) -> VerifyResult:
        """The token after a prefill (the last row of `logits`) as a one-token result: the
        greedy choice, or the one `accept` (a sampling rule) draws, with its logprobs when
        `accept` adds them."""
        with self._in_forward():
            if accept is None:
                return VerifyResult(0, (self.forward.argmax(logits[-1:])[0],))
            return accept(self.forward.tensor(logits[-1:]), VerifyTree.chain(0))

    def verify(self, items: Sequence[Item], during: Callable[[], None] | None = None,
               chain_next: bool = False) -> list[VerifyResult]:
        """One pass over every item's tree; accepts, compacts and commits each. `during`
        (which must not raise) runs while the pass computes, where the backend launches
        it asynchronously (`Forward.launch`: a GPU's) and every item is greedy.
        `chain_next`: the engine's word that every item's next pass is a plain greedy
        step, which a backend that `chains_steps` queues behind this one (forward/cuda/chained.py)."""
        requests = []
        for item in items:
            start = self.cache.length(item.slot)
            assert start + len(item.tree) < self.cache.slot_tokens, "the engine keeps room for a pass"
            requests.append((item.slot, start, item.tree))
        offsets = [0]
        for item in items:
            offsets.append(offsets[-1] + len(item.tree))
        if all(item.accept is None for item in items):  # greedy needs the choices alone
            picked = self._choices(requests, during, chain_next)
            results = [accept_choices(picked[first:end], item.tree)
                       for item, first, end in zip(items, offsets, offsets[1:])]
        else:
            with self._in_forward():  # the device's part: logits, their choices or the sampling on them
                logits = self.forward.logits(self.cache, requests)
                results = [accept_choices(self.forward.argmax(logits[first:end]), item.tree) if item.accept is None
                           else item.accept(self.forward.tensor(logits[first:end]), item.tree)
                           for item, first, end in zip(items, offsets, offsets[1:])]
        self._commit(items, results)
        return results

    def _choices(self, requests: list[tuple[int, int, VerifyTree]], during: Callable[[], None] | None,
                 chain_next: bool = False) -> list[int]:
        """The pass's greedy choices; `during` runs between a launched pass and its results."""
        chain = chain_next and self.forward.chains_steps
        if not self.forward.asynchronous or (during is None and not chain):
            with self._in_forward():
                return self.forward.choices(self.cache, requests)
        with self._in_forward():
            collect = self.forward.launch(self.cache, requests, chain_next=chain)
        if during is not None:
            began = time.perf_counter()
            during()
            self.overlapped_s += time.perf_counter() - began
        with self._in_forward():
            return collect()

    def _commit(self, items: Sequence[Item], results: Sequence[VerifyResult]) -> None:
        moves = [(item.slot, self.cache.length(item.slot), result.path) for item, result in zip(items, results)
                 if any(node != j + 1 for j, node in enumerate(result.path))]  # a branch won
        if moves:
            with self._in_forward():
                self.forward.keep(self.cache, moves)
        for item, result in zip(items, results):
            self.cache.committed(item.slot, [item.tree.tokens[0], *(item.tree.tokens[i] for i in result.path)])

    @contextmanager
    def _in_forward(self) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.forward_s += time.perf_counter() - began
