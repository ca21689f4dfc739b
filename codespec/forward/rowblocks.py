"""Row-blocked linear layers: a verify pass of any size multiplies like a decode step.

Lossless speculation in bf16 needs every row of a verify pass to get exactly the
logits of the decode step it stands for (attention.py). The linear layers give that
only within one kernel regime: measured on the default model (CPU, torch 2.13, bf16),
`F.linear` returns identical rows for every row count from 2 to 32, and other ones
(still identical among themselves) from 33 rows on, where oneDNN switches kernels.
A decode step is padded to two rows, so a verify pass of 33 rows or more (a 32-token
draft plus its pending token, or eight requests' trees) drifted by up to 0.19 in a
logit: enough to flip a near-tie, and it did, on the benchmark's repository workload.

So during verify passes every linear layer multiplies at most `block` rows at a time,
in balanced blocks (never a lone row: one row takes bf16's GEMV kernel, another order
of summation). `probe` finds `block` on the machine at hand: the most rows for which
each of the model's weight shapes still gives the two-row result (capped at
`MAX_BLOCK`; a shape that never breaks is not the limit), checking every row of every
call size against a decode step's; where even three rows break it, every row is
multiplied alone (`ROW_BY_ROW`: exact, slow). Prefill chunks do not need
it: they only have to agree with each other, and they run on one absolute grid.

Cost: a block re-reads the weights, so a 33-row pass costs about what two 17-row
passes cost in its linear layers; the controller's cost model carries that step.

Which product (`linear_kernel`), on a CPU in bfloat16:
* "rowgemm" where the CPU has AVX-512 BF16, or AVX2 with FMA, and a C compiler is
  present (kernels/rowgemm.py): our own kernel, every output one dot product in a fixed
  order, so rows are exact by construction and `probe` has nothing to find (it returns
  the limit). It also runs prefill (faster there than `F.linear` at 256 rows). Measured
  on the 2-core EPYC VM over 1 GB of the model's layer shapes (what a pass reads): 29 ms
  at one row (oneDNN packed: 64 ms at two), 84 ms at 16 rows (96), 200 ms at 64 (232).
  On an AVX2-only EPYC VM (4864x896, 2 threads): 0.18 ms at one row where torch's bf16
  `F.linear` takes 0.85 (two rows), 2.9 ms at 32 rows (13.8), 19 ms at 256 (95; fp32 23).
* else "onednn-packed": weights packed once into oneDNN's blocked layout
  (`_reorder_linear_weight`) and multiplied with `_linear_pointwise` (every linear
  layer 95 -> 73 ms at two rows, 158 -> 84 ms at 16 on the same VM, against `F.linear`),
  checked by `probe` like any other path.
Either packed copy replaces the original weight (`install`). `CODESPEC_LINEAR=onednn`
or `=torch` picks a fallback (the machine profile keys on the choice).
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections import Counter
from typing import Any, Iterator

import torch
import torch.nn.functional as F


MAX_BLOCK = 64  # probed up to here: beyond it a pass is blocked anyway
MIN_BLOCK = 3  # the smallest block that splits every pass without a lone row
ROW_BY_ROW = 1  # the fail-safe block: each row alone, as the top row of a two-row call
_active: list[int] = []  # the block size while a verify pass runs (a stack: re-entrant)
_prefilling: list[bool] = []  # inside `prefill_products` (a stack: re-entrant)
# from here on a prefill product in float32 (cast included) beats bf16 on an AVX2 CPU: 896 x 4864, 2 threads,
# AMD EPYC VM: 8 rows 2.8 vs 2.9 ms, 12 rows 4.3 vs 3.4, 24 rows 7.3 vs 4.3, 32 rows 9.9 vs 4.5 (the last
# chunk's sub-chunks, kvcache.spans, end in passes of 1-31 rows)
UPCAST_ROWS = 12


@contextlib.contextmanager
def blocked(block: int) -> Iterator[None]:
    """Within this context, installed linear layers multiply at most `block` rows at once."""
    _active.append(block)
    try:
        yield
    finally:
        _active.pop()


@contextlib.contextmanager
def prefill_products() -> Iterator[None]:
    """Within this context (prefill passes: transformers.py) `F.linear` products of
    UPCAST_ROWS rows or more run in float32 on CPUs without AVX-512, where bf16 has no fast
    GEMM: measured on an AVX2 EPYC VM (896 x 4864, 2 threads), 256 rows took 130 ms in bf16
    and 58 ms cast to float32, 32 rows 24 and 11 ms; below ~12 rows bf16 wins (see
    UPCAST_ROWS). Prefill needs only to be deterministic per pass (kvcache.spans), and it
    is: the choice depends on the machine and the pass's row count alone. Decode steps and verify
    passes never come here, so their rows stay the bf16 products they always were."""
    _prefilling.append(True)
    try:
        yield
    finally:
        _prefilling.pop()


@functools.cache
def _bf16_without_gemm() -> bool:
    """Whether this CPU lacks AVX-512 (torch's own capability: "AVX2" or "DEFAULT")."""
    return str(torch.backends.cpu.get_cpu_capability()) in ("DEFAULT", "AVX2")


def sizes(rows: int, block: int) -> list[int]:
    """Balanced block sizes covering `rows`, none above `block`, none a lone row.

    >>> sizes(33, 32), sizes(64, 32), sizes(20, 32), sizes(65, 32), sizes(7, 3)
    ([17, 16], [32, 32], [20], [22, 22, 21], [3, 2, 2])
    """
    count = math.ceil(rows / block)
    base, extra = divmod(rows, count)
    return [base + 1] * extra + [base] * (count - extra)




def linear_kernel(dtype: torch.dtype, device: torch.device | str) -> str:
    """Which product the linear layers use in decode steps and verify passes:
    "rowgemm" (CPU, bfloat16, AVX-512 BF16 or AVX2 with FMA, and a C compiler:
    kernels/rowgemm.py, exact by construction), else "onednn-packed" (CPU, bfloat16, oneDNN present), else
    "torch" (`F.linear`). `CODESPEC_LINEAR=onednn` or `=torch` picks a fallback."""
    from codespec.settings import current

    wanted = current().linear
    if torch.device(device).type != "cpu" or dtype != torch.bfloat16 or wanted == "torch":
        return "torch"
    if wanted in ("", "rowgemm"):
        from codespec.kernels import rowgemm

        if rowgemm.isa() in (rowgemm.AMX, rowgemm.AVX512_BF16, rowgemm.AVX2):
            return "rowgemm"
    return "onednn-packed" if _onednn_packs_bf16() else "torch"


@functools.cache
def _onednn_packs_bf16() -> bool:
    """Whether oneDNN packs bf16 weights on this CPU: its bf16 reorder needs AVX-512
    (bw, vl, dq) or AVX-NE-CONVERT, and on an AVX2-only CPU it raises at the first
    model load (it did: `model prepare` crashed on an AVX2 EPYC VM). Tried once on a
    tiny weight."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), PACK_ROWS_HINT)
    except RuntimeError:
        return False
    return True


def _linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    striped = module.__dict__.get("_codespec_rowgemm")
    if striped is not None:
        from codespec.kernels.rowgemm import rowgemm

        return rowgemm(x, striped, module.bias)
    packed = module.__dict__.get("_codespec_packed")
    if packed is None:
        weight = module.weight
        if (_prefilling and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
                and x.shape[-2] >= UPCAST_ROWS and _bf16_without_gemm()):
            bias = None if module.bias is None else module.bias.float()
            return F.linear(x.float(), weight.float(), bias).to(weight.dtype)
        return F.linear(x, weight, module.bias)
    flat = x.reshape(-1, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, module.bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])


def _blocked_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if not _active or x.dim() < 2 or "_codespec_rowgemm" in module.__dict__:  # rowgemm: every row alone
        return _linear(module, x)
    block = _active[-1]
    if block == ROW_BY_ROW:  # each row as the top of a two-row call (a decode step)
        pairs = [torch.cat([row, row], dim=-2) for row in x.split(1, dim=-2)]
        return torch.cat([_linear(module, p).narrow(-2, 0, 1) for p in pairs], dim=-2)
    if x.shape[-2] <= block:
        return _linear(module, x)
    parts = x.split(sizes(x.shape[-2], block), dim=-2)
    return torch.cat([_linear(module, part) for part in parts], dim=-2)


PACK_ROWS_HINT = 16  # oneDNN's batch hint for the packed layout (results do not depend on it)


def install(model: Any) -> None:
    """Route every nn.Linear of `model` through the row blocking (a no-op outside
    `blocked`), packing its weight for rowgemm or oneDNN where `linear_kernel` says so.

    A packed weight replaces its original, so memory stays what the model's weights
    take: the parameter becomes a meta tensor of the same shape. Nothing of codespec
    multiplies by it, and anything that tried would fail loudly, not compute with
    stale values. A weight that shares its storage with another parameter (tied
    embeddings) is kept."""
    storages = Counter(p.data_ptr() for _, p in model.named_parameters(remove_duplicate=False))
    shared = {ptr for ptr, uses in storages.items() if uses > 1}
    todo = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and not getattr(m, "_codespec_blocked", False)]
    kernel_of = functools.cache(linear_kernel)  # one choice per dtype and device: the settings are read once
    kernels = [kernel_of(m.weight.dtype, m.weight.device) for m in todo]
    striped = [m for m, kernel in zip(todo, kernels) if kernel == "rowgemm"]
    if striped:
        # one buffer for every stripe matrix, in module order: q, k and v (gate and up)
        # end up adjacent, so decoder.py fuses them without a copy
        from codespec.kernels import rowgemm

        sizes = [rowgemm.packed_elements(tuple(m.weight.shape)) for m in striped]
        buffer = torch.empty(sum(sizes), dtype=torch.bfloat16)
        with torch.no_grad():
            for module, part in zip(striped, buffer.split(sizes)):
                module._codespec_rowgemm = rowgemm.pack(module.weight, out=part)
        model.__dict__["_codespec_arena"] = buffer
    freed = False
    for module, kernel in zip(todo, kernels):
        weight = module.weight
        if kernel == "onednn-packed":
            with torch.no_grad():
                module._codespec_packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS_HINT)
        if kernel != "torch" and weight.data_ptr() not in shared:
            module.weight = torch.nn.Parameter(torch.empty_like(weight, device="meta"), requires_grad=False)
            freed = True
        module.forward = _blocked_linear.__get__(module)  # type: ignore[method-assign]
        module._codespec_blocked = True
    if freed:  # once per model: a later install finds every layer done
        # transformers maps the safetensors file and the parameters are views into it:
        # while one of them lives the whole mapping stays resident (1 GB here). Copy the
        # few that remain (embeddings, norms, biases) so the mapping can go.
        with torch.no_grad():
            for p in model.parameters():
                if not p.is_meta and p.data_ptr() not in shared:
                    p.data = p.data.clone()


@torch.inference_mode()
def probe(model: Any, limit: int = MAX_BLOCK) -> int:
    """The most rows (2..limit) for which every linear weight shape of `model` gives every
    row, at every position of the call, the bits it gets at the top of a two-row call (a
    decode step); `limit` when none breaks. Every row is checked, not only the first:
    a kernel may treat a call's tail rows with another microkernel."""
    param = next(model.parameters())
    linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
    if linears and all("_codespec_rowgemm" in module.__dict__ for module in linears):
        return limit  # rowgemm computes every row alone (tests/test_rowgemm.py pins it)
    shapes: dict[tuple[int, int], torch.nn.Linear] = {}
    for module in linears:
        shapes.setdefault(tuple(module.weight.shape), module)
    generator = torch.Generator(device="cpu").manual_seed(0)
    block = limit
    for module in shapes.values():
        x = torch.randn(limit + 1, module.in_features, generator=generator).to(param.device, param.dtype)
        reference = torch.cat([_linear(module, x[i : i + 2])[:1] for i in range(block)])
        for rows in range(3, block + 1):
            if not torch.equal(_linear(module, x[:rows]), reference[:rows]):
                block = rows - 1
                break
    if block < MIN_BLOCK:
        # Blocks of two rows cannot split an odd pass without a lone row (another kernel).
        # Fail safe: every row of a verify pass is multiplied alone, as the top row of a
        # two-row call, which is a decode step's computation: exact, but each row then
        # re-reads the weights, so speculation rarely pays. Say so; never hide it.
        warnings.warn(
            f"the linear layers of this model ({param.dtype}, {param.device}) change results past "
            f"{block} rows: verify passes multiply row by row to stay exact (slow); --dtype float32 "
            "may be faster", RuntimeWarning, stacklevel=2)
        return ROW_BY_ROW
    return block
