"""A forward that replays a model's greedy output, for timing the engine's host path alone.

On a GPU a verify pass takes ~1.5 ms (docs/gpu.md, H100), so the host's part of
each pass (drafting, the controller, building trees, accepting, committing) decides
whether speculation pays at batch 8. On a CPU the model's passes take 25-60 ms and
torch's OpenMP workers still spin on the cores when the host's work starts, so that
part cannot be read off a real run here. `OracleForward` stands in for the model: given
each request's greedy output (measured once with the real model), every row's choice is
the next token of that output where the row's path follows it, so every policy drafts,
accepts and commits exactly what it would with the model, and no arithmetic runs. Each
pass waits `pass_s` per bucket of `bucket` rows, as a GPU backend's replays take about the
same time whatever rows they hold (cuda/forward.py), plus `row_s` per row past a
replay's first (each real row's attention: ~3 us on the H100, whose 64-row pass cost
1.63 ms against a step's 1.34 on 2026-11-26, ~90 us of that the host's layout of the
rows then): the engine sees GPU-shaped pass costs (its goodput controller calibrates on them) while the host does nothing else, as
while a GPU computes. Passes queue on a virtual device, one after another, and plain
steps are queued one ahead as the cuda backend queues them (cuda/chained.py;
CODESPEC_CUDA_CHAIN=0 turns both off): a queued step starts when the pass before it
ends, however long the host takes. `codespec bench host` runs it (bench/host_bench.py).

>>> from codespec.policy.tree import VerifyTree
>>> oracle = OracleForward({(1, 2): [1, 2, 3, 4, 5]}, eos_id=0)
>>> oracle.argmax(oracle.prefill(None, 0, [1, 2], 0))   # after the prompt: 3
[3]
>>> oracle.choices(None, [(0, 2, VerifyTree.chain(3, [4, 9]))])   # 4 follows 3; 9 is off the output
[4, 5, 0]
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import numpy as np

from codespec.errors import CodespecError
from codespec.cuda.chained import next_starts, plain_steps, queued_rows
from codespec.cuda.settings import CudaSettings
from codespec.forward.base import Forward
from codespec.policy.tree import VerifyTree


class OracleForward(Forward):
    """The Forward protocol (forward/base.py) over known greedy outputs (module docstring)."""

    name = "oracle"
    exact = True
    asynchronous = True
    prefill_exact = True
    min_rows = 1
    device = "cpu"
    kv_dtype = np.uint16

    def __init__(self, sequences: dict[tuple[int, ...], Sequence[int]], *, eos_id: int | None,
                 pass_s: float = 0.0, bucket: int = 64, row_s: float = 0.0, max_context: int = 32768) -> None:
        """`sequences`: each prompt (as a tuple) with its whole greedy sequence, prompt then
        output, ending with `eos_id` where the output ended on it (None: a model without
        an end of sequence, whose outputs end by length)."""
        self._sequences = {prompt: list(seq) for prompt, seq in sequences.items()}
        self._by_slot: dict[int, list[int]] = {}
        self.pass_s, self.bucket, self.row_s = pass_s, bucket, row_s
        # the choice off the output and past its end: no acceptance ever reaches the first,
        # and a run never drafts past its token limit, so only a real end of sequence matters
        self.filler = 0 if eos_id is None else eos_id
        # the smallest KV a SlotCache will allocate: no pass reads it
        self.config = SimpleNamespace(num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                                      hidden_size=1, head_dim=1, max_position_embeddings=max_context)
        self.generation_config = SimpleNamespace(eos_token_id=eos_id)
        self.chains_steps = CudaSettings().chain  # as the cuda backend
        self.chained_taken = self.chained_dropped = 0
        self._free_at = 0.0  # when the virtual device has run every pass queued on it
        # a queued plain step: its (slot, start, token) rows, their choices, when it ends
        self._queued: tuple[list[tuple[int, int, int]], list[int], float] | None = None

    def probe(self, stored: tuple[int, bool] | None) -> tuple[int, bool]:
        return self.bucket, False  # as the cuda backend: a pass costs one more replay per bucket

    def profile_key(self) -> dict[str, str]:
        return {"backend": self.name, "layout": f"pass_s={self.pass_s},bucket={self.bucket},row_s={self.row_s}"}

    def prefill(self, cache: Any, slot: int, prompt: Sequence[int], start: int) -> np.ndarray:
        sequence = self._sequences.get(tuple(prompt))
        if sequence is None:
            raise CodespecError("the oracle forward has no greedy output for this prompt: it replays only the "
                                "requests it was given")
        self._by_slot[slot] = sequence
        self._drop_queued()
        self._wait(len(prompt) - start)
        return np.array([[self._after(sequence, len(prompt) - 1)]], dtype=np.int64)

    def choices(self, cache: Any, requests: Sequence[tuple[int, int, Any]]) -> list[int]:
        return self.launch(cache, requests)()

    def launch(self, cache: Any, requests: Sequence[tuple[int, int, Any]],
               chain_next: bool = False) -> Callable[[], list[int]]:
        """The pass queued: its choices are ready once the virtual device has run it, as
        a GPU's asynchronous launch (the host may work meanwhile: engine/ahead.py); with
        `chain_next`, the plain step after it queued behind it (cuda/chained.py)."""
        queued, self._queued = self._queued, None
        rows = queued_rows(queued[0], requests) if queued is not None else None
        if rows is not None:
            self.chained_taken += 1  # the queued step (requests ended since: the others' rows)
            picked, until = [queued[1][row] for row in rows], queued[2]
        else:
            self.chained_dropped += queued is not None
            picked = self._choices(requests)
            until = self._queue(self._pass_s(len(picked)))
        if chain_next and self.chains_steps and plain_steps(requests):
            slots, starts = next_starts(requests)
            step = list(zip(slots, starts, picked))
            choices = self._choices([(slot, start, VerifyTree.chain(token)) for slot, start, token in step])
            self._queued = (step, choices, self._queue(self._pass_s(len(step))))

        def collect() -> list[int]:
            while time.perf_counter() < until:
                pass
            return picked
        return collect

    def _queue(self, seconds: float) -> float:
        """Queue `seconds` of device work behind what is queued; returns when it ends."""
        self._free_at = max(time.perf_counter(), self._free_at) + seconds
        return self._free_at

    def _drop_queued(self) -> None:
        self.chained_dropped += self._queued is not None
        self._queued = None

    def _choices(self, requests: Sequence[tuple[int, int, Any]]) -> list[int]:
        picked: list[int] = []
        for slot, start, tree in requests:
            sequence = self._by_slot.get(slot, [])  # none: a slot filled without a prefill (calibration)
            on_output: list[bool] = []  # whether the node's path is the output's next tokens
            for node, (token, parent, depth) in enumerate(zip(tree.tokens, tree.parents, tree.depths)):
                at = start + depth
                follows = (parent < 0 or on_output[parent]) and at < len(sequence) and sequence[at] == token
                on_output.append(follows)
                picked.append(self._after(sequence, at) if follows else self.filler)
        return picked

    def logits(self, cache: Any, requests: Sequence[tuple[int, int, Any]]) -> np.ndarray:
        self._drop_queued()
        return np.array(self.choices(cache, requests), dtype=np.int64)[:, None]

    def argmax(self, logits: np.ndarray) -> list[int]:
        return logits[:, 0].tolist()

    def tensor(self, logits: np.ndarray) -> Any:
        raise CodespecError("the oracle forward replays greedy choices only: it has no distribution to sample")

    def keep(self, cache: Any, moves: Any) -> None:
        self._drop_queued()  # no KV to move

    def _after(self, sequence: list[int], at: int) -> int:
        """The greedy choice after position `at` of the output (end of sequence past it)."""
        return sequence[at + 1] if at + 1 < len(sequence) else self.filler

    def _pass_s(self, rows: int) -> float:
        replays = math.ceil(rows / self.bucket)
        return replays * self.pass_s + (rows - replays) * self.row_s if rows > 0 else 0.0

    def _wait(self, rows: int) -> None:
        """Wait out the pass spinning, as CUDA's default synchronisation does while a kernel
        runs: the host's core stays awake and its caches warm. (With a sleeping wait the
        engine's host work measured ~25% slower per pass on a 2-core VM, its core woken
        cold after every pass: docs/benchmarks.md.)"""
        until = self._queue(self._pass_s(rows))
        while time.perf_counter() < until:
            pass
