"""Every Triton launch of the cuda backend, compiled offline for sm_90 (H100, H200) as a
launch on the GPU specializes it; triton's own ptxas needs no GPU. Run as a script, in a
process without the interpreter, by test_sm90_compile.py's fixture: prints {name:
{"ptx", "stack", "registers"}} as JSON. SM90_SHARD=i/n builds every n-th launch from the
i-th (the fixture runs two such processes at once)."""

import json
import os
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from codespec.forward.cuda import _attention, _rope_store
from codespec.forward.cuda._pdl import launch_options
from codespec.forward.cuda.attention import WORK_WARPS

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
    shapes = dict(GROUP=7, GROUP_PAD=16, DIM=64, KEY_BLOCK=128, PRECISION="tf32")
    for pdl in (False, True):
        out["worklist" + " pdl" * pdl] = build(_attention._row_attention_work_kernel,
                                               dict(pointers + meta + [("rows", "i32")] + strides),
                                               {**shapes, "KV_HEADS": 2, "ROWS_PAD": 64, "PDL": pdl},
                                               warps=WORK_WARPS)
    out["combine pdl"] = build(_attention._row_attention_combine_kernel,
                               {"out_ptr": "*bf16", "part_ptr": "*fp32", "context_ptr": "*i64", "path_len_ptr": "*i64",
                                **{name: "i32" for name in ("s_out_row", "s_out_head", "s_part_row", "s_part_head",
                                                            "s_part_block")}},
                               {"DIM": 64, "KEY_BLOCK": 128, "CHUNK": 16, "PDL": True}, warps=WORK_WARPS)
    out["rope_store pdl"] = build(_rope_store._rope_store_kernel,
                                  {**{name: "*bf16" for name in ("qkv_ptr", "cos_ptr", "sin_ptr")},
                                   **{name: "*i64" for name in ("positions_ptr", "source_ptr", "write_slot_ptr",
                                                                "write_position_ptr")},
                                   **{name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr")},
                                   "context_ptr": "*i64", "path_len_ptr": "*i64",
                                   **{name: "i32" for name in ("s_qkv", "s_rope", "s_q_row", "s_q_head", "s_kv_slot",
                                                               "s_kv_head", "s_kv_pos")}},
                                  {"HEADS": 14, "KV_HEADS": 2, "DIM": 64, "TABLES": True, "LIVE": True, "PDL": True},
                                  warps=1, fp_fusion=_rope_store.ROPE_FP_FUSION)
    return out


if __name__ == "__main__":
    json.dump({name: kernel for name, kernel in builds().items() if kernel is not None}, sys.stdout)
