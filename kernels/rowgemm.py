"""Row-exact bf16 linear layers on CPU: `rowgemm.c`, built once per machine with the C compiler.

`rowgemm(x, weight, bias)` is `F.linear` in bfloat16 whose rows never depend on each
other: each output is one dot product summed in an order fixed by K alone (rowgemm.c
says which), so a verify pass's row equals its decode step's by construction, not by a
probe of someone else's kernels. Weights are packed once (`pack`) into stripes of 64
output columns, one sequential stream each, so a decode step reads them at the
memory's speed. Measured on the 2-core EPYC VM over 1 GB of the default model's layer
shapes: one row 29 ms (oneDNN's packed two-row GEMM: 64 ms), 16 rows 84 ms (96), 64
rows 200 ms (232), 256 rows faster than `F.linear`.

Only the AVX-512 BF16 path is fast; `isa()` says whether this CPU has it, and
rowblocks.py uses the kernel only then. The scalar path exists so the contract can be
tested anywhere (`isa_cap=0`).

Build: `gcc -O3 -shared -fPIC -fopenmp rowgemm.c` (about a second) into
`<cache>/kernels/rowgemm-<hash>.so`, the hash covering the source, the flags and the
compiler's version; written to a temporary name and renamed, so concurrent first uses
and interrupted builds leave no broken library. `-fopenmp` links `libgomp.so.1`, which
the loader resolves to the copy torch already loaded: one thread pool, sized by
`torch.set_num_threads`. No compiler (or a failed build) means no kernel: `library()`
returns None with the reason in `unavailable()`, and the caller keeps oneDNN.

>>> import torch
>>> x, w = torch.ones(3, 64, dtype=torch.bfloat16), torch.full((5, 64), 0.5, dtype=torch.bfloat16)
>>> rowgemm(x, pack(w), isa_cap=0)[0].tolist()  # doctest: +SKIP
[32.0, 32.0, 32.0, 32.0, 32.0]
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from codespec.kernels import check

SOURCE = Path(__file__).with_name("rowgemm.c")
FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp")
AVX512_BF16 = 2  # rowgemm_isa's answer for the fast path
SCALAR = 0
STRIPE = 64  # output columns per stripe (rowgemm.c; checked against the library on load)


def _cache_dir() -> Path:
    from codespec.settings import default_cache_dir

    return Path(os.environ.get("CODESPEC_CACHE_DIR") or default_cache_dir()) / "kernels"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name, suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed on {SOURCE.name}: {done.stderr.strip().splitlines()[-1:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_failure: list[str] = []  # why library() returned None (once per process)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot be built or loaded."""
    compiler = _compiler()
    if compiler is None:
        _failure.append("no C compiler (gcc or cc) on PATH")
        return None
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
        digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + version.encode()
                                + platform.machine().encode()).hexdigest()[:16]
        target = _cache_dir() / f"rowgemm-{digest}.so"
        if not target.exists():
            _build(compiler, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        _failure.append(f"{type(err).__name__}: {err}")
        warnings.warn(f"rowgemm kernel unavailable ({_failure[0]}): linear layers fall back to oneDNN",
                      RuntimeWarning, stacklevel=2)
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    lib.rowgemm_isa.argtypes, lib.rowgemm_isa.restype = [ctypes.c_int], ctypes.c_int
    lib.rowgemm_bf16.argtypes = [ctypes.c_int, pointer, size, pointer, pointer, pointer, size, size, size, size]
    lib.rowgemm_bf16.restype = None
    if lib.rowgemm_stripe() != STRIPE:
        _failure.append(f"{target.name} packs {lib.rowgemm_stripe()} columns a stripe, not {STRIPE}")
        return None
    return lib


def unavailable() -> str | None:
    """Why the kernel could not be built or loaded (None if it was, or was never tried)."""
    return _failure[0] if _failure else None


@functools.cache
def isa(cap: int = AVX512_BF16) -> int | None:
    """The path this CPU runs (AVX512_BF16 or SCALAR), None without the library."""
    lib = library()
    return None if lib is None else int(lib.rowgemm_isa(cap))


@dataclass(frozen=True)
class Packed:
    """A weight [N, K] in rowgemm.c's stripes: `data` [stripes, K/2, STRIPE, 2] bf16,
    zero-padded to whole stripes and an even K."""

    data: torch.Tensor
    out_features: int  # N
    in_features: int  # K, before padding

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features


def pack(weight: torch.Tensor) -> Packed:
    """Lay `weight` [N, K] (bf16, CPU) out in stripes: a copy the size of the weight."""
    check(weight.dim() == 2 and weight.dtype == torch.bfloat16 and weight.device.type == "cpu",
          "rowgemm packs a bfloat16 [N, K] CPU matrix")
    n, k = weight.shape
    padded = torch.nn.functional.pad(weight.detach(), (0, k % 2, 0, -n % STRIPE))
    stripes, pairs = padded.shape[0] // STRIPE, padded.shape[1] // 2
    data = padded.view(stripes, STRIPE, pairs, 2).permute(0, 2, 1, 3).contiguous()
    return Packed(data, n, k)


def unpack(packed: Packed) -> torch.Tensor:
    """The weight [N, K] back from its stripes (a copy)."""
    stripes, pairs = packed.data.shape[:2]
    full = packed.data.permute(0, 2, 1, 3).reshape(stripes * STRIPE, pairs * 2)
    return full[: packed.out_features, : packed.in_features].contiguous()


def rowgemm(x: torch.Tensor, weight: Packed, bias: torch.Tensor | None = None, *,
            isa_cap: int = AVX512_BF16) -> torch.Tensor:
    """`F.linear(x, W, bias)` in bf16 on CPU for W packed by `pack`, every row computed alone.

    x: [..., K] bf16; bias: [N] bf16 or None; returns [..., N]."""
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
    out = x.float() @ weight.float().T
    if bias is not None:
        out = out + bias.float()
    return out.to(torch.bfloat16)
