"""int8 weights for codespec's C paths (`int8.c`): lm_head's screen and `--quantize int8`.

A matrix packed for rowgemm ([N, K] bf16 in stripes) gets an int8 form in the same
stripes with one step per output (`pack`): w = scale * q + e, |q| <= 127. Products cut
each row into blocks of 64 inputs, each block to int16 with its own step, and sum
q * r exactly in int32 (AVX-512 VNNI or a plain loop: the same integers), then scale in
float in a fixed order. Every output is a function of its own row and column only, so
products are row-exact by construction, as rowgemm's are; the int8 form reads half the
bytes of the bf16 one.

    weight = pack(lib, packed_address, n, k)
    out = linear(lib, isa, x_bits, weight)    # uint16 bf16 bits [rows, n]

Torch-free (numpy and ctypes).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from codespec.kernels.rowgemm import STRIPE

QUANTIZE_CHOICES = ("none", "int8")  # Settings.quantize
_pointer, _size = ctypes.c_void_p, ctypes.c_int64


def declare(lib: Any) -> Any:
    """int8.c's signatures on the kernel library (idempotent)."""
    lib.int8_pack.argtypes = [_pointer, _size, _size, _pointer, _pointer, _pointer, _pointer]
    lib.int8_pack.restype = None
    lib.int8_linear.argtypes = [ctypes.c_int, _pointer, _size, _pointer, _pointer, _pointer, _pointer, _size, _size,
                                _size, _size]
    lib.int8_linear.restype = ctypes.c_int
    lib.int8_isa.argtypes, lib.int8_isa.restype = [ctypes.c_int], ctypes.c_int
    return lib


@dataclass(frozen=True)
class Int8Matrix:
    """A matrix [n, k] as int8 in rowgemm's stripe layout, with per-output step and error
    terms (int8.c; lmchoice.c's bound reads `slack` and `qslack`)."""

    q: np.ndarray  # int8 [stripes, k / 2, STRIPE, 2]
    scale: np.ndarray  # float32 [n]: the int8 step
    slack: np.ndarray  # float32 [n]: the bound's term per unit of sum |x|
    qslack: np.ndarray  # float32 [n]: the bound's term per unit of the row's int16 error
    n: int
    k: int

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes + self.slack.nbytes + self.qslack.nbytes

    def arguments(self) -> tuple[int, int, int, int]:
        """q, scale, slack, qslack addresses, in the C functions' order."""
        return self.q.ctypes.data, self.scale.ctypes.data, self.slack.ctypes.data, self.qslack.ctypes.data


def pack(lib: Any, packed: int, n: int, k: int) -> Int8Matrix:
    """The int8 form of the rowgemm-packed bf16 matrix at address `packed` ([n, k], k even);
    ~40 ms for the default model's lm_head (136M weights) on two threads."""
    assert k % 2 == 0, "rows are read in pairs"
    q = np.empty((-(-n // STRIPE), k // 2, STRIPE, 2), dtype=np.int8)
    scale, slack, qslack = (np.empty(n, dtype=np.float32) for _ in range(3))
    declare(lib).int8_pack(packed, n, k, q.ctypes.data, scale.ctypes.data, slack.ctypes.data, qslack.ctypes.data)
    return Int8Matrix(q, scale, slack, qslack, n, k)


def isa(lib: Any, cap: int) -> int:
    """The path int8 products take here: 2 (AVX-512 VNNI) or 0 (plain loop), at most `cap`."""
    return int(declare(lib).int8_isa(cap))


def linear(lib: Any, isa: int, x: np.ndarray, weight: Int8Matrix, bias: np.ndarray | None = None) -> np.ndarray:
    """bf16(x . (scale * q)^T + bias) for x: uint16 bf16 bits [rows, k]; bias: bf16 bits [n]."""
    x = np.ascontiguousarray(x, dtype=np.uint16)
    rows = x.shape[0]
    assert x.shape == (rows, weight.k) and (bias is None or bias.shape == (weight.n,))
    out = np.empty((rows, weight.n), dtype=np.uint16)
    bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.uint16)
    status = declare(lib).int8_linear(isa, x.ctypes.data, weight.k, weight.q.ctypes.data, weight.scale.ctypes.data,
                                      None if bias is None else bias.ctypes.data, out.ctypes.data, weight.n, rows,
                                      weight.n, weight.k)
    if status != 0:
        raise MemoryError("int8_linear: out of memory")
    return out


def dequantized(weight: Int8Matrix) -> np.ndarray:
    """The float32 matrix [n, k] the int8 form stands for (scale * q): for references."""
    q = weight.q.transpose(0, 2, 1, 3).reshape(-1, weight.k)[: weight.n].astype(np.float32)
    return q * weight.scale[:, None]
