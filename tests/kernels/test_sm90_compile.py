"""The Triton kernels the cuda backend runs, compiled offline to H100 (sm_90) machine
code: triton's own ptxas needs no GPU. What the interpreter cannot show: the inline PTX
is valid, the atomics and barriers lower as meant, a product's warming of its own
weights is not dropped as dead code, and no kernel spills at the warps it launches with. Each is compiled as a launch
on the GPU specializes it (pointers 16-byte aligned, integers multiples of 16): without
that, loads neither vectorize nor pipeline, and registers and spills are not the GPU's
(sessions 26-27 read 255 registers and spills off such builds). In a process of its
own: the interpreter (tests/kernels/conftest.py) replaces triton.jit here."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")

COMPILE = r"""
import json, os, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from codespec.kernels import _triton, _triton_attention, _triton_linear, _triton_linear_finish
from codespec.kernels.row_attention import WORK_WARPS
from codespec.kernels._triton_pdl import launch_options

tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


shard, shards = map(int, os.environ.get("SM90_SHARD", "0/1").split("/"))
built = [0]  # build's calls so far: each process of the fixture compiles every shards-th


def build(fn, signature, constants, warps=4, fp_fusion=True, stages=None):
    built[0] += 1
    if (built[0] - 1) % shards != shard:
        return None  # another process's
    options = {"num_warps": warps, **launch_options(constants.get("PDL", False), fp_fusion)}  # as the wrappers launch
    if stages is not None:  # where the launch names its pipeline's depth
        options["num_stages"] = stages
    # What a launch on the GPU specializes: every pointer 16-byte aligned (torch's
    # allocations) and every integer a multiple of 16 (the default model's strides and
    # sizes): the loads vectorize and pipeline only with it.
    aligned = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name, kind in signature.items()
               if kind.startswith("*") or kind in ("i32", "i64")}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=aligned),
                              target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", cubin.name],
                               capture_output=True, text=True).stdout
    def most(field):
        return max((int(part.split(":")[1]) for line in usage.splitlines() for part in line.split()
                    if part.startswith(field + ":")), default=-1)

    return {"ptx": compiled.asm["ptx"], "stack": most("STACK"), "registers": most("REG")}


out = {}
pointers = [("q_ptr", "*bf16"), ("k_ptr", "*bf16"), ("v_ptr", "*bf16"), ("part_ptr", "*fp32")]
meta = [("slots_ptr", "*i64"), ("context_ptr", "*i64"), ("path_ptr", "*i64"), ("path_len_ptr", "*i64"),
        ("scale", "fp32")]
strides = [(name, "i32") for name in ("s_q_row", "s_q_head", "s_kv_slot", "s_kv_head", "s_kv_pos", "s_path",
                                       "s_part_row", "s_part_head", "s_part_block")]
shapes = dict(GROUP=7, GROUP_PAD=16, DIM=64, KEY_BLOCK=128, PRECISION="tf32", ROWS=1)
trace = [("trace_ptr", "*i64"), ("clock_ptr", "*i64")]  # kernels/_triton_trace.py's marks (CLOCK 0: none)
flags = [("flags_ptr", "*i32"), ("launch", "i32"), ("before", "i32")]  # kernels/flags.py's counts (FLAGS 0: none)
for pdl in (False, True):
    out["worklist" + " pdl" * pdl] = build(_triton_attention._row_attention_work_kernel,
                                           dict(pointers + meta + [("rows", "i32")] + strides + trace + flags),
                                           {**shapes, "KV_HEADS": 2, "ROWS_PAD": 64, "PDL": pdl, "CLOCK": 0,
                                            "FLAGS": False, "EARLY": False},
                                           warps=WORK_WARPS)
# untraced, traced by %globaltimer, waiting on counts
for clock, flagged in ((0, False), (1, False), (0, True)):
    out["fold pdl" + " traced" * clock + " flags" * flagged] = build(
        _triton_attention._row_attention_fold_kernel,
        dict(pointers[:4] + [("out_ptr", "*bf16"), ("count_ptr", "*i32")] + meta + [("rows", "i32")] + strides
             + [("s_out_row", "i32"), ("s_out_head", "i32")] + trace + flags),
        {**shapes, "KV_HEADS": 2, "ROWS_PAD": 64, "HEADS_PAD": 16, "CHUNK": 8, "PDL": True, "CLOCK": clock,
         "FLAGS": flagged, "EARLY": False},
        warps=WORK_WARPS)
# 64-key blocks (CODESPEC_CUDA_KEY_BLOCK=64, session 40): the worklist and the fold
out["worklist pdl 64"] = build(_triton_attention._row_attention_work_kernel,
                               dict(pointers + meta + [("rows", "i32")] + strides + trace + flags),
                               {**shapes, "KEY_BLOCK": 64, "KV_HEADS": 2, "ROWS_PAD": 64, "PDL": True, "CLOCK": 0,
                                "FLAGS": False, "EARLY": False},
                               warps=WORK_WARPS)
out["fold pdl 64"] = build(_triton_attention._row_attention_fold_kernel,
                           dict(pointers[:4] + [("out_ptr", "*bf16"), ("count_ptr", "*i32")] + meta + [("rows", "i32")]
                                + strides + [("s_out_row", "i32"), ("s_out_head", "i32")] + trace + flags),
                           {**shapes, "KEY_BLOCK": 64, "KV_HEADS": 2, "ROWS_PAD": 64, "HEADS_PAD": 16, "CHUNK": 16,
                            "PDL": True, "CLOCK": 0, "FLAGS": False, "EARLY": False},
                           warps=WORK_WARPS)
# the first item begun before the wait (CODESPEC_CUDA_EARLY_KEYS, session 41): the worklist
# and the fold, at either key block
for block, chunk in ((128, 8), (64, 16)):
    out[f"worklist pdl early {block}"] = build(_triton_attention._row_attention_work_kernel,
                                               dict(pointers + meta + [("rows", "i32")] + strides + trace + flags),
                                               {**shapes, "KEY_BLOCK": block, "KV_HEADS": 2, "ROWS_PAD": 64,
                                                "PDL": True, "CLOCK": 0, "FLAGS": False, "EARLY": True},
                                               warps=WORK_WARPS)
    out[f"fold pdl early {block}"] = build(_triton_attention._row_attention_fold_kernel,
                                           dict(pointers[:4] + [("out_ptr", "*bf16"), ("count_ptr", "*i32")] + meta
                                                + [("rows", "i32")] + strides + [("s_out_row", "i32"),
                                                                                 ("s_out_head", "i32")] + trace + flags),
                                           {**shapes, "KEY_BLOCK": block, "KV_HEADS": 2, "ROWS_PAD": 64,
                                            "HEADS_PAD": 16, "CHUNK": chunk, "PDL": True, "CLOCK": 0, "FLAGS": False,
                                            "EARLY": True},
                                           warps=WORK_WARPS)
# rows in groups (CODESPEC_CUDA_ATTENTION_ROWS, session 42): the worklist at either key block,
# the fold at 128 (at 64 its combine spills beside them: refused)
for rows_an_item in (2, 4):
    for block in (128, 64):
        out[f"worklist pdl rows {rows_an_item} {block}"] = build(
            _triton_attention._row_attention_work_kernel,
            dict(pointers + meta + [("rows", "i32")] + strides + trace + flags),
            {**shapes, "KEY_BLOCK": block, "KV_HEADS": 2, "ROWS_PAD": 64, "PDL": True, "CLOCK": 0, "FLAGS": False,
             "EARLY": False, "ROWS": rows_an_item}, warps=WORK_WARPS)
    out[f"fold pdl rows {rows_an_item} 128"] = build(
        _triton_attention._row_attention_fold_kernel,
        dict(pointers[:4] + [("out_ptr", "*bf16"), ("count_ptr", "*i32")] + meta + [("rows", "i32")] + strides
             + [("s_out_row", "i32"), ("s_out_head", "i32")] + trace + flags),
        {**shapes, "KV_HEADS": 2, "ROWS_PAD": 64, "HEADS_PAD": 16, "CHUNK": 8, "PDL": True, "CLOCK": 0,
         "FLAGS": False, "EARLY": False, "ROWS": rows_an_item}, warps=WORK_WARPS)
out["rope_store pdl"] = build(_triton._rope_store_kernel,
                              {**{name: "*bf16" for name in ("qkv_ptr", "cos_ptr", "sin_ptr")},
                               **{name: "*i64" for name in ("positions_ptr", "source_ptr", "write_slot_ptr",
                                                            "write_position_ptr")},
                               **{name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr")},
                               "context_ptr": "*i64", "path_len_ptr": "*i64",
                               **{name: "i32" for name in ("s_qkv", "s_rope", "s_q_row", "s_q_head", "s_kv_slot",
                                                           "s_kv_head", "s_kv_pos")}},
                              {"HEADS": 14, "KV_HEADS": 2, "DIM": 64, "TABLES": True, "LIVE": True, "PDL": True},
                              warps=1,
                              fp_fusion=_triton.ROPE_FP_FUSION)
# the default model's gate/up with its norm, as the fused layers launch it (FUSED_TILES)
linear = {**{name: "*bf16" for name in ("x_ptr", "w_ptr", "bias_ptr", "norm_ptr", "residual_ptr", "out_ptr")},
          "part_ptr": "*fp32", "context_ptr": "*i64", "path_len_ptr": "*i64", "count_ptr": "*i32",
          "sq_in_ptr": "*fp32", "block_out_ptr": "*fp32", "index_out_ptr": "*i32", "cos_ptr": "*bf16",
          "sin_ptr": "*bf16",
          **{name: "*i64" for name in ("positions_ptr", "wslot_ptr", "wpos_ptr")}, "k_ptr": "*bf16", "v_ptr": "*bf16",
          **dict(trace), "flags_ptr": "*i32", "hi_ptr": "*fp32", "best_ptr": "*fp32", "launch": "i32",
          "before": "i32", "k_size": "i32", "eps": "fp32",
          **{name: "i32" for name in ("s_x", "s_w", "s_residual", "s_out", "s_part_split", "s_part", "s_sq_in",
                                      "s_block_out", "s_rope", "s_kv_slot", "s_kv_head", "s_kv_pos", "s_hi")}}
plain = {"SQUARES_IN": 0, "SQUARES_PAD": 1, "SQUARES_OUT": False, "CHOICES": False, "PAIRS": False, "ROPE": False,
         "HEADS": 1, "KV_HEADS": 1, "DIM": 2, "SCREENED": False}
for pdl in ("off", "launch", "prefetch"):
    out["linear " + pdl] = build(_triton_linear._row_linear_kernel, linear,
                                 {"STEPS_PER_SPLIT": 7, "SPLITS": 1, "HAS_BIAS": False, "NORM": True, **plain,
                                  "RESIDUAL": False, "LIVE": pdl != "off", "PDL": pdl != "off",
                                  "PREFETCH": pdl == "prefetch", "SECTOR": 16, "SECTORS": 64, "WARM_ROWS": 8, "FOLD": False,
                                  "BLOCK_M": 64,
                                  "BLOCK_N": 128, "BLOCK_K": 128, "UPCAST": False, "CLOCK": 0,
                                  "ROW_GROUP": 1, "FLAGS": False, "EARLY_ROWS": False},
                                 warps=8)
# the fused layers' products in 16-row programs (CODESPEC_CUDA_TILE_ROWS=16), warming: q/k/v
# with its norm walked (the first layer) or from the sums of squares o and down leave
# (`squares`: 896 / 16 of o's, 896 / 32 of down's), o and down leaving them, gate/up's
# SiLU pairs
rope = dict(ROPE=True, HEADS=14, KV_HEADS=2, DIM=64)  # rotary and the KV store in q/k/v's epilogue
m16 = {"qkv walk": (64, 64, 2, dict(NORM=True, **rope)),
       "qkv": (64, 64, 2, dict(NORM=True, SQUARES_IN=28, SQUARES_PAD=32, **rope)),
       "o": (16, 128, 7, dict(RESIDUAL=True, SQUARES_OUT=True)),
       "gate_up": (128, 128, 7, dict(NORM=True, SQUARES_IN=56, SQUARES_PAD=64, PAIRS=True)),
       "gate_up walk": (128, 128, 7, dict(NORM=True, PAIRS=True)),
       "down": (32, 64, 10, dict(RESIDUAL=True, SQUARES_OUT=True)),
       "lm_head": (128, 64, 14, dict(NORM=True, SQUARES_IN=28, SQUARES_PAD=32, CHOICES=True))}
# ... and traced, in groups of four blocks of rows, waiting on counts, q/k/v folded
variants = [("down traced", m16["down"]), ("down group", m16["down"]), ("gate_up group", m16["gate_up"]),
            ("qkv group", m16["qkv"]), ("down flags", m16["down"]), ("qkv fold", m16["qkv"])]
for name, (n_tile, k_tile, steps, fusion) in [*m16.items(), *variants]:
    sectors = triton.next_power_of_2(steps * k_tile // 16)
    out["linear m16 " + name] = build(_triton_linear._row_linear_kernel, linear,
                                      {"STEPS_PER_SPLIT": steps,
                                       "SPLITS": 1 if name.split()[0] in ("o", "gate_up", "lm_head") else 8,
                                       "HAS_BIAS": name.startswith("qkv"), "NORM": False, "RESIDUAL": False,
                                       **plain, **fusion, "LIVE": True, "PDL": True, "PREFETCH": True, "SECTOR": 16,
                                       "SECTORS": sectors, "WARM_ROWS": min(n_tile, 512 // sectors),
                                       "FOLD": name.startswith("down") or name.endswith("fold"), "BLOCK_M": 16,
                                       "BLOCK_N": n_tile,
                                       "BLOCK_K": k_tile, "UPCAST": False, "CLOCK": int(name.endswith("traced")),
                                       "ROW_GROUP": 4 if name.endswith("group") else 1,
                                       "FLAGS": name.endswith("flags"), "EARLY_ROWS": False},
                                      fp_fusion="ROPE" not in fusion,
                                      warps=8 if name == "gate_up group" else 4)  # as FUSED_TILES launch it
# the five-launch layers' products as they launch (FUSED_TILES at 16 rows, folded, PDL
# warming), and the step stage's other gate/up tiles (scripts/gpu_step.py)
from codespec.forward.cuda_fused import FUSED_TILES
sys.path.insert(0, os.environ["CODESPEC_SCRIPTS"])
import gpu_step

squares = {"qkv": 896 // FUSED_TILES["down"].block_n, "gate_up": 896 // FUSED_TILES["o"].block_n,
           "lm_head": 896 // FUSED_TILES["down"].block_n}
shapes_nk = {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864), "lm_head": (151936, 896)}
fusions = {"qkv": dict(NORM=True, HAS_BIAS=True, **rope), "o": dict(RESIDUAL=True, SQUARES_OUT=True),
           "gate_up": dict(NORM=True, PAIRS=True), "down": dict(RESIDUAL=True, SQUARES_OUT=True),
           "lm_head": dict(NORM=True, CHOICES=True)}
launched = {f"five {name}": (name, tile) for name, tile in FUSED_TILES.items()}
launched.update({f"five {label}": ("gate_up", tile) for label, tile in gpu_step.FIVE_GATE_UP_TILES.items()})
launched.update({f"five {label}": ("down", tile) for label, tile in gpu_step.FIVE_DOWN_TILES.items()})
# ... and reading their live rows before the wait (CODESPEC_CUDA_EARLY_ROWS, session 41)
launched.update({f"five {name} early rows": (name, tile) for name, tile in FUSED_TILES.items()})
# ... and lm_head behind its int8 screen over the normed rows (CODESPEC_CUDA_LM_SCREEN, session 42)
from codespec.forward.cuda_fused import SCREENED_LM_HEAD
launched["five lm_head screened"] = ("lm_head", SCREENED_LM_HEAD)
for label, (name, tile) in launched.items():
    n_size, k_size = shapes_nk[name]
    block_n = max(tile.block_n, 64) if name == "qkv" else tile.block_n  # whole heads (cuda_fused.whole_heads)
    steps = k_size // tile.block_k
    per_split = -(-steps // tile.splits)
    splits = -(-steps // per_split)
    sectors = triton.next_power_of_2(-(-per_split * tile.block_k // 16))
    fusion = fusions[name]
    if label.endswith("screened"):  # no norm (head_rows wrote the rows), the screen's flags
        fusion = dict(CHOICES=True, SCREENED=True)
    elif name in squares:
        fusion = {**fusion, "SQUARES_IN": squares[name], "SQUARES_PAD": triton.next_power_of_2(squares[name])}
    out[label] = build(_triton_linear._row_linear_kernel, linear,
                       {**plain, "HAS_BIAS": False, "NORM": False, "RESIDUAL": False, **fusion,
                        "STEPS_PER_SPLIT": per_split, "SPLITS": splits, "LIVE": True, "PDL": True, "PREFETCH": True,
                        "SECTOR": 16, "SECTORS": sectors, "WARM_ROWS": min(block_n, max(1, 512 // sectors)),
                        "FOLD": splits > 1, "BLOCK_M": 16, "BLOCK_N": block_n, "BLOCK_K": tile.block_k,
                        "UPCAST": False, "CLOCK": 0, "ROW_GROUP": 1, "FLAGS": False,
                        "EARLY_ROWS": label.endswith("early rows")},
                       warps=tile.num_warps, stages=tile.num_stages, fp_fusion=name != "qkv")
out["linear reduce pdl"] = build(_triton_linear_finish._row_linear_reduce_kernel,
                                 {"part_ptr": "*fp32", "bias_ptr": "*bf16", "residual_ptr": "*bf16", "out_ptr": "*bf16",
                                  "block_out_ptr": "*fp32", "index_out_ptr": "*i32", "context_ptr": "*i64",
                                  "path_len_ptr": "*i64",
                                  "cos_ptr": "*bf16", "sin_ptr": "*bf16", "positions_ptr": "*i64", "wslot_ptr": "*i64",
                                  "wpos_ptr": "*i64", "k_ptr": "*bf16", "v_ptr": "*bf16", **dict(flags),
                                  **{name: "i32" for name in ("s_part_split", "s_part", "s_residual", "s_out",
                                                              "s_block_out", "s_rope", "s_kv_slot", "s_kv_head",
                                                              "s_kv_pos")}},
                                 {"SPLITS": 8, "HAS_BIAS": False, "RESIDUAL": True, "PAIRS": False,
                                  "SQUARES_OUT": True, "CHOICES": False, "ROPE": False, "HEADS": 1, "KV_HEADS": 1,
                                  "DIM": 2, "LIVE": True,
                                  "PDL": True, "BLOCK": 32, "FLAGS": False})
out["choices pdl"] = build(_triton_linear_finish._choices_kernel,
                           {"block_out_ptr": "*fp32", "index_out_ptr": "*i32", "choices_ptr": "*i64", **dict(flags),
                            "s_block_out": "i32"},
                           {"N": 151936, "BLOCKS": 1187, "BLOCKS_PAD": 2048, "PDL": True, "FLAGS": False})
out["embed pdl"] = build(_triton_linear._embed_squares_kernel,
                         {"ids_ptr": "*i64", "table_ptr": "*bf16", "out_ptr": "*bf16", "squares_ptr": "*fp32",
                          **dict(flags), "s_table": "i32", "s_out": "i32", "s_squares": "i32", "width": "i32"},
                         {"BLOCK": 32, "BLOCKS_PAD": 32, "PDL": True, "FLAGS": False})
# the persistent-kernel probe (scripts/gpu_persist.py): one launch with grid barriers,
# warming each next product's weights; one product a launch as a programmatic dependent
sys.path.insert(0, os.environ["CODESPEC_SCRIPTS"])
import gpu_persist

chain = {"w_ptr": "*bf16", **{name: "*fp32" for name in ("a_ptr", "b_ptr", "c_ptr")}, "sync_ptr": "*i32",
         "flag_ptr": "*i32", "first": "i32", "last": "i32"}
layer = {f"{axis}{p}": size for p, shape in enumerate(gpu_persist.LAYER) for axis, size in zip("NK", shape)}
sectors = {f"S{p}": triton.next_power_of_2(k // gpu_persist.SECTOR.value) for p, (_, k) in enumerate(gpu_persist.LAYER)}
for name, pdl, flags in (("persist prefetch", False, False), ("persist launched pdl", True, False),
                         ("persist launched flags", True, True)):
    out[name] = build(gpu_persist._chain_kernel, chain,
                      {**layer, **sectors, "BLOCK_N": 8, "BLOCK_K": 128, "BLOCK_K_LONG": 256, "WORK": True,
                       "PREFETCH": True, "PDL": pdl, "SPIN_LIMIT": gpu_persist.SPIN_LIMIT, "FLAGS": flags})
# lm_head's int8 screen (kernels/lm_screen.py, CODESPEC_CUDA_LM_SCREEN): the normed rows, and
# the screen's int8 tiles into a bf16 tensor-core product, as the fused layers launch them
from codespec.kernels import _triton_screen

head_meta = {"context_ptr": "*i64", "path_len_ptr": "*i64", "trace_ptr": "*i64", "clock_ptr": "*i64",
             "flags_ptr": "*i32", "launch": "i32", "before": "i32"}
out["lm rows pdl"] = build(_triton_screen._head_rows_kernel,
                           {"x_ptr": "*bf16", "sq_in_ptr": "*fp32", "norm_ptr": "*bf16", "normed_ptr": "*bf16",
                            "norms_ptr": "*fp32", "best_ptr": "*fp32", **head_meta, "eps": "fp32", "s_x": "i32",
                            "s_sq_in": "i32", "s_normed": "i32"},
                           {"K": 896, "K_PAD": 1024, "SQUARES_IN": 28, "SQUARES_PAD": 32, "SLACK": 1 + 2 ** -10,
                            "LIVE": True, "PDL": True, "CLOCK": 0, "FLAGS": False})
screen_sectors = triton.next_power_of_2(896 // 32)
# ... in a step's narrow graph (16 rows: one block), and in the bucket's (64 rows: a group of four)
for name, pdl, group in (("lm screen", False, 1), ("lm screen prefetch", True, 1), ("lm screen group", True, 4)):
    out[name] = build(_triton_screen._screen_kernel,
                      {"x_ptr": "*bf16", "q_ptr": "*i8", **{name: "*fp32" for name in (
                          "scale_ptr", "bound_ptr", "norms_ptr", "hi_ptr", "best_ptr")}, **head_meta,
                       "s_x": "i32", "s_q": "i32", "s_hi": "i32"},
                      {"K": 896, "BLOCK_M": 16, "BLOCK_N": 128, "FLAG_N": SCREENED_LM_HEAD.block_n, "BLOCK_K": 128,
                       "ROW_GROUP": group, "UPCAST": False, "IEEE": False,
                       "LIVE": True, "PDL": pdl, "PREFETCH": pdl, "SECTOR": 32, "SECTORS": screen_sectors,
                       "WARM_ROWS": min(128, 512 // screen_sectors), "CLOCK": 0, "FLAGS": False},
                      warps=_triton_screen.screen_warps(group), stages=_triton_screen.STAGES)
json.dump({name: kernel for name, kernel in out.items() if kernel is not None}, sys.stdout)
"""


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    # Triton 3.10's default (no fused multiply-add unless asked): the launches pin their own
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "TRITON_DEFAULT_FP_FUSION": "0",
           "CODESPEC_SCRIPTS": os.path.join(os.path.dirname(__file__), "..", "..", "scripts")}
    # Two processes, each compiling every other kernel in the script's order: on a fresh
    # machine (triton's cache empty, as in CI) the compiles take ~50 s in one process.
    shards = 2
    running = [subprocess.Popen([sys.executable, "-c", COMPILE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**env, "SM90_SHARD": f"{shard}/{shards}"})
               for shard in range(shards)]
    compiled: dict[str, dict] = {}
    try:
        for process in running:
            out, err = process.communicate(timeout=600)
            if process.returncode != 0 and "ptxas" in err and "No such file" in err:
                pytest.skip("triton's CUDA toolchain (ptxas) is not installed here")
            assert process.returncode == 0, err[-3000:]
            own = json.loads(out)
            assert not own.keys() & compiled.keys(), "two builds of one name: the later would win by chance"
            compiled.update(own)
    finally:
        for process in running:
            process.kill()  # where one failed, the other's compiles are of no use
            process.wait()
    return compiled


def test_attention_schedules_launch_without_spilling(compiled):
    assert compiled["worklist"]["stack"] == 0 and compiled["worklist pdl"]["stack"] == 0
    assert compiled["fold pdl"]["stack"] == 0
    assert compiled["worklist pdl 64"]["stack"] == 0 and compiled["fold pdl 64"]["stack"] == 0
    # rows in groups (session 42): the fold at 128-key blocks takes ~255 registers, no stack
    # in pairs (in fours 8 bytes under Triton 3.6, none under 3.9); the worklist ~170 and,
    # at 128-key blocks, a few bytes of local memory
    assert compiled["fold pdl rows 2 128"]["stack"] == 0 and compiled["fold pdl rows 4 128"]["stack"] <= 16
    for rows in (2, 4):
        assert compiled[f"worklist pdl rows {rows} 64"]["stack"] == 0, rows
        assert compiled[f"worklist pdl rows {rows} 128"]["stack"] <= 32, rows
        assert compiled[f"worklist pdl rows {rows} 128"]["registers"] < 200, rows


def test_loads_vectorize_and_pipeline_as_on_the_gpu(compiled):
    """The build specializes as a launch does: the products' and attention's tiles come in
    through 16-byte asynchronous copies into shared memory, not 2-byte loads."""
    for kernel in ("linear off", "linear m16 qkv", "linear m16 down", "worklist"):
        assert "cp.async.cg.shared.global" in compiled[kernel]["ptx"], kernel
        assert "ld.global.b16" not in compiled[kernel]["ptx"], kernel


GLOBAL_READ = re.compile(r"\b(ld\.global|cp\.async\.(?!bulk\.prefetch)|atom\.)")  # an L2 prefetch reads nothing


def first_load_after_the_wait(ptx: str) -> bool:
    """The program lets its dependents start, then waits, and reads no memory before it."""
    start, wait = ptx.find("griddepcontrol.launch_dependents"), ptx.find("griddepcontrol.wait")
    return 0 <= start < wait and not GLOBAL_READ.search(ptx[:wait]) and bool(GLOBAL_READ.search(ptx[wait:]))


@pytest.mark.parametrize("kernel", ["worklist pdl", "fold pdl", "rope_store pdl", "linear prefetch",
                                    "linear reduce pdl", "choices pdl", "embed pdl"])
def test_programmatic_dependents_read_nothing_before_they_wait(compiled, kernel):
    assert first_load_after_the_wait(compiled[kernel]["ptx"]), kernel


def test_a_product_warms_its_own_weights_before_it_waits_and_without_it_launches_as_before(compiled):
    ptx = compiled["linear prefetch"]["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert ptx[:wait].count("prefetch.global.L2") >= 1 and "prefetch.global.L2" not in ptx[wait:]
    # the warming spills nothing and costs a few registers
    assert compiled["linear prefetch"]["stack"] == 0
    assert compiled["linear prefetch"]["registers"] <= compiled["linear launch"]["registers"] + 16
    assert "prefetch.global.L2" not in compiled["linear launch"]["ptx"]
    for kernel in ("linear off", "worklist"):
        assert "griddepcontrol" not in compiled[kernel]["ptx"], kernel


def test_the_fused_products_do_not_spill(compiled):
    """Specialized as on the GPU, the 64-row gate/up with its norm takes ~150 registers
    a thread (wgmma), the 16-row products 40-65 (mma.sync); none spills."""
    for name in ("linear off", "linear launch", "linear m16 qkv", "linear m16 o", "linear m16 down"):
        assert compiled[name]["stack"] == 0, name


def k_loops(ptx: str) -> list[str]:
    """The PTX of each loop that copies tiles into shared memory (a product's K loop):
    from its header to the branch back to it."""
    loops = []
    for header in re.finditer(r"^(\$L__BB\d+_\d+):.*Loop Header", ptx, re.M):
        back = re.search(r"bra(\.uni)?\s+" + re.escape(header.group(1)) + ";", ptx[header.end():])
        if back is not None and "cp.async" in ptx[header.end():header.end() + back.end()]:
            loops.append(ptx[header.end():header.end() + back.end()])
    return loops


@pytest.mark.parametrize("kernel", ["five qkv", "five o", "five gate_up", "five down", "five lm_head",
                                    "five lm_head screened", "five five-launch, gate_up 16 outputs",
                                    "five five-launch, gate_up 32 outputs", "five five-launch, gate_up 64 outputs",
                                    "five five-launch, gate_up split 2", "five five-launch, down 16 outputs, split 19"])
def test_the_five_launch_products_k_loops_wait_on_no_load_of_their_own(compiled, kernel):
    """Every load a fused product's K loop uses comes through its pipeline: none waits a
    round trip each step. Session 41 found the norm's weight read by a plain 2-byte load
    each step where 4 warps share a 128-wide K step (1 element a thread: too narrow for an
    asynchronous copy): gate/up in 16 or 32 outputs at 4 warps, and the gateup probe's
    `4 warps`. Two warps, or 8, pipeline it. Built as the step launches each tile."""
    loops = k_loops(compiled[kernel]["ptx"])
    assert loops, kernel
    for body in loops:
        assert not re.search(r"\bld\.global", body), kernel
    assert compiled[kernel]["stack"] == 0, kernel


def opcodes(ptx: str) -> collections.Counter:
    """How many of each instruction a kernel's PTX holds (its debug sections left out)."""
    counts: collections.Counter = collections.Counter()
    for line in ptx.split(".section\t.debug")[0].splitlines():
        words = line.split()
        if not words or words[0].startswith((".", "//", "$", "{", "}")):
            continue
        counts[words[1] if words[0].startswith("@") and len(words) > 1 else words[0]] += 1
    return counts


@pytest.mark.parametrize("product", ["qkv", "o", "gate_up", "down", "lm_head"])
def test_live_rows_read_before_the_wait_move_the_metadatas_loads_and_nothing_else(compiled, product):
    """CODESPEC_CUDA_EARLY_ROWS (session 41), built as the five-launch layers launch each
    product: before the wait it reads the pass's metadata alone, past L1; every other
    instruction is the build's without it, one for one, at the same registers (session
    33's `early` also moved the residual, and another layout of the epilogue's sums came
    with it: its bits differed)."""
    base, early = compiled[f"five {product}"], compiled[f"five {product} early rows"]
    wait = early["ptx"].index("griddepcontrol.wait")
    before = re.findall(r"ld\.global\S*", early["ptx"][:wait])
    assert before and set(before) == {"ld.global.cg.b64"}, before  # the int64 context and path lengths
    moved, kept = opcodes(early["ptx"]), opcodes(base["ptx"])
    assert kept["ld.global.b64"] - moved["ld.global.b64"] == moved["ld.global.cg.b64"] == len(before)
    for opcode in ("ld.global.b64", "ld.global.cg.b64"):
        moved.pop(opcode, None), kept.pop(opcode, None)
    assert moved == kept
    assert early["registers"] == base["registers"] and early["stack"] == 0


def test_a_folded_split_counts_after_a_barrier_at_gpu_scope_and_reads_past_l1(compiled):
    """CODESPEC_CUDA_REDUCE=fold (the fused 16-row down): every thread's partial stored
    before the count, an acq_rel count at GPU scope, the others' partials read past L1."""
    ptx = compiled["linear m16 down"]["ptx"]
    count = ptx.index("atom.global.gpu.acq_rel.add")
    assert "bar.sync" in ptx[ptx.rindex("st.global", 0, count):count]
    assert "ld.global.cg" in ptx[count:]
    assert "atom" not in compiled["linear m16 qkv"]["ptx"]  # no fold: the reduce kernel's launch


def test_fused_multiply_adds_are_pinned_and_rotary_rounds_each_product(compiled):
    """Under Triton 3.10's default (no fusion) the products still fuse (what the GPU check
    measured); rotary never does: with fusion its `(x * cos).to(bf16) + ...` became one
    bf16 fma, the product unrounded, where transformers' eager code rounds it."""
    assert "fma.rn" in compiled["linear off"]["ptx"]
    rope = compiled["rope_store pdl"]["ptx"]
    # `.rn` on every product and sum: PTX may contract an unmarked mul and add into an fma
    assert "fma.rn" not in rope and "mul.bf16" not in rope
    assert "mul.rn.bf16" in rope and "add.rn.bf16" in rope



def test_a_traced_kernel_reads_the_global_timer_at_each_phase_and_spills_nothing(compiled):
    """kernels/_triton_trace.py: a traced product marks start, waited, computed, reduced
    and ended (one %globaltimer read each), still reads nothing before it waits, spills
    nothing; untraced, no mark is left in the build. (Its registers may grow: Triton
    3.6's fold attention took a few more traced, 3.9's 56 more; the trace stage times
    each variant untraced too.)"""
    for traced, untraced, marks in (("linear m16 down traced", "linear m16 down", 5),
                                    ("fold pdl traced", "fold pdl", 3)):
        ptx = compiled[traced]["ptx"]
        assert ptx.count("%globaltimer") >= marks, traced
        assert "%smid" in ptx and "%smid" not in compiled[untraced]["ptx"], traced  # the SM, at the start
        assert "%globaltimer" not in compiled[untraced]["ptx"]
        assert first_load_after_the_wait(ptx), traced
        assert compiled[traced]["stack"] == 0


def test_a_folded_q_k_v_reads_its_epilogues_inputs_before_its_loop(compiled):
    """The five-launch layers' q/k/v (its split folded): the bias, the positions, rotary's
    tables at them and where K and V go come in right after the wait, in flight during
    the K loop; past the count, the program that stores the outputs reads the partials
    alone (session 38's H200 trace: the epilogue's dependent reads 1.3 us of q/k/v's 6.4)."""
    ptx = compiled["linear m16 qkv fold"]["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    loop = ptx.index("cp.async", wait)
    count = ptx.index("atom.global.gpu.acq_rel.add")
    assert len(re.findall(r"ld\.global", ptx[wait:loop])) >= 10  # metadata, bias, tables, KV places
    after = re.findall(r"ld\.global(\S*)", ptx[count:])
    assert after and all(kind.startswith(".cg") for kind in after), after
    assert compiled["linear m16 qkv fold"]["stack"] == 0


def test_a_row_group_spills_nothing_and_keeps_one_blocks_loop_for_a_step(compiled):
    """CODESPEC_CUDA_ROW_GROUP=4 (gate/up at its 8 warps): four accumulators of a 16-row
    block, and the build spills nothing. It holds three K loops, of one, two and four
    blocks' products a weight tile (seven times a group of one's tensor-core products): a
    step runs the first, a group of one's loop."""
    for name in ("down", "gate_up", "qkv"):
        group = compiled[f"linear m16 {name} group"]
        assert group["stack"] == 0, name
        if name != "gate_up":  # built at 4 warps alone
            assert group["ptx"].count("mma.sync") == 7 * compiled[f"linear m16 {name}"]["ptx"].count("mma.sync")


def test_the_probes_flagged_launches_wait_on_the_count_not_the_launch_before(compiled):
    """`launched flags`: a programmatic dependent that never calls griddepcontrol.wait;
    it reads the count with acquire at GPU scope before its products, and raises it with
    release after a CTA barrier."""
    ptx = compiled["persist launched flags"]["ptx"]
    assert "griddepcontrol.launch_dependents" in ptx and "griddepcontrol.wait" not in ptx
    assert "ld.global.gpu.acquire" in ptx
    count = [found.start() for found in re.finditer(r"(atom|red)\.global\.gpu\.release\.add", ptx)][-1]
    assert "bar.sync" in ptx[ptx.rindex("st.global", 0, count):count]
    assert compiled["persist launched flags"]["stack"] == 0


@pytest.mark.parametrize("kernel", ["linear m16 down flags", "fold pdl flags"])
def test_counted_launches_wait_on_the_count_before_and_raise_their_own_after_their_stores(compiled, kernel):
    """CODESPEC_CUDA_PDL=flags (kernels/flags.py): a programmatic dependent that never
    calls griddepcontrol.wait; it reads the count of the launch before with acquire at
    GPU scope before anything it reads, and raises its own with release after a CTA
    barrier, its stores before; it spills nothing."""
    ptx = compiled[kernel]["ptx"]
    assert "griddepcontrol.launch_dependents" in ptx and "griddepcontrol.wait" not in ptx
    acquire = ptx.index("ld.global.gpu.acquire")
    assert not re.search(r"\b(ld\.global\.(?!gpu\.acquire)|cp\.async\.(?!bulk\.prefetch)|atom\.)", ptx[:acquire])
    count = [found.start() for found in re.finditer(r"(atom|red)\.global\.gpu\.release\.add", ptx)][-1]
    assert "bar.sync" in ptx[ptx.rindex("st.global", 0, count):count]
    assert compiled[kernel]["stack"] == 0


def loops(ptx: str) -> int:
    return ptx.count("Loop Header")


def test_a_norm_from_squares_walks_nothing_before_the_products_loop(compiled):
    """Session 23's fused q/k/v walked its rows of x in a loop of dependent loads before
    its pipelined loop (ptxas unrolls it by four: ~4 round trips to L2 a product). Fed
    the sums of squares, the product has its K loop alone, as the plain products do."""
    assert loops(compiled["linear m16 qkv walk"]["ptx"]) == loops(compiled["linear m16 qkv"]["ptx"]) + 1
    assert loops(compiled["linear m16 gate_up walk"]["ptx"]) == loops(compiled["linear m16 gate_up"]["ptx"]) + 1
    for name in ("linear m16 qkv", "linear m16 gate_up", "linear m16 o", "linear m16 down", "linear m16 lm_head"):
        assert compiled[name]["stack"] == 0, name


def test_rotary_in_q_k_v_s_epilogue_rounds_each_product_and_spills_nothing(compiled):
    """q/k/v with rotary and the KV store in its epilogue launches without fused
    multiply-adds, as rope_store does: each product and the sum rounded."""
    ptx = compiled["linear m16 qkv"]["ptx"]
    assert "fma.rn" not in ptx and "mma.sync" in ptx
    assert compiled["linear m16 qkv"]["stack"] == 0 and compiled["linear m16 qkv walk"]["stack"] == 0


def test_attentions_fold_counts_after_a_barrier_at_gpu_scope_and_reads_past_l1(compiled):
    """The fold schedule's combine, as row_linear's fold (which the H100 ran exact): every
    thread's partial stored before the count, an acq_rel count at GPU scope, the partials
    read past L1 after it."""
    ptx = compiled["fold pdl"]["ptx"]
    count = ptx.index("atom.global.gpu.acq_rel.add")
    assert "bar.sync" in ptx[ptx.rindex("st.global", 0, count):count]
    assert "ld.global.cg" in ptx[count:]


def test_the_persistent_probe_builds_its_barriers_and_warming_for_the_gpu(compiled):
    """The probe's one launch: acq_rel arrivals at GPU scope, acquiring reads while it
    waits, the flag where it gave up, L2 prefetches of the next product's weights, no spills. Launched one product
    at a time as a programmatic dependent: it warms its weights, then waits, then reads."""
    ptx = compiled["persist prefetch"]["ptx"]
    assert "atom.global.gpu.acq_rel.add" in ptx and "ld.global.gpu.acquire" in ptx  # a read of 0 added: a load
    assert "global.gpu.relaxed.max" in ptx and "prefetch.global.L2" in ptx  # the flag (red or atom); the warming
    assert compiled["persist prefetch"]["stack"] == 0 and compiled["persist launched pdl"]["stack"] == 0
    launched = compiled["persist launched pdl"]["ptx"]
    assert first_load_after_the_wait(launched)
    assert "prefetch.global.L2" in launched[:launched.index("griddepcontrol.wait")]


def test_the_lm_screen_reads_int8_into_a_tensor_core_product_without_spilling(compiled):
    """The screen's int8 tiles come in through 16-byte asynchronous copies (pipelined, as
    the products' bf16 tiles) and meet x in a bf16 tensor-core product (the bytes
    unpacked in registers: exact for |q| <= 127); each row's best lower bound raised by
    a float atomic max at GPU scope; nothing spills, in a group of four blocks of rows
    either. Launched as a programmatic dependent, it warms its int8 block into L2 and
    reads nothing else before it waits."""
    for name in ("lm screen", "lm screen prefetch", "lm screen group"):
        screen = compiled[name]
        assert "cp.async.cg.shared.global" in screen["ptx"], name
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in screen["ptx"] or "wgmma" in screen["ptx"]
        # a float's max as Triton lowers it: a signed max where the value is positive, an
        # unsigned min where it is negative (-inf, the start, loses to either)
        # (`red` under Triton 3.9, `atom` under 3.6, the GPU machine's)
        assert re.search(r"(atom|red)\.global\.gpu\.relaxed\.max\.s32", screen["ptx"]), name
        assert re.search(r"(atom|red)\.global\.gpu\.relaxed\.min\.u32", screen["ptx"]), name
        assert screen["stack"] == 0, name
    ptx = compiled["lm screen prefetch"]["ptx"]
    assert first_load_after_the_wait(ptx) and "prefetch.global.L2" in ptx[:ptx.index("griddepcontrol.wait")]
    assert compiled["lm rows pdl"]["stack"] == 0 and first_load_after_the_wait(compiled["lm rows pdl"]["ptx"])


def test_the_screened_lm_head_keeps_its_k_loop_and_reads_its_flags_once_after_the_wait(compiled):
    """lm_head over the normed rows behind the screen: its K loop is the product's (no
    norm, every load pipelined), and before the loop it reads each row's bound for its
    block and its best, once; nothing spills."""
    ptx = compiled["five lm_head screened"]["ptx"]
    assert compiled["five lm_head screened"]["stack"] == 0
    for body in k_loops(ptx):
        assert not re.search(r"\bld\.global", body)
    wait = ptx.index("griddepcontrol.wait")
    loop = ptx.index("cp.async", wait)
    assert len(re.findall(r"ld\.global\S*\.b32", ptx[wait:loop])) >= 2  # hi and best (float32)
