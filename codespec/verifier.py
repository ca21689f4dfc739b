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

An empty draft makes the pass a plain decode step: speculation off runs the same code,
and every row is computed the same way whatever else is in the pass: in one C call where
the row decoder applies (decoder.py: Qwen2/Llama on CPUs with AVX-512 BF16), else
through transformers' forward with row-exact attention and row blocks (attention.py).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from codespec import attention, decoder, rowblocks, rowcalls, rowforward
from codespec.errors import ModelError
from codespec.kernels.accept import tree_accept
from codespec.kernels.compact import compact_kv
from codespec.kernels.tree_mask import tree_mask
from codespec.kvcache import SlotCache, kv_dims
from codespec.tree import Accept, Item, VerifyResult, VerifyTree, accept_choices  # noqa: F401 (Accept: re-exported)


def greedy_accept(logits: torch.Tensor, tree: VerifyTree) -> VerifyResult:
    """The longest path of the tree that follows the model's choices, plus the bonus.

    logits: [nodes, vocab], row i after node i.

    >>> lg = torch.full((3, 5), -1.0); lg[0, 2] = lg[1, 4] = lg[2, 0] = 1.0
    >>> greedy_accept(lg, VerifyTree.chain(9, [2, 3]))     # 2 matches, 3 != 4: bonus 4
    VerifyResult(accepted=1, committed=(2, 4), path=(1,))
    """
    return batch_greedy_accept(logits, [0], [tree])[0]


def batch_greedy_accept(logits: torch.Tensor, offsets: Sequence[int],
                        trees: Sequence[VerifyTree]) -> list[VerifyResult]:
    """Greedy acceptance of several requests' trees whose rows start at `offsets`."""
    width = max(len(t) for t in trees)
    device = logits.device

    def padded(rows: list[tuple[int, ...]], fill: int) -> torch.Tensor:
        return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=torch.int64, device=device)

    accepted, paths, bonus = tree_accept(
        logits.contiguous(),
        torch.tensor(list(offsets), dtype=torch.int64, device=device),
        torch.tensor([len(t) for t in trees], dtype=torch.int64, device=device),
        padded([t.tokens for t in trees], 0),
        padded([t.parents for t in trees], -1),
    )
    results = []
    for tree, n, path, b in zip(trees, accepted.tolist(), paths.tolist(), bonus.tolist()):
        nodes = tuple(path[:n])
        results.append(VerifyResult(n, tuple(tree.tokens[i] for i in nodes) + (b,), nodes))
    return results


class Verifier:
    """Drives a Hugging Face causal LM over the KV slots: prefill and verify passes."""

    def __init__(self, model: Any, cache: SlotCache, *, exact_rows: bool = True, row_decoder: bool = True,
                 choices: bool = True, quantize: str | None = None) -> None:
        """`row_decoder=False` keeps transformers' forward where the row decoder would apply;
        `choices=False` has the row decoder's greedy passes compute full logits rather
        than the choices alone (rowforward.RowDecoder.choices): tests that read logits;
        `quantize`: the row decoder's weights ("none": bf16; None: the model's setting)."""
        if attention.uses_sliding_window(model.config):
            raise ModelError("models with sliding-window attention are not supported")
        self.model = model
        self.cache = cache
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.exact_rows = exact_rows
        self.choices = choices
        attention.install(model)
        rowblocks.install(model)
        # Decode steps and verify passes: one C call per pass where the model allows
        # (decoder.py; exact by construction), else transformers' forward made exact by
        # the probed row blocks and attention layouts below.
        self.decoder = decoder.attach(model, quantize) if exact_rows and row_decoder else None
        _, kv_heads, head_dim = kv_dims(model.config)
        self.query_group = model.config.num_attention_heads // kv_heads
        if self.decoder is not None:
            self.row_block, self.padded_rows = 0, False  # no blocks; each row reads its own keys
            self._slots = self.decoder.slots(cache)
            self.decoder.reach(cache.slot_tokens)
        else:
            if not hasattr(model, "_codespec_row_block"):  # probed once per model
                model._codespec_row_block = rowblocks.probe(model)
            self.row_block = model._codespec_row_block
            if not hasattr(model, "_codespec_padded_rows"):  # likewise for attention (rowcalls.py)
                model._codespec_padded_rows = rowcalls.probe(self.dtype, self.device, kv_heads, self.query_group,
                                                             head_dim)
            self.padded_rows = model._codespec_padded_rows
        # A 4D mask makes transformers skip building one; slot_attention ignores it.
        self._no_mask = torch.zeros(1, 1, 1, 1, dtype=self.dtype, device=self.device)

    def _forward(self, ids: list[int], positions: list[int], plan: attention.Plan, **kwargs: Any) -> torch.Tensor:
        device = self.device
        self.cache.plan = plan
        try:
            out = self.model(
                input_ids=torch.tensor([ids], device=device),
                position_ids=torch.tensor([positions], device=device),
                attention_mask=self._no_mask,
                past_key_values=self.cache,
                use_cache=True,
                **{attention.PLAN_KEY: plan},
                **kwargs,
            )
        finally:
            self.cache.plan = None
        return out.logits[0]

    @torch.inference_mode()
    def prefill(self, slot: int, prompt_ids: Sequence[int], start: int = 0) -> torch.Tensor:
        """Compute the KV of prompt_ids[start:] in chunks on the absolute chunk grid;
        returns the logits after the prompt's last token: [1, vocab]."""
        prompt = list(prompt_ids)
        assert 0 <= start < len(prompt) <= self.cache.slot_tokens
        assert start % self.cache.chunk == 0, "a prefill resumes on the chunk grid"
        if self.decoder is not None:  # rows that see the slot up to themselves (rowforward.py)
            logits = self.decoder.prefill(prompt, slot, start, self.cache.chunk, self._slots)
            self.cache.prefilled(slot, prompt)
            return decoder.as_tensor(logits)
        logits = None
        for begin in range(start, len(prompt), self.cache.chunk):
            end = min(begin + self.cache.chunk, len(prompt))
            rows = torch.arange(begin, end, device=self.device)
            causal = torch.arange(end, device=self.device)[None, :] <= rows[:, None]  # [rows, end]
            plan = attention.Plan(
                self.cache,
                write_slots=torch.full((end - begin,), slot, device=self.device),
                write_positions=rows,
                prefill=(slot, begin, end - begin),
                prefill_mask=causal,
            )
            # logits_to_keep=1: a chunk's full [rows, vocab] logits would be ~40 MB we never read
            logits = self._forward(prompt[begin:end], rows.tolist(), plan, logits_to_keep=1)
        self.cache.prefilled(slot, prompt)
        assert logits is not None
        return logits[-1:]

    def first_token(self, logits: torch.Tensor) -> int:
        """The greedy choice after a prefill (the last row of `logits`)."""
        return greedy_accept(logits[-1:], VerifyTree.chain(0)).committed[0]

    @torch.inference_mode()
    def verify(self, items: Sequence[Item]) -> list[VerifyResult]:
        """One forward over every item's tree; accepts, compacts and commits each."""
        ids: list[int] = []
        offsets: list[int] = []
        for item in items:
            assert self.cache.length(item.slot) + len(item.tree) < self.cache.slot_tokens, \
                "the engine keeps room for a pass"
            offsets.append(len(ids))
            ids.extend(item.tree.tokens)
        if self.decoder is not None:
            rows, path = rowforward.plan_rows([(item.slot, self.cache.length(item.slot), item.tree) for item in items])
            if self.choices and all(item.accept is None for item in items):  # lm_head's screen (lmchoice.py)
                picked = self.decoder.choices(ids, rows, path, self._slots)
                done = [accept_choices(picked[offset : offset + len(item.tree)], item.tree)
                        for item, offset in zip(items, offsets)]
                self._commit(items, done)
                return done
            logits = decoder.as_tensor(self.decoder.forward(ids, rows, path, self._slots))
        else:
            logits = self._transformers_pass(items, ids)
        results: list[VerifyResult | None] = [None] * len(items)
        greedy = [i for i, item in enumerate(items) if item.accept is None]
        if greedy:
            found = batch_greedy_accept(logits, [offsets[i] for i in greedy], [items[i].tree for i in greedy])
            for i, result in zip(greedy, found):
                results[i] = result
        for i, item in enumerate(items):
            if item.accept is not None:
                results[i] = item.accept(logits[offsets[i] : offsets[i] + len(item.tree)], item.tree)
        done = [r for r in results if r is not None]
        assert len(done) == len(items)
        self._commit(items, done)
        return done

    def _transformers_pass(self, items: Sequence[Item], ids: list[int]) -> torch.Tensor:
        """The pass through transformers' forward: logits [len(ids), vocab]."""
        positions: list[int] = []
        slots: list[int] = []
        writes: list[int] = []
        for item in items:
            start = self.cache.length(item.slot)
            positions.extend(start + d for d in item.tree.depths)
            slots.extend([item.slot] * len(item.tree))
            writes.extend(start + i for i in range(len(item.tree)))
        real = len(ids)
        if real == 1:
            # A lone row would take bf16's GEMV kernel (another summation order than the
            # GEMM every other pass uses): pad with a copy whose output is discarded.
            ids, slots = ids * 2, slots * 2
            positions, writes = [positions[0], positions[0] + 1], [writes[0], writes[0] + 1]
        plan = self._plan(items, slots, writes)
        if self.exact_rows:
            with rowblocks.blocked(self.row_block):  # multiply like a decode step (rowblocks.py)
                return self._forward(ids, positions, plan)[:real]
        return self._forward(ids, positions, plan)[:real]

    def _plan(self, items: Sequence[Item], slots: list[int], writes: list[int]) -> attention.Plan:
        device = self.device
        write_slots = torch.tensor(slots, device=device)
        write_positions = torch.tensor(writes, device=device)
        if self.exact_rows:
            requests = [(item.slot, self.cache.length(item.slot), item.tree) for item in items]
            calls = rowcalls.plan_calls(requests, padded=self.padded_rows, group=self.query_group,
                                        dtype=self.dtype, device=device)
            return attention.Plan(self.cache, write_slots, write_positions, calls=calls)
        width = max(len(item.tree) for item in items)
        parents = torch.tensor([list(i.tree.parents) + [-1] * (width - len(i.tree)) for i in items], device=device)
        allow = tree_mask(parents, torch.tensor([len(i.tree) for i in items], device=device))
        groups, first = [], 0
        blocked = torch.finfo(self.dtype).min
        for item, item_allow in zip(items, allow):
            start, n = self.cache.length(item.slot), len(item.tree)
            mask = torch.zeros(n, start + n, dtype=self.dtype, device=device)
            mask[:, start:] = mask.new_zeros(n, n).masked_fill(~item_allow[:n, :n], blocked)
            groups.append(attention.Group(item.slot, start, first, n, mask))
            first += n
        return attention.Plan(self.cache, write_slots, write_positions, groups=tuple(groups))

    def _commit(self, items: Sequence[Item], results: Sequence[VerifyResult]) -> None:
        moved = [(item, result) for item, result in zip(items, results)
                 if any(node != j + 1 for j, node in enumerate(result.path))]
        if moved:
            device = self.device
            width = 1 + max(len(r.path) for _, r in moved)
            src = torch.tensor([[0, *r.path] + [-1] * (width - 1 - len(r.path)) for _, r in moved], device=device)
            slots = torch.tensor([item.slot for item, _ in moved], device=device)
            starts = torch.tensor([self.cache.length(item.slot) for item, _ in moved], device=device)
            keep = torch.tensor([1 + len(r.path) for _, r in moved], device=device)
            for layer_keys, layer_values in zip(self.cache.keys, self.cache.values):
                compact_kv(layer_keys, slots, starts, src, keep)
                compact_kv(layer_values, slots, starts, src, keep)
        for item, result in zip(items, results):
            self.cache.committed(item.slot, [item.tree.tokens[0], *(item.tree.tokens[i] for i in result.path)])
