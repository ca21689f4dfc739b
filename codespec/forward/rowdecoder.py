"""The row decoder's Python side without torch: kernels/rowdecoder.c over numpy buffers.

`RowDecoder` runs a Qwen2/Llama decoder stack (weights packed for rowgemm, given as
pointers) over rows of tokens in one C call: prefill chunks, decode steps and verify
passes alike, each row computed alone, so a verify pass's rows equal the decode steps
they stand for by construction (rows.py, the backend over it). It takes and returns
numpy arrays (bf16 as uint16). Its weights come from the safetensors files (weights.py:
no torch) or from a transformers model (hf_weights.py); either way the same packed
stripes, rotary tables (`rotary_tables`) and C code give the same bits.

    rows, path = plan_rows([(slot, length, tree)])       # a verify pass (rows.py)
    logits = decoder.forward(tree.tokens, rows, path, slots)  # uint16 [rows, vocab]
    rows, path = prefill_rows(slot, 0, len(prompt))       # a prefill chunk
    last = decoder.forward(prompt, rows, path, slots, logits_from=len(prompt) - 1)
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from codespec.kernels import int8, lmchoice
from codespec.kernels.rowgemm import AMX, STRIPE
from codespec.forward.base import Preempted, kv_dims

FAMILIES = ("qwen2", "llama")
LAYER_FIELDS = ("norm_in", "qkv", "qkv_bias", "o", "o_bias", "norm_post", "gate_up", "down")
PRODUCTS = ("qkv", "o", "gate_up", "down")  # a layer's matrices: bf16 stripes, or their int8 form

_pointer, _size = ctypes.c_void_p, ctypes.c_int64


class _Layer(ctypes.Structure):
    _fields_ = [(name, _pointer) for name in (*LAYER_FIELDS, *(f"{p}_q" for p in PRODUCTS),
                                              *(f"{p}_s" for p in PRODUCTS))]


class _Model(ctypes.Structure):
    _fields_ = [*((name, _size) for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "inter", "vocab")),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("layer", ctypes.POINTER(_Layer)),
                *((name, _pointer) for name in ("norm_final", "lm_head", "lm_bias", "cos", "sin")),
                ("positions", _size), ("lm_q", _pointer), ("lm_s", _pointer)]


_Stop = ctypes.CFUNCTYPE(ctypes.c_int)  # rowdecoder.c's Pass.stop: asked before each layer
STOPPED = -2  # rowdecoder_forward's answer when `stop` ended the pass
# The most prompt rows one prefill pass takes, per product path, where more than the
# cache's chunk pays: a row's bits do not depend on its pass, so this is speed alone.
# AMX (isa 3): the products are compute-bound at 256 rows, but every pass reads the
# layers' 716 MB again; on the 2-core Emerald Rapids VM, interleaved medians, 1,024-row
# passes prefilled 1,024 tokens 12-16% faster than 256-row ones, 2,048 tokens 18%
# (2,048-row passes: the same) and 512 tokens 12% (an AMX Xeon, 2026-11-27). The
# AVX-512 and AVX2 paths keep the chunk (256 was the fastest 1k-token prefill on them).
PREFILL_ROWS = {AMX: 1024}


class _Pass(ctypes.Structure):
    _fields_ = [("rows", _size),
                *((name, _pointer) for name in ("slot", "write", "position", "context", "path_start", "path_len",
                                                "path", "keys", "values")),
                ("capacity", _size), ("logits_from", _size), ("stop", _Stop)]


def _rope(config: Any) -> dict[str, Any]:
    # transformers 5 writes `rope_parameters`; older configs `rope_theta` and `rope_scaling`
    found = dict(getattr(config, "rope_scaling", None) or {})
    found.update(getattr(config, "rope_parameters", None) or {})
    return found


def rope_type(config: Any) -> str:
    rope = _rope(config)
    return str(rope.get("rope_type", rope.get("type", "default")))


def rope_theta(config: Any) -> float:
    return float(_rope(config).get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


def family_unsupported(config: Any, backend: str = "the row decoder") -> str | None:
    """Why `config`'s layers are not Qwen2/Llama ones as our own forwards compute them
    (this one and forward/cuda/forward.py): None when they are."""
    if getattr(config, "model_type", None) not in FAMILIES:
        return f"model type {getattr(config, 'model_type', None)!r} ({backend} knows {', '.join(FAMILIES)})"
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "mlp_bias", False):
        return "an MLP other than SiLU-gated without bias"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()) or (
            getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None)):
        return "layers with sliding-window attention"
    return None


def config_unsupported(config: Any) -> str | None:
    """Why the row decoder does not know the layers `config` describes (None: it does)."""
    family = family_unsupported(config)
    if family is not None:
        return family
    heads, (_, kv_heads, dim) = config.num_attention_heads, kv_dims(config)
    if dim not in (64, 128) or heads % kv_heads or heads // kv_heads > 16:
        return f"head layout {heads}x{dim} over {kv_heads} KV heads"
    if config.hidden_size % 16 or config.intermediate_size % STRIPE or (heads * dim) % STRIPE or (kv_heads * dim) % STRIPE:
        return f"widths not in whole {STRIPE}-column stripes"
    return None


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounded to nearest even as torch rounds."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32 values, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def rotary_tables(config: Any, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [positions, head_dim] as bf16 bits for the default rotary embedding,
    computed as transformers computes them (float32 frequencies, float32 angles,
    duplicated halves, rounded once to bf16; cos/sin themselves in float64, so no
    CPU's vector math library decides a bit)."""
    _, _, dim = kv_dims(config)
    base = rope_theta(config)
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (np.float32(1.0) / (np.float64(base) ** exponents.astype(np.float64)).astype(np.float32))
    angles = np.arange(positions, dtype=np.float32)[:, None] * inv_freq[None, :]  # float32, as torch's matmul
    angles = np.concatenate([angles, angles], axis=1).astype(np.float64)
    return (bf16_bits(np.cos(angles).astype(np.float32)), bf16_bits(np.sin(angles).astype(np.float32)))


@dataclass
class Weights:
    """Where a model's weights are for the C forward: pointers into buffers someone keeps
    alive (`keep`). Products are rowgemm stripes: qkv and gate_up fused per layer."""

    layers: list[dict[str, int | None]]  # per layer, LAYER_FIELDS -> address (None: no bias)
    norm_final: int
    lm_head: int
    lm_bias: int | None
    embed: np.ndarray  # uint16 [vocab, hidden]: bf16 embeddings
    vocab: int  # lm_head's rows
    scale: float  # attention's query scale
    keep: list[Any]
    parameters: int = 0  # the model's parameter count, for `model info`


class RowDecoder:
    """The model's decoder stack for prefill chunks, decode steps and verify passes (module
    docstring). `tables(positions)` gives rotary cos/sin as bf16 bits (default rope:
    `rotary_tables`)."""

    def __init__(self, lib: Any, isa: int, config: Any, weights: Weights, tables: Any = None,
                 quantize: str = "none") -> None:
        """`quantize="int8"`: every product and lm_head in int8 (kernels/int8.py), made here
        from the bf16 stripes (which stay allocated: +0.5 GB for the default model)."""
        lib.rowdecoder_forward.argtypes = [ctypes.c_int, ctypes.POINTER(_Model), ctypes.POINTER(_Pass), _pointer,
                                           _pointer, _pointer]
        lib.rowdecoder_forward.restype = ctypes.c_int
        lib.rowdecoder_work.argtypes, lib.rowdecoder_work.restype = [ctypes.POINTER(_Model), _size], _size
        self._lib, self.isa, self.weights = lib, isa, weights
        self._tables = tables or (lambda n: rotary_tables(config, n))
        layers = (_Layer * len(weights.layers))()
        for entry, pointers in zip(layers, weights.layers):
            for name in LAYER_FIELDS:
                setattr(entry, name, pointers.get(name))
        _, self.kv_heads, self.head_dim = kv_dims(config)
        self._layers = layers
        self.dims = _Model(layers=len(weights.layers), hidden=config.hidden_size, heads=config.num_attention_heads,
                           kv_heads=self.kv_heads, head_dim=self.head_dim, inter=config.intermediate_size,
                           vocab=weights.vocab, eps=float(config.rms_norm_eps), scale=float(weights.scale),
                           layer=layers, norm_final=weights.norm_final, lm_head=weights.lm_head,
                           lm_bias=weights.lm_bias)
        self.vocab = weights.vocab
        self.positions = 0
        self.reach(1024)
        self.quantize = quantize
        self.int8: list[int8.Int8Matrix] = []  # kept alive: the C forward reads them
        if quantize == "int8":
            self._quantize(config)
        # lm_head's int8 screen for greedy choices (kernels/lmchoice.py): 136 MB more
        # memory for the default model, ~14% fewer bytes read per decode step
        self.screen: int8.Int8Matrix | None = None
        if (quantize == "none" and weights.lm_bias is None and hasattr(lib, "rowdecoder_choices")
                and lmchoice.wanted()):
            lib.rowdecoder_choices.argtypes = [ctypes.c_int, ctypes.POINTER(_Model), _pointer, _pointer, _pointer,
                                               _pointer, ctypes.POINTER(_Pass), _pointer, _pointer, _pointer,
                                               _pointer, _pointer]
            lib.rowdecoder_choices.restype = ctypes.c_int
            self.screen = int8.pack(lib, weights.lm_head, weights.vocab, config.hidden_size)
        self._scores = np.empty((0, self.vocab), dtype=np.float32)  # the screen's scratch
        # the passes' work buffers, kept per thread: a fresh 9 MB buffer for each 256-row
        # prefill chunk faulted in its pages every time (~3% of a prefill on the AMX VM)
        self._local = threading.local()
        self.kept = np.zeros(0, dtype=np.int64)  # tokens the screen kept per row of the last `choices` (a prefix)

    def _quantize(self, config: Any) -> None:
        """Give the C forward the int8 form of every product and of lm_head."""
        hidden, inter, dim = config.hidden_size, config.intermediate_size, self.head_dim
        heads = config.num_attention_heads
        shapes = {"qkv": ((heads + 2 * self.kv_heads) * dim, hidden), "o": (hidden, heads * dim),
                  "gate_up": (2 * inter, hidden), "down": (hidden, inter)}
        for entry, pointers in zip(self._layers, self.weights.layers):
            for name in PRODUCTS:
                matrix = int8.pack(self._lib, pointers[name], *shapes[name])
                setattr(entry, f"{name}_q", matrix.q.ctypes.data)
                setattr(entry, f"{name}_s", matrix.scale.ctypes.data)
                self.int8.append(matrix)
        head = int8.pack(self._lib, self.weights.lm_head, self.vocab, hidden)
        self.dims.lm_q, self.dims.lm_s = head.q.ctypes.data, head.scale.ctypes.data
        self.int8.append(head)

    def reach(self, positions: int) -> None:
        """Make the rotary tables cover positions [0, positions) (a position's values do
        not depend on the others, so growing them changes no row)."""
        if positions <= self.positions:
            return
        cos, sin = self._tables(positions)
        self._cos_sin = (np.ascontiguousarray(cos, dtype=np.uint16), np.ascontiguousarray(sin, dtype=np.uint16))
        self.dims.cos, self.dims.sin = self._cos_sin[0].ctypes.data, self._cos_sin[1].ctypes.data
        self.dims.positions = positions
        self.positions = positions

    def slots(self, cache: Any) -> tuple[Any, Any, int]:
        """The per-layer addresses of a SlotCache's keys and values (tensors or arrays,
        contiguous bf16 [slots, kv_heads, capacity, head_dim]) that passes hand over."""
        keys, values, capacity = cache.addresses()  # checks contiguity and 2-byte elements
        for layer in (*cache.keys, *cache.values):
            assert tuple(layer.shape[1:]) == (self.kv_heads, capacity, self.head_dim), "a KV layout of another model"
        array = _pointer * len(keys)
        return array(*keys), array(*values), capacity

    def prefill(self, prompt: Sequence[int], slot: int, start: int, chunk: int, slots: tuple[Any, Any, int],
                preempted: Callable[[], bool] | None = None) -> np.ndarray:
        """Write the KV of prompt[start:] into `slot` in passes of `chunk` rows from
        `start`, or of PREFILL_ROWS where this path has more (each row sees the slot up
        to itself, so the passes bound the work buffer and change no bit); returns the
        logits (bf16 bits) after the last token: [1, vocab]. `preempted` is asked before each layer; True raises Preempted
        (a background prefill gives way to a request: SlotCache.preempted)."""
        logits = None
        rows_per_pass = max(chunk, PREFILL_ROWS.get(self.isa, 0))
        for begin in range(start, len(prompt), rows_per_pass):
            end = min(begin + rows_per_pass, len(prompt))
            rows, path = prefill_rows(slot, begin, end)
            logits = self.forward(prompt[begin:end], rows, path, slots, logits_from=end - begin - 1,
                                  preempted=preempted)
        assert logits is not None, "nothing to prefill"
        return logits

    def _pass(self, ids: Sequence[int], rows: np.ndarray, path: np.ndarray, slots: tuple[Any, Any, int],
              logits_from: int, preempted: Callable[[], bool] | None = None
              ) -> tuple[_Pass, np.ndarray, np.ndarray, np.ndarray]:
        """The C call's pass description (it keeps the stop callback alive), embeddings
        (overwritten by the call), work buffer."""
        count = len(ids)
        assert rows.dtype == np.int64 and rows.shape == (6, count) and rows.flags.c_contiguous
        assert 0 <= logits_from < count
        needed = int(rows[2].max()) + 1
        if needed > self.positions:
            self.reach(max(needed, 2 * self.positions))
        x = self.weights.embed[np.asarray(ids, dtype=np.int64)]  # a copy: the C forward overwrites it
        work = self._work(int(self._lib.rowdecoder_work(ctypes.byref(self.dims), count)))
        path = path if path.size else np.zeros(1, dtype=np.int64)
        base, stride = rows.ctypes.data, rows.strides[0]
        spec = _Pass(count, *(base + i * stride for i in range(6)), path.ctypes.data,
                     ctypes.cast(slots[0], _pointer), ctypes.cast(slots[1], _pointer), slots[2], logits_from,
                     _Stop() if preempted is None else _Stop(lambda: int(bool(preempted()))))
        return spec, x, work, path  # path: kept alive with the pass

    def _work(self, elements: int) -> np.ndarray:
        """This thread's work buffer, grown to `elements` bf16 values (its contents are
        scratch: every pass writes before it reads)."""
        work = getattr(self._local, "work", None)
        if work is None or work.size < elements:
            work = self._local.work = np.empty(elements, dtype=np.uint16)
        return work[:elements]

    def forward(self, ids: Sequence[int], rows: np.ndarray, path: np.ndarray, slots: tuple[Any, Any, int],
                logits_from: int = 0, preempted: Callable[[], bool] | None = None) -> np.ndarray:
        """Logits (bf16 bits) [len(ids) - logits_from, vocab] of rows logits_from.. . `rows`:
        int64 [6, len(ids)]: slot, write position, rotary position, context, path start,
        path length per row; `path`: int64 slot positions; `slots`: from `slots()`.
        Writes each row's K/V at (slot, write). `preempted`: see `prefill`."""
        spec, x, work, _ = self._pass(ids, rows, path, slots, logits_from, preempted)
        logits = np.empty((len(ids) - logits_from, self.vocab), dtype=np.uint16)
        status = self._lib.rowdecoder_forward(self.isa, ctypes.byref(self.dims), ctypes.byref(spec), x.ctypes.data,
                                              work.ctypes.data, logits.ctypes.data)
        if status == STOPPED:
            raise Preempted("a request came: the background prefill gives way")
        assert status == 0, "a row without keys, a position past the rotary tables, or no memory"
        return logits

    def choices(self, ids: Sequence[int], rows: np.ndarray, path: np.ndarray, slots: tuple[Any, Any, int],
                logits_from: int = 0) -> np.ndarray:
        """The greedy choice after each row logits_from.. (int64 [len(ids) - logits_from]):
        the argmax of `forward`'s logits (the first maximum, as torch.argmax), found through
        lm_head's int8 screen where the decoder has one (kernels/lmchoice.py), which reads
        half of lm_head's bytes. Same arguments, same K/V writes as `forward`."""
        if self.screen is None:
            return lmchoice.first_max(self.forward(ids, rows, path, slots, logits_from))
        spec, x, work, _ = self._pass(ids, rows, path, slots, logits_from)
        count = len(ids) - logits_from
        if self._scores.shape[0] < count:  # kept between passes: a fresh [rows, vocab] array faults in every page
            self._scores = np.empty((count, self.vocab), dtype=np.float32)
            self.kept = np.zeros(count, dtype=np.int64)
        picked = np.empty(count, dtype=np.int64)
        screen = self.screen
        status = self._lib.rowdecoder_choices(self.isa, ctypes.byref(self.dims), *screen.arguments(),
                                              ctypes.byref(spec), x.ctypes.data, work.ctypes.data,
                                              self._scores.ctypes.data, picked.ctypes.data, self.kept.ctypes.data)
        assert status == 0, "a row without keys, a position past the rotary tables, or no memory"
        return picked


def prefill_rows(slot: int, begin: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, path) for prompt positions [begin, end) of `slot`: each row at its own
    position, seeing the slot's keys up to and including itself (a decode step's view).

    >>> prefill_rows(1, 4, 6)[0].tolist()
    [[1, 1], [4, 5], [4, 5], [5, 6], [0, 0], [0, 0]]
    """
    positions = np.arange(begin, end, dtype=np.int64)
    zeros = np.zeros_like(positions)
    rows = np.stack([zeros + slot, positions, positions, positions + 1, zeros, zeros])
    return np.ascontiguousarray(rows), np.zeros(0, dtype=np.int64)
