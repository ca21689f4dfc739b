"""The Triton kernels the cuda backend runs, compiled offline to H100 (sm_90) machine
code: triton's own ptxas needs no GPU. What the interpreter cannot show: the inline PTX
is valid, the atomics and barriers lower as meant, a product's warming of its own
weights is not dropped as dead code, and no kernel spills at the warps it launches with. Each is compiled as a launch
on the GPU specializes it (pointers 16-byte aligned, integers multiples of 16): without
that, loads neither vectorize nor pipeline, and registers and spills are not the GPU's
(H100 runs read 255 registers and spills off such builds). In a process of its
own (sm90_builds.py, run as a script): the interpreter (tests/kernels/conftest.py) replaces
triton.jit here."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")

BUILDS = os.path.join(os.path.dirname(__file__), "sm90_builds.py")  # run as a script: see its docstring


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    # Triton 3.10's default (no fused multiply-add unless asked): the launches pin their own
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "TRITON_DEFAULT_FP_FUSION": "0"}
    # Two processes, each compiling every other kernel in the script's order: on a fresh
    # machine (triton's cache empty, as in CI) the compiles take ~50 s in one process.
    shards = 2
    running = [subprocess.Popen([sys.executable, BUILDS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
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
    # rows in groups: the fold at 128-key blocks takes ~255 registers, no stack
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
    round trip each step. An offline sm_90 build showed the norm's weight read by a plain 2-byte load
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
    """CODESPEC_CUDA_EARLY_ROWS, built as the five-launch layers launch each
    product: before the wait it reads the pass's metadata alone, past L1; every other
    instruction is the build's without it, one for one, at the same registers
    (the 2026-11-27 `early` also moved the residual, and another layout of the epilogue's sums came
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
    alone (an H200 trace: the epilogue's dependent reads 1.3 us of q/k/v's 6.4)."""
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
    """The first fused q/k/v walked its rows of x in a loop of dependent loads before
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
