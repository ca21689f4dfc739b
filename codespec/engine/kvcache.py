"""Per-request KV slots: one preallocated cache that every request shares, with exact
prefix reuse.

Layout, per layer: keys and values of shape [slots, kv_heads, slot_tokens, head_dim]. A
request holds one slot for its life. The first `length(s)` positions of slot s hold the
KV of its committed context (every committed token but the pending one); a verify pass
writes its rows at `length(s) + node`, and the verifier then compacts the accepted path
and advances the length. Positions past the length are garbage, never attended.

Prefix reuse (an editor completing in the same file again, an agent resending a
conversation): a finished request's slot keeps its KV and token ids. A new request
takes the free slot that shares the longest reusable prefix with its prompt (the least
recently used one when none does) and prefills only the rest. Reuse changes no output:
prompts are prefilled in passes at absolute positions that depend on the prompt's
length alone (`spans`), so a pass's KV depends only on the tokens up to its end, and
only whole passes a prefill computed are ever reused where a fresh prefill of the new
prompt would run the very same pass, bit for bit:

- whole chunks of `chunk` tokens on the grid (0, chunk, 2 * chunk, ...);
- the prompt's last, partial chunk in sub-chunks of `tail` tokens on their grid. A
  person typing makes prompts that end in the same chunk again and again: they share
  its whole sub-chunks, and only the rest is read again (~16 tokens on average instead
  of ~128 with 256-token chunks). A prompt that ends in a later chunk computes that
  chunk whole, so it reuses none of the sub-chunks. On a GPU the sub-chunk is the whole
  chunk (`tail_tokens`): there a pass costs its launches, not its tokens.

A backend whose prefill computes each position as a decode step would (the row decoder,
the cuda backend's bucket replays: `Forward.prefill_exact`) gets a position's KV from the
tokens up to it alone, however the prompt is cut into passes. For it the cache is
`exact_prefix`: every cached prompt token is reusable, a prefill resumes at any position,
and a person who typed six tokens has six tokens prefilled, not the rest of a sub-chunk.

    cache = SlotCache(model.config, slots=4, slot_tokens=4096, dtype=torch.bfloat16)
    cache = SlotCache(config, slots=1, slot_tokens=4096, dtype=numpy.uint16)  # bf16 bits, no torch (forward/rows.py)
    slot, reused = cache.acquire(prompt_ids)       # reused: tokens whose KV is kept
    ...
    cache.release(slot)                            # the KV stays for the next request
"""

from __future__ import annotations

import itertools
import math
import mmap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from codespec.forward import rowplan
from codespec.forward.base import Preempted, kv_dims  # noqa: F401 (re-exported)
from codespec.errors import CodespecError

if TYPE_CHECKING:
    import torch

# A KV dtype is a torch dtype (tensors), or a numpy dtype: numpy arrays, uint16 holding
# bf16 bits (the row decoder, forward/rows.py).
KVDtype = Any

DEFAULT_CHUNK = 256  # prefill chunk: the fastest 1k-token prefill here, 128 costs +20% (decisions.md)
TAIL_PARTS = 8  # a prompt's last, partial chunk runs in sub-chunks of chunk / TAIL_PARTS tokens


def tail_tokens(chunk: int, device: Any) -> int:
    """The sub-chunk of a prompt's last chunk (module docstring) on `device`: chunk /
    TAIL_PARTS on a CPU, where a pass costs its tokens; the whole chunk on a GPU, where an
    eager prefill pass costs its ~800 kernel launches whatever its tokens, so sub-chunks
    only add passes (H100, edit requests: time to first token 0.06 s with whole chunks,
    0.24 s with sub-chunks).

    >>> tail_tokens(256, "cpu"), tail_tokens(256, "cuda:0")
    (32, 256)
    """
    return chunk if str(device).startswith("cuda") else max(1, chunk // TAIL_PARTS)


class CacheFull(CodespecError):
    """No KV slot is free (the scheduler admits no more requests than slots)."""


@dataclass
class _Slot:
    tokens: list[int] = field(default_factory=list)  # ids whose KV the slot holds, in order
    reusable: int = 0  # leading tokens whose KV whole prefill passes computed
    tail_start: int = 0  # where the prefill's sub-chunked last chunk began (= reusable when none)
    busy: bool = False
    last_used: int = 0


def _is_numpy(dtype: KVDtype) -> bool:
    return isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic))


def _element_size(dtype: KVDtype) -> int:
    if _is_numpy(dtype):
        return np.dtype(dtype).itemsize
    import torch

    return torch.empty((), dtype=dtype).element_size()


def address(array: Any) -> int:
    """Where a tensor's or array's data starts."""
    return array.ctypes.data if isinstance(array, np.ndarray) else array.data_ptr()


def _zeros(shape: tuple[int, ...], dtype: KVDtype, device: Any) -> Any:
    """A zero tensor whose CPU pages are only touched when written: an anonymous mmap
    maps the OS's zero pages, where torch.zeros writes every byte (a 1 GiB cache took
    1.3 s to start, though a CLI request fills one slot of ten). Not calloc (numpy's
    zeros): glibc's calloc clears every byte itself when the block comes from a
    thread's arena, below its mmap threshold, as each layer's ~20 MiB did when
    `codespec serve` loaded on its scheduler thread: 1 GiB resident before any request.
    Unused positions must still read as zeros, not garbage: padded attention calls
    multiply them (masked) and a NaN there would poison the row."""
    nbytes = max(math.prod(shape) * _element_size(dtype), 1)
    if _is_numpy(dtype):
        return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype, count=math.prod(shape)).reshape(shape)
    import torch

    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    zeros = np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)  # keeps the map alive
    return torch.from_numpy(zeros).view(dtype).view(shape)


def bytes_per_token(config: Any, dtype: KVDtype) -> int:
    layers, kv_heads, head_dim = kv_dims(config)
    return 2 * layers * kv_heads * head_dim * _element_size(dtype)


class SlotCache:
    """The KV of every active (and recently finished) request; see the module docstring.

    It is also the `past_key_values` the model sees during a forward: the model calls
    `update(keys, values, layer_idx)` and the verifier's `plan` says where each row goes."""

    def __init__(self, config: Any, *, slots: int, slot_tokens: int, dtype: KVDtype,
                 device: Any = "cpu", chunk: int = DEFAULT_CHUNK) -> None:
        if slots < 1 or slot_tokens < 2 or chunk < 1:
            raise CodespecError(f"a KV cache needs slots >= 1, slot_tokens >= 2, chunk >= 1; got "
                                f"{slots}, {slot_tokens}, {chunk}")
        layers, kv_heads, head_dim = kv_dims(config)
        # Row-exact attention reads up to rowplan.padded_length(n) positions for n tokens
        # (masked, but they must exist): the storage is that much longer than a slot holds.
        shape = (slots, kv_heads, rowplan.padded_length(slot_tokens), head_dim)
        self.keys = [_zeros(shape, dtype, device) for _ in range(layers)]  # per layer
        self.values = [_zeros(shape, dtype, device) for _ in range(layers)]
        self.slot_tokens = slot_tokens
        self.chunk = chunk
        self.tail = tail_tokens(chunk, device)
        # set by the Verifier from its backend (module docstring): any prefix is reusable
        self.exact_prefix = False
        self._slots = [_Slot() for _ in range(slots)]
        self._lengths = [0] * slots
        self._clock = itertools.count(1)
        self.plan: Any = None  # set by the verifier around each forward (attention.Plan)
        # set around a background prefill (Engine.prefill_ahead): asked at every layer's
        # update, True ends the forward with Preempted, so that a request never waits for
        # a whole chunk of work nobody asked for (~2 s per 256 tokens on a 2-core CPU)
        self.preempted: Callable[[], bool] | None = None

    @classmethod
    def within_budget(cls, config: Any, *, budget_mb: int, slot_tokens: int, dtype: KVDtype,
                      device: Any = "cpu", chunk: int = DEFAULT_CHUNK) -> SlotCache:
        """As many slots as `budget_mb` MiB hold; a clear error when it holds none."""
        slot_bytes = bytes_per_token(config, dtype) * rowplan.padded_length(slot_tokens)
        slots = (budget_mb << 20) // slot_bytes
        if slots < 1:
            raise CodespecError(
                f"kv_cache_mb={budget_mb} cannot hold one slot of {slot_tokens} tokens "
                f"({slot_bytes / 2**20:.0f} MiB); raise kv_cache_mb or lower kv_slot_tokens"
            )
        return cls(config, slots=int(slots), slot_tokens=slot_tokens, dtype=dtype, device=device, chunk=chunk)

    def addresses(self) -> tuple[list[int], list[int], int]:
        """(per-layer key addresses, value addresses, positions per slot row) for the C
        forward (forward/rowdecoder.py), which reads and writes the storage in place."""
        for layer in (*self.keys, *self.values):
            contiguous = layer.flags.c_contiguous if isinstance(layer, np.ndarray) else layer.is_contiguous()
            assert contiguous and _element_size(layer.dtype) == 2, "the C forward reads contiguous bf16 slots"
        return [address(k) for k in self.keys], [address(v) for v in self.values], self.keys[0].shape[2]

    # -- slots -----------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return len(self._slots)

    @property
    def free_slots(self) -> int:
        return sum(not s.busy for s in self._slots)

    def length(self, slot: int) -> int:
        return self._lengths[slot]

    def acquire(self, prompt_ids: Sequence[int]) -> tuple[int, int]:
        """Take a free slot for a prompt; returns (slot, tokens of the prompt already cached)."""
        best, best_reuse = -1, -1
        for index, state in enumerate(self._slots):
            if state.busy:
                continue
            reuse = self._reusable(state, prompt_ids)
            older = best >= 0 and state.last_used < self._slots[best].last_used
            if reuse > best_reuse or (reuse == best_reuse and older):
                best, best_reuse = index, reuse
        if best < 0:
            raise CacheFull("every KV slot is in use")
        state = self._slots[best]
        state.busy = True
        del state.tokens[best_reuse:]
        state.reusable = best_reuse
        state.tail_start = min(state.tail_start, best_reuse)
        self._lengths[best] = best_reuse
        return best, best_reuse

    def tokens(self, slot: int) -> list[int]:
        """The tokens whose KV the slot holds, in order."""
        return list(self._slots[slot].tokens)

    def reusable(self, prompt_ids: Sequence[int]) -> int:
        """The tokens of a prompt the free slot that holds most of it would reuse
        (what `acquire` would return; nothing is taken)."""
        return max((self._reusable(s, prompt_ids) for s in self._slots if not s.busy), default=0)

    def clear(self) -> None:
        """Forget every cached prompt (benchmarks start each system from nothing)."""
        for index, state in enumerate(self._slots):
            if not state.busy:
                state.tokens.clear()
                state.reusable = state.tail_start = 0
                self._lengths[index] = 0

    def release(self, slot: int) -> None:
        state = self._slots[slot]
        state.busy = False
        state.last_used = next(self._clock)

    def spans(self, length: int, start: int = 0) -> list[tuple[int, int]]:
        """The passes a prefill of a `length`-token prompt runs from `start` (a boundary
        of them): whole chunks, then the last, partial chunk in sub-chunks (module
        docstring). Every backend whose bits depend on a pass's rows prefills by these.
        With `exact_prefix`, chunks from `start`, wherever it is.

        >>> SlotCache.spans_of(600, 0, 256, 32)[-4:]
        [(256, 512), (512, 544), (544, 576), (576, 600)]
        """
        if self.exact_prefix:
            return [(begin, min(begin + self.chunk, length)) for begin in range(start, length, self.chunk)]
        return self.spans_of(length, start, self.chunk, self.tail)

    @staticmethod
    def spans_of(length: int, start: int, chunk: int, tail: int) -> list[tuple[int, int]]:
        last = length - length % chunk  # where the partial last chunk starts (length: none)
        assert start % chunk == 0 or (start > last and (start - last) % tail == 0), "a pass boundary"
        out = [(begin, begin + chunk) for begin in range(start, last, chunk)]
        return out + [(begin, min(begin + tail, length)) for begin in range(max(start, last), length, tail)]

    def reusable_end(self, length: int) -> int:
        """How much of a `length`-token prompt's KV a later prompt could reuse: its whole
        passes short of its last token (whose logits a request needs)."""
        if self.exact_prefix:
            return length - 1
        ends = [end for _, end in self.spans(length) if end < length]
        return ends[-1] if ends else 0

    def _reusable(self, state: _Slot, prompt_ids: Sequence[int]) -> int:
        # Whole passes that a fresh prefill of this prompt would run too, and never the
        # prompt's last token: its logits are needed.
        limit = min(state.reusable, len(prompt_ids) - 1)
        common = 0
        for cached, new in zip(state.tokens[:limit], prompt_ids[:limit]):
            if cached != new:
                break
            common += 1
        if self.exact_prefix:
            return common
        last = len(prompt_ids) - len(prompt_ids) % self.chunk
        if common > state.tail_start and last == state.tail_start:  # the same last chunk: its sub-chunks
            return common - (common - last) % self.tail
        common = min(common, state.tail_start)
        return common - common % self.chunk

    # -- bookkeeping the verifier does after each forward ---------------------------------
    def prefilled(self, slot: int, prompt_ids: Sequence[int]) -> None:
        """The whole prompt's KV is in the slot; its whole passes become reusable."""
        state = self._slots[slot]
        state.tokens[:] = list(prompt_ids)
        n = len(prompt_ids)
        state.tail_start = n - n % self.chunk
        state.reusable = n if self.exact_prefix else state.tail_start + (n - state.tail_start) // self.tail * self.tail
        self._lengths[slot] = n

    def committed(self, slot: int, token_ids: Sequence[int]) -> None:
        """A verify pass kept the KV of `token_ids` (the pending token and the accepted
        path) right after the slot's length."""
        self._slots[slot].tokens.extend(token_ids)
        self._lengths[slot] += len(token_ids)
        assert self._lengths[slot] == len(self._slots[slot].tokens)

    # -- the model's side (transformers calls this from every attention layer) -----------
    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """key, value: [1, kv_heads, rows, head_dim] for the pass's packed rows; each row
        is stored at its (slot, position) from the plan. Attention reads the slots."""
        if self.preempted is not None and self.preempted():
            raise Preempted("a request came: the background prefill gives way")
        slots, positions = self.plan.write_slots, self.plan.write_positions  # [rows] each
        self.keys[layer_idx][slots, :, positions] = key[0].transpose(0, 1)
        self.values[layer_idx][slots, :, positions] = value[0].transpose(0, 1)
        return key, value

    def get_seq_length(self, layer_idx: int = 0) -> int:
        raise AssertionError("the verifier always passes position_ids")
