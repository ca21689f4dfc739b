"""Row-exact bf16 linear layers on CPU: `rowgemm.c`, built once per machine with the C compiler.

`rowgemm(x, weight, bias)` is `F.linear` in bfloat16 whose rows never depend on each
other: each output is one dot product summed in an order fixed by K alone (rowgemm.c
says which), so a verify pass's row equals its decode step's by construction, not by a
probe of someone else's kernels. Weights are packed once (`pack`) into stripes of 64
output columns, one sequential stream each, so a decode step reads them at the
memory's speed. Measured on the 2-core EPYC VM over 1 GB of the default model's layer
shapes: one row 29 ms (oneDNN's packed two-row GEMM: 64 ms), 16 rows 84 ms (96), 64
rows 200 ms (232), 256 rows faster than `F.linear`.

The fast paths: AMX (Intel's tile unit, amx.c) where the CPU has it and Linux grants it,
else AVX-512 BF16, else AVX2 with FMA; `isa()` says which this process runs (one for
every pass: their bits differ), and rowblocks.py uses the kernel only on those.
`CODESPEC_AMX=off` keeps an AMX machine on AVX-512 BF16. The scalar path exists so the
contract can be tested anywhere (`isa_cap=0`). Measured on a 2-core Emerald Rapids
Xeon, 2 threads, the MLP's two products (4864 x 896 and back): one row 0.48 ms on AMX
and 0.49 on AVX-512 BF16 (both read the weights at the memory's speed), 32 rows 0.61
against 3.46, 256 rows 2.75 against 28.2 (torch's oneDNN: 1.27, 1.18, 3.84).

The library is built with the C compiler at first use (native.py); without one the
caller keeps oneDNN.

>>> import torch
>>> x, w = torch.ones(3, 64, dtype=torch.bfloat16), torch.full((5, 64), 0.5, dtype=torch.bfloat16)
>>> rowgemm(x, pack(w), isa_cap=0)[0].tolist()  # doctest: +SKIP
[32.0, 32.0, 32.0, 32.0, 32.0]
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from codespec.kernels import check, native

if TYPE_CHECKING:  # imported where a tensor is handled: the torch-free load (forward/direct.py) has none
    import torch

AMX = 3  # rowgemm_isa's answers: the fast paths (amx.c: Intel's tile unit; other bits than AVX512_BF16's),
AVX512_BF16 = 2
AVX2 = 1  # fp32 FMA over widened bf16 (CPUs without AVX-512: Zen 2/3, Intel client cores)
SCALAR = 0
STRIPE = 64  # output columns per stripe (rowgemm.c; checked against the library on load)
unavailable = native.unavailable


@functools.cache
def library() -> ctypes.CDLL | None:
    """The kernel library with rowgemm's signatures declared; None where it cannot be built,
    or where it packs another stripe width than this module."""
    lib = native.library()
    if lib is None:
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    lib.rowgemm_isa.argtypes, lib.rowgemm_isa.restype = [ctypes.c_int], ctypes.c_int
    lib.rowgemm_bf16.argtypes = [ctypes.c_int, pointer, size, pointer, pointer, pointer, size, size, size, size]
    lib.rowgemm_bf16.restype = None
    lib.rowgemm_pack.argtypes, lib.rowgemm_pack.restype = [pointer, size, size, size, pointer], None
    if lib.rowgemm_stripe() != STRIPE:
        native._failure.append(f"the library packs {lib.rowgemm_stripe()} columns a stripe, not {STRIPE}")
        return None
    return lib


def default_cap() -> int:
    """The fastest path a process may take: AMX unless the amx setting is off (a typo is an error)."""
    from codespec.settings import current

    return AVX512_BF16 if current().amx == "off" else AMX


@functools.cache
def isa(cap: int | None = None) -> int | None:
    """The path this CPU runs (AMX, AVX512_BF16, AVX2 or SCALAR), at most `cap`
    (`default_cap()` when None); None without the library."""
    lib = library()
    return None if lib is None else int(lib.rowgemm_isa(default_cap() if cap is None else cap))


@dataclass(frozen=True)
class Packed:
    """A weight [N, K] in rowgemm.c's stripes: `data` [stripes, 2, K/2, STRIPE/2, 2] bf16
    (each stripe two halves of columns, each its pairs in order), zero-padded to whole
    stripes and an even K."""

    data: torch.Tensor
    out_features: int  # N
    in_features: int  # K, before padding

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features


def packed_elements(shape: tuple[int, int]) -> int:
    """bf16 values `pack` stores for a weight of `shape` [N, K]."""
    n, k = shape
    return -(-n // STRIPE) * -(-k // 2) * STRIPE * 2


def pack(weight: torch.Tensor, out: torch.Tensor | None = None) -> Packed:
    """Lay `weight` [N, K] (bf16, CPU) out in stripes: a copy the size of the weight, into
    `out` (a contiguous bf16 tensor of `packed_elements` values) when given."""
    import torch

    check(weight.dim() == 2 and weight.dtype == torch.bfloat16 and weight.device.type == "cpu",
          "rowgemm packs a bfloat16 [N, K] CPU matrix")
    n, k = weight.shape
    stripes, pairs = -(-n // STRIPE), -(-k // 2)
    check(out is None or (out.dtype == torch.bfloat16 and out.is_contiguous()
                          and out.numel() == packed_elements((n, k))), "out must hold the packed weight")
    lib = library()
    check(lib is not None, f"the rowgemm kernel is not available: {unavailable()}")
    assert lib is not None
    source = weight.detach() if weight.stride(1) == 1 else weight.detach().contiguous()
    layout = (stripes, 2, pairs, STRIPE // 2, 2)
    data = torch.empty(layout, dtype=torch.bfloat16) if out is None else out.view(layout)
    lib.rowgemm_pack(source.data_ptr(), n, k, source.stride(0), data.data_ptr())
    return Packed(data, n, k)


def unpack(packed: Packed) -> torch.Tensor:
    """The weight [N, K] back from its stripes (a copy)."""
    stripes, _, pairs = packed.data.shape[:3]
    full = packed.data.permute(0, 1, 3, 2, 4).reshape(stripes * STRIPE, pairs * 2)
    return full[: packed.out_features, : packed.in_features].contiguous()


def rowgemm(x: torch.Tensor, weight: Packed, bias: torch.Tensor | None = None, *,
            isa_cap: int | None = None) -> torch.Tensor:
    """`F.linear(x, W, bias)` in bf16 on CPU for W packed by `pack`, every row computed alone.

    x: [..., K] bf16; bias: [N] bf16 or None; returns [..., N]."""
    import torch

    lib = library()
    check(lib is not None, f"the rowgemm kernel is not available: {unavailable()}")
    check(isinstance(weight, Packed), "rowgemm takes a weight packed by rowgemm.pack")
    check(x.dtype == torch.bfloat16 and x.device.type == "cpu", "rowgemm multiplies bfloat16 CPU tensors")
    n, k = weight.shape
    check(x.shape[-1] == k, f"x has {x.shape[-1]} features, weight {k}")
    check(bias is None or (bias.dtype == torch.bfloat16 and bias.shape == (n,) and bias.is_contiguous()),
          "bias must be a contiguous bfloat16 [N] vector")
    flat = x.reshape(-1, k)
    if k % 2:  # the kernel reads x in pairs: a zero completes the last one
        flat = torch.nn.functional.pad(flat, (0, 1))
    elif flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows = flat.shape[0]
    out = torch.empty(rows, n, dtype=torch.bfloat16)
    if rows:
        assert lib is not None
        lib.rowgemm_bf16(isa(isa_cap), flat.data_ptr(), flat.stride(0), weight.data.data_ptr(),
                         None if bias is None else bias.data_ptr(), out.data_ptr(), n, rows, n, flat.shape[1])
    return out.view(*x.shape[:-1], n)


def rowgemm_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same product in float32 torch, rounded once to bf16 (equal up to summation order)."""
    import torch

    out = x.float() @ weight.float().T
    if bias is not None:
        out = out + bias.float()
    return out.to(torch.bfloat16)
