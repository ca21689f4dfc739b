"""Every Triton launch of the cuda backend and the GPU check's probes, compiled offline
for sm_90 (H100, H200) as a launch on the GPU specializes it; triton's own ptxas needs
no GPU. Run as a script, in a process without the interpreter, by test_sm90_compile.py's
fixture: prints {name: {"ptx", "stack", "registers"}} as JSON. SM90_SHARD=i/n builds
every n-th launch from the i-th (the fixture runs two such processes at once)."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # the GPU check's probes

from codespec.forward.cuda_fused import FUSED_TILES, SCREENED_LM_HEAD  # noqa: E402
from codespec.kernels import (_triton, _triton_attention, _triton_linear, _triton_linear_finish,  # noqa: E402
                              _triton_screen)
from codespec.kernels._triton_pdl import launch_options  # noqa: E402
from codespec.kernels.row_attention import WORK_WARPS  # noqa: E402
import gpu_persist  # noqa: E402
import gpu_step  # noqa: E402

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


def builds() -> dict:
    """Every launch's build, by name (None: another shard's)."""
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
    # 64-key blocks (CODESPEC_CUDA_KEY_BLOCK=64): the worklist and the fold
    out["worklist pdl 64"] = build(_triton_attention._row_attention_work_kernel,
                                   dict(pointers + meta + [("rows", "i32")] + strides + trace + flags),
                                   {**shapes, "KEY_BLOCK": 64, "KV_HEADS": 2, "ROWS_PAD": 64, "PDL": True, "CLOCK": 0,
                                    "FLAGS": False, "EARLY": False},
                                   warps=WORK_WARPS)
    out["fold pdl 64"] = build(_triton_attention._row_attention_fold_kernel,
                               dict(pointers[:4] + [("out_ptr", "*bf16"), ("count_ptr", "*i32")] + meta
                                    + [("rows", "i32")] + strides + [("s_out_row", "i32"), ("s_out_head", "i32")]
                                    + trace + flags),
                               {**shapes, "KEY_BLOCK": 64, "KV_HEADS": 2, "ROWS_PAD": 64, "HEADS_PAD": 16, "CHUNK": 16,
                                "PDL": True, "CLOCK": 0, "FLAGS": False, "EARLY": False},
                               warps=WORK_WARPS)
    # the first item begun before the wait (CODESPEC_CUDA_EARLY_KEYS): the worklist
    # and the fold, at either key block
    for block, chunk in ((128, 8), (64, 16)):
        out[f"worklist pdl early {block}"] = build(_triton_attention._row_attention_work_kernel,
                                                   dict(pointers + meta + [("rows", "i32")] + strides + trace + flags),
                                                   {**shapes, "KEY_BLOCK": block, "KV_HEADS": 2, "ROWS_PAD": 64,
                                                    "PDL": True, "CLOCK": 0, "FLAGS": False, "EARLY": True},
                                                   warps=WORK_WARPS)
        out[f"fold pdl early {block}"] = build(_triton_attention._row_attention_fold_kernel,
                                               dict(pointers[:4] + [("out_ptr", "*bf16"), ("count_ptr", "*i32")] + meta
                                                    + [("rows", "i32")] + strides
                                                    + [("s_out_row", "i32"), ("s_out_head", "i32")] + trace + flags),
                                               {**shapes, "KEY_BLOCK": block, "KV_HEADS": 2, "ROWS_PAD": 64,
                                                "HEADS_PAD": 16, "CHUNK": chunk, "PDL": True, "CLOCK": 0,
                                                "FLAGS": False, "EARLY": True},
                                               warps=WORK_WARPS)
    # rows in groups (CODESPEC_CUDA_ATTENTION_ROWS): the worklist at either key block,
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
              **{name: "*i64" for name in ("positions_ptr", "wslot_ptr", "wpos_ptr")},
              "k_ptr": "*bf16", "v_ptr": "*bf16",
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
                                      "PREFETCH": pdl == "prefetch", "SECTOR": 16, "SECTORS": 64, "WARM_ROWS": 8,
                                      "FOLD": False,
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

    squares = {"qkv": 896 // FUSED_TILES["down"].block_n, "gate_up": 896 // FUSED_TILES["o"].block_n,
               "lm_head": 896 // FUSED_TILES["down"].block_n}
    shapes_nk = {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896), "down": (896, 4864),
                 "lm_head": (151936, 896)}
    fusions = {"qkv": dict(NORM=True, HAS_BIAS=True, **rope), "o": dict(RESIDUAL=True, SQUARES_OUT=True),
               "gate_up": dict(NORM=True, PAIRS=True), "down": dict(RESIDUAL=True, SQUARES_OUT=True),
               "lm_head": dict(NORM=True, CHOICES=True)}
    launched = {f"five {name}": (name, tile) for name, tile in FUSED_TILES.items()}
    launched.update({f"five {label}": ("gate_up", tile) for label, tile in gpu_step.FIVE_GATE_UP_TILES.items()})
    launched.update({f"five {label}": ("down", tile) for label, tile in gpu_step.FIVE_DOWN_TILES.items()})
    # ... and reading their live rows before the wait (CODESPEC_CUDA_EARLY_ROWS)
    launched.update({f"five {name} early rows": (name, tile) for name, tile in FUSED_TILES.items()})
    # ... and lm_head behind its int8 screen over the normed rows (CODESPEC_CUDA_LM_SCREEN)
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
                                     {"part_ptr": "*fp32", "bias_ptr": "*bf16", "residual_ptr": "*bf16",
                                      "out_ptr": "*bf16",
                                      "block_out_ptr": "*fp32", "index_out_ptr": "*i32", "context_ptr": "*i64",
                                      "path_len_ptr": "*i64",
                                      "cos_ptr": "*bf16", "sin_ptr": "*bf16", "positions_ptr": "*i64",
                                      "wslot_ptr": "*i64",
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

    chain = {"w_ptr": "*bf16", **{name: "*fp32" for name in ("a_ptr", "b_ptr", "c_ptr")}, "sync_ptr": "*i32",
             "flag_ptr": "*i32", "first": "i32", "last": "i32"}
    layer = {f"{axis}{p}": size for p, shape in enumerate(gpu_persist.LAYER) for axis, size in zip("NK", shape)}
    sectors = {f"S{p}": triton.next_power_of_2(k // gpu_persist.SECTOR.value)
               for p, (_, k) in enumerate(gpu_persist.LAYER)}
    for name, pdl, flags in (("persist prefetch", False, False), ("persist launched pdl", True, False),
                             ("persist launched flags", True, True)):
        out[name] = build(gpu_persist._chain_kernel, chain,
                          {**layer, **sectors, "BLOCK_N": 8, "BLOCK_K": 128, "BLOCK_K_LONG": 256, "WORK": True,
                           "PREFETCH": True, "PDL": pdl, "SPIN_LIMIT": gpu_persist.SPIN_LIMIT, "FLAGS": flags})
    # lm_head's int8 screen (kernels/lm_screen.py, CODESPEC_CUDA_LM_SCREEN): the normed rows, and
    # the screen's int8 tiles into a bf16 tensor-core product, as the fused layers launch them

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
    return out


if __name__ == "__main__":
    json.dump({name: kernel for name, kernel in builds().items() if kernel is not None}, sys.stdout)
