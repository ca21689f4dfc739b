"""Row-exact attention: each row attends to its own list of keys, in an order that
depends on those keys alone (the CUDA backend's verify passes and decode steps,
cuda/forward.py).

A row's keys are its *logical key sequence*: the first `context[r]` positions of its
slot (contiguous), then the positions `path[r, :path_len[r]]` (tree ancestors that are
not contiguous in the slot, ending with the row itself). The sequence is cut into blocks
of `KEY_BLOCK` logical keys. The Triton version runs in two kernels: the first computes
each block's softmax partial in float32 (max score, sum of weights, weighted values) in
its own program, many blocks of a row at once (a one-row decode step over 2,000 keys is
16 programs, not one program walking 16 blocks in turn); the second combines a row's
partials in block order. So a verify row and the decode step it stands for, which see
the same keys in the same logical order (wherever they sit in the slot), get the same
bits, whatever else the pass holds: the number of rows, the batch and the tree never
enter a row's arithmetic. A row with no keys (context 0, path 0: padding) writes zeros at
almost no cost.

The Triton version (forward/cuda/_attention.py) shares the pass's (row, key block, KV
head) items among a wave of programs (two per SM, 4 warps each), then combines. A `grid`
schedule (a program per row, KV head and block-axis program: mostly programs that find a
padding row and exit) and a `fold` (the combine in the same launch: other bits) lost to
it on the H100 and H200; so did 64-key blocks, rows in groups, and a `walk` of a row's
blocks in one program.

>>> keys = torch.randn(1, 1, 6, 4); values = torch.randn(1, 1, 6, 4); q = torch.randn(2, 1, 4)
>>> rows = dict(slots=torch.tensor([0, 0]), context=torch.tensor([3, 2]),
...             path=torch.tensor([[0, 0], [4, 5]]), path_len=torch.tensor([0, 2]))
>>> out = row_attention(q, keys, values, **rows, scale=0.5)   # row 1 sees positions 0, 1, 4, 5
>>> out.shape
torch.Size([2, 1, 4])
"""

from __future__ import annotations

import torch

from codespec.kernels import check, use_triton

KEY_BLOCK = 128  # logical keys per block: part of every row's summation order
# The wave and its warps (the combine's warps too: they lay out its reduction, so they
# are in the bits, the same for every row of a build). On the H100 (CUDA graphs) 4 warps
# two programs an SM beat 8 warps one in every layout timed: a step 9.1 against 9.6 us
# at 512 keys and 9.6 against 10.1 at 2,048, 32-row passes 13.8 against 15.5 and 26.1
# against 33.2, 64 rows 17.7 against 21.3.
PROGRAMS_PER_SM = 2
WORK_WARPS = 4


def row_attention(
    query: torch.Tensor,  # [rows, heads, dim]
    keys: torch.Tensor,  # [slots, kv_heads, positions, dim] (one layer of the SlotCache)
    values: torch.Tensor,  # [slots, kv_heads, positions, dim]
    *,
    slots: torch.Tensor,  # [rows] int, each row's slot
    context: torch.Tensor,  # [rows] int, contiguous keys from position 0
    path: torch.Tensor,  # [rows, max_path] int, positions after the context, in order
    path_len: torch.Tensor,  # [rows] int
    scale: float,
    out: torch.Tensor | None = None,  # [rows, heads, dim], written in place when given
    force_triton: bool | None = None,
    pdl: bool = False,  # launched as programmatic dependents on CUDA (forward/cuda/_pdl.py)
) -> torch.Tensor:
    """Returns [rows, heads, dim] in the query's dtype (module docstring)."""
    rows, heads, dim = query.shape
    check(keys.dim() == 4 and keys.shape == values.shape and keys.stride() == values.stride(),
          "keys and values must be [slots, kv_heads, positions, dim] tensors of one layout")
    check(keys.shape[3] == dim and heads % keys.shape[1] == 0, "query heads must be a multiple of kv_heads, same dim")
    check(query.stride(2) == 1 and keys.stride(3) == 1, "the last dimension must be contiguous")
    check(path.dim() == 2 and path.shape[0] == rows and path.is_contiguous(), "path must be contiguous [rows, max_path]")
    for t in (slots, context, path_len):
        check(t.shape == (rows,) and t.device == query.device, "slots, context, path_len must be [rows] on the device")
    if out is None:
        out = torch.empty_like(query)
    check(out.shape == query.shape and out.stride(2) == 1, "out must be [rows, heads, dim]")
    if use_triton(query, force_triton):
        from codespec.forward.cuda import _attention

        _attention.row_attention(query, keys, values, slots, context, path, path_len, scale, out, KEY_BLOCK,
                                        wave(query.device), WORK_WARPS, pdl and query.is_cuda)
    else:
        out.copy_(row_attention_ref(query, keys, values, slots, context, path, path_len, scale))
    return out


def wave(device: torch.device) -> int:
    """The worklist's programs: PROGRAMS_PER_SM on every SM of a CUDA device (8 on the
    interpreter, whose programs run one after another)."""
    if device.type != "cuda":
        return 8
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def logical_positions(context: int, path: list[int]) -> list[int]:
    """A row's key positions in its slot, in the order it reduces over them."""
    return list(range(context)) + path


def row_attention_ref(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                      context: torch.Tensor, path: torch.Tensor, path_len: torch.Tensor, scale: float) -> torch.Tensor:
    """Each row alone over its gathered keys (float32, or float64 for float64 inputs).
    Row-exact too: a row's computation has the shapes of its own key count alone."""
    rows, heads, dim = query.shape
    group = heads // keys.shape[1]
    work = torch.float64 if query.dtype == torch.float64 else torch.float32
    out = torch.zeros(rows, heads, dim, dtype=query.dtype, device=query.device)
    for r, (slot, n, tail, m) in enumerate(zip(slots.tolist(), context.tolist(), path.tolist(), path_len.tolist())):
        positions = logical_positions(n, tail[:m])
        if not positions:
            continue  # padding: zeros
        index = torch.tensor(positions, device=query.device)
        k = keys[slot].index_select(1, index).to(work).repeat_interleave(group, dim=0)  # [heads, keys, dim]
        v = values[slot].index_select(1, index).to(work).repeat_interleave(group, dim=0)
        q = query[r].to(work).unsqueeze(1)  # [heads, 1, dim]
        weights = torch.softmax((q @ k.transpose(1, 2)) * scale, dim=-1)  # [heads, 1, keys]
        out[r] = (weights @ v).squeeze(1).to(query.dtype)
    return out
