"""Row-exact attention: each row attends to its own list of keys, in an order that
depends on those keys alone (the CUDA backend's verify passes and decode steps,
forward/cuda.py).

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

Three launch schedules (`schedule`, CODESPEC_CUDA_ATTENTION); all three run the same
code for every block, and the first two then launch the same combine (the same bits):
* `worklist` (the default): a wave of programs (two per SM, 4 warps each) shares the
  pass's (row, key block, KV head) items. A one-row decode step over 512 keys is 8 items;
* `grid`: one program per (row, KV head, program of the block axis): a bucket of 64 rows
  and a slot of 2,048+ positions is 2,048 programs whatever the pass holds (at 4 warps
  and ~120-150 registers a thread, three fit an SM: ~5 waves for a step, of programs
  that mostly find a padding row and exit);
* `fold` (opt-in, the five-launch layers' attention): the worklist's launch, and the
  program that stores a (row, KV head)'s last block combines its query heads, all at once
  (an atomic count per pair, as row_linear's fold: one launch a layer, not two). Its
  combine's layout is another, so are its bits; a row's are still its keys' alone.
  A `single` schedule folded the combine one head at a time (seven chains of dependent
  loads in one program) and took 2-7x the two launches on the H100.

`early` (CODESPEC_CUDA_EARLY_KEYS; worklist and fold): a program begins its
first item before it waits for the kernel before (q/k/v, whose epilogue stores this
pass's K and V): the pass's metadata and path, then the keys and values of the item's
block that lie in the row's context below `context - rows`, which no kernel of this
replay writes (forward/passlayout.py). After the wait it loads the query and the block's
other keys, the same values into the same arithmetic: the same bits. An H200 trace
of the fold's step at 512 keys: the program that ended last took 8.2 us after its wait,
a chain of ~6 dependent round trips (the pass's blocks, the row's metadata, the path,
keys and values, the count, the partials); the early loads take three of them off it.

`item_rows` (CODESPEC_CUDA_ATTENTION_ROWS; worklist and fold, not with
`early`): the pass's rows in groups of that many consecutive ones; a group's shared
blocks, the leading key blocks that lie wholly in the context of each of its rows with
keys, all of one slot, are one item each: the block's keys and values loaded once, then
each row's partial from them in turn, through the same arithmetic (the same positions,
so the same values: the same bits as one row an item). Each row's other blocks are
items of their own. A verify pass's rows of one request share their context, so a
32-row pass at 512 keys reads each context block once a group, not once a row
(the 2026-11-28 H200 trace: attention 14.4 us a layer in the pass against 8.9 in a step, its 320
items two rounds of the 264-program wave; in groups of four, 64 shared items and 64
own). Compiled for sm_90 (Triton 3.6): the worklist ~170 registers, the fold ~255 at
128-key blocks, no spills in pairs (8 bytes of stack in fours); the fold at 64-key
blocks spills 100 bytes and more (refused).

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
from codespec.kernels.flags import TakeFlag
from codespec.kernels.trace import TakeTrace

KEY_BLOCK = 128  # logical keys per block: part of every row's summation order
BLOCK_PROGRAMS = 16  # programs per (row, KV head) along the block axis: rows of up to 16 blocks
# run all their blocks at once; more programs would be idle ones for most rows (the grid is
# fixed for a CUDA graph, sized by the slot's length). A launch detail: not in the bits.
SCHEDULES = ("worklist", "grid", "fold")
ITEM_ROWS = (1, 2, 4)  # rows a group of items may hold (item_rows)
# A `walk` schedule (one program walking up to 8 key blocks of a row in order, online
# softmax, pipelined, no combine for a row of up to 1,024 keys) lost on the H200
# (2026-11-28): 14.4 us a layer against the fold's 8.9 in the five-launch step: a chain of blocks
# in one program is slower than the blocks in parallel and a combine. Removed.
# The fold's partials combined per step: a row of up to FOLD_KEYS keys in one step, its
# maxima, sums and values in one round trip (8 blocks of 128 keys, a [7 -> 16, 8, 64]
# float32 tile; 16 blocks of 64: 254 registers a thread on sm_90 under Triton
# 3.6, no spills). Part of a row's bits where it has more blocks than a step.
FOLD_KEYS = 1024


def fold_chunk(key_block: int) -> int:
    return max(1, FOLD_KEYS // key_block)
# The worklist's wave and warps (the combine's warps too: they lay out its reduction, so
# they are in the bits, the same for every row of a build). Compiled for sm_90 as a
# launch specializes it, the kernel takes ~145 registers a thread at 4 or 8 warps and
# spills at neither. On the H100 (scripts/gpu_step.py's attention probe, CUDA
# graphs) 4 warps two programs an SM beat 8 warps one in every layout timed: a step 9.1
# against 9.6 us at 512 keys and 9.6 against 10.1 at 2,048, 32-row passes 13.8 against
# 15.5 and 26.1 against 33.2, 64 rows 17.7 against 21.3; 8 warps two programs an SM was
# slower than both. The `single` schedule (the combine in the same launch, by the
# program that finished a row's last block) ran 2-7x slower and differed from the grid's
# bits on passes of 32 and 64 rows there: removed.
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
    schedule: str = "worklist",  # worklist, grid or fold (module docstring; CODESPEC_CUDA_ATTENTION)
    key_block: int | None = None,  # logical keys per block, KEY_BLOCK where None (CODESPEC_CUDA_KEY_BLOCK)
    pdl: bool = False,  # launched as programmatic dependents on CUDA (kernels/_triton_pdl.py)
    counts: torch.Tensor | None = None,  # fold: int32 zeros, one per (row, KV head) at least, left zero
    trace: TakeTrace | None = None,  # the Triton launches' time marks (kernels/trace.py)
    flags: TakeFlag | None = None,  # wait on counts, not the launch before's end (kernels/flags.py)
    early: bool = False,  # worklist, fold: each program's first item begun before the wait (below)
    item_rows: int = 1,  # worklist, fold: consecutive rows an item carries over its key block (below)
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
        from codespec.kernels import _triton_attention

        check(schedule in SCHEDULES, f"attention schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")
        refused = grouping_refused(item_rows, schedule, key_block or KEY_BLOCK, early)
        check(refused is None, str(refused))
        check(schedule != "fold" or (counts is not None and counts.dtype == torch.int32
                                     and counts.numel() >= rows * keys.shape[1] and counts.device == query.device),
              f"the {schedule} schedule needs counts: int32 zeros, at least {rows * keys.shape[1]} (rows x KV heads)")
        _triton_attention.row_attention(query, keys, values, slots, context, path, path_len, scale, out,
                                        key_block or KEY_BLOCK, BLOCK_PROGRAMS, schedule, wave(query.device),
                                        WORK_WARPS, pdl and query.is_cuda, counts,
                                        fold_chunk(key_block or KEY_BLOCK), trace, flags,
                                        early and schedule != "grid", item_rows)
    else:
        out.copy_(row_attention_ref(query, keys, values, slots, context, path, path_len, scale))
    return out


def grouping_refused(item_rows: int, schedule: str, key_block: int, early: bool) -> str | None:
    """Why rows in groups of `item_rows` cannot run with this schedule, key block and
    `early` (None: they can): the CUDA backend's start-up check and the wrapper's."""
    if item_rows not in ITEM_ROWS:
        return f"items of {item_rows} rows: one of {', '.join(map(str, ITEM_ROWS))}"
    if item_rows > 1 and (schedule == "grid" or early):
        return f"items of {item_rows} rows go with the worklist or the fold, not with early keys"
    if item_rows > 1 and schedule == "fold" and key_block != 128:
        return "items of several rows fold 128-key blocks alone (at 64 the fold's combine beside them spills on sm_90)"
    return None


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
