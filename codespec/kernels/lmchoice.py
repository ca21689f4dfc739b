"""Greedy choices over lm_head through an int8 screen (`lmchoice.c`): the argmax of the
exact bf16 logits while reading about half of lm_head's bytes.

A greedy decode step or verify row needs one number from lm_head, the argmax, but the
full product reads every weight: 272 MB for the default model, 27% of a step. The screen
(`int8.pack` of lm_head) holds it as int8 with a scale and error terms per output; a row's
approximate logits then rule out all tokens but a few, whose exact logits come from
the bf16 stripes, computed as the full product computes them. lmchoice.c derives the
bound, so the choice is the full product's argmax by construction (`choices_ref` is
that argmax, and the tests compare the two).

    screen = int8.pack(lib, packed_lm_head_address, vocab, hidden)
    picked = choices(lib, isa, x_bits, screen, packed_lm_head_address)   # int64 [rows]

Torch-free (numpy and ctypes), like the row decoder that uses it.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from codespec.kernels import int8

_pointer, _size = ctypes.c_void_p, ctypes.c_int64


def wanted() -> bool:
    """Whether the lm_screen setting allows the screen (default on; a typo is an error)."""
    from codespec.settings import current

    return current().lm_screen == "on"


def declare(lib: Any) -> Any:
    """lmchoice.c's signatures on the kernel library (idempotent)."""
    lib.lmchoice_choose.argtypes = [ctypes.c_int, _pointer, _size, _size, _pointer, _pointer, _pointer, _pointer,
                                    _pointer, _size, _size, _pointer, _pointer, _pointer]
    lib.lmchoice_choose.restype = ctypes.c_int
    lib.lmchoice_full_rows.argtypes, lib.lmchoice_full_rows.restype = [ctypes.c_int], ctypes.c_int
    lib.lmchoice_first_max.argtypes, lib.lmchoice_first_max.restype = [_pointer, _size], ctypes.c_int64
    return lib


def full_rows(lib: Any, isa: int) -> int | None:
    """The fewest rows of a pass whose lm_head `choices` computes in full rather than
    screening on path `isa` (on AMX the full product of a few rows costs less than their
    screen), None where it always screens."""
    rows = int(declare(lib).lmchoice_full_rows(isa))
    return None if rows < 0 else rows


def choices(lib: Any, isa: int, x: np.ndarray, screen: int8.Int8Matrix, lm_head: int,
            kept: np.ndarray | None = None) -> np.ndarray:
    """The argmax of each row's exact logits bf16(x @ lm_head.T) (x: uint16 bf16 bits
    [rows, hidden]), the first maximum as torch.argmax; `kept` (int64 [rows]) gets how many
    tokens each row's screen kept."""
    x = np.ascontiguousarray(x, dtype=np.uint16)
    rows = x.shape[0]
    assert x.shape == (rows, screen.k)
    scores = np.empty((rows, screen.n), dtype=np.float32)
    picked = np.empty(rows, dtype=np.int64)
    assert kept is None or (kept.dtype == np.int64 and kept.shape == (rows,))
    status = declare(lib).lmchoice_choose(isa, x.ctypes.data, screen.k, rows, *screen.arguments(), lm_head,
                                          screen.n, screen.k, scores.ctypes.data, picked.ctypes.data,
                                          None if kept is None else kept.ctypes.data)
    if status != 0:
        raise MemoryError("lmchoice_choose: out of memory")
    return picked


def first_max(logits: np.ndarray) -> np.ndarray:
    """torch.argmax over bf16 bits [rows, vocab]: the first maximum per row, a NaN above all."""
    values = (logits.astype(np.uint32) << 16).view(np.float32)
    return np.argmax(values, axis=-1).astype(np.int64)  # numpy's argmax also takes the first NaN


def choices_ref(lib: Any, isa: int, x: np.ndarray, lm_head: int, vocab: int) -> np.ndarray:
    """The reference: the full product through rowgemm, then `first_max`."""
    x = np.ascontiguousarray(x, dtype=np.uint16)
    rows, hidden = x.shape
    logits = np.empty((rows, vocab), dtype=np.uint16)
    lib.rowgemm_bf16(isa, x.ctypes.data, hidden, lm_head, None, logits.ctypes.data, vocab, rows, vocab, hidden)
    return first_max(logits)
