"""The Triton kernels the cuda backend runs, compiled offline to H100 (sm_90) machine
code: triton's own ptxas needs no GPU. What the interpreter cannot show: the inline PTX
is valid, and no kernel spills at the warps it launches with. Each is compiled as a launch
on the GPU specializes it (pointers 16-byte aligned, integers multiples of 16): without
that, loads neither vectorize nor pipeline, and registers and spills are not the GPU's
(H100 runs read 255 registers and spills off such builds). In a process of its
own (sm90_builds.py, run as a script): the interpreter (tests/kernels/conftest.py) replaces
triton.jit here."""

from __future__ import annotations

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


def test_the_kernels_launch_without_spilling(compiled):
    for name in ("worklist", "worklist pdl", "combine pdl", "rope_store pdl"):
        assert compiled[name]["stack"] == 0, name


def test_loads_vectorize_and_pipeline_as_on_the_gpu(compiled):
    """The build specializes as a launch does: attention's keys come in through 16-byte
    asynchronous copies into shared memory, not 2-byte loads."""
    assert "cp.async.cg.shared.global" in compiled["worklist"]["ptx"]
    assert "ld.global.b16" not in compiled["worklist"]["ptx"]


GLOBAL_READ = re.compile(r"\b(ld\.global|cp\.async\.(?!bulk\.prefetch)|atom\.)")  # an L2 prefetch reads nothing


def first_load_after_the_wait(ptx: str) -> bool:
    """The program lets its dependents start, then waits, and reads no memory before it."""
    start, wait = ptx.find("griddepcontrol.launch_dependents"), ptx.find("griddepcontrol.wait")
    return 0 <= start < wait and not GLOBAL_READ.search(ptx[:wait]) and bool(GLOBAL_READ.search(ptx[wait:]))


@pytest.mark.parametrize("kernel", ["worklist pdl", "combine pdl", "rope_store pdl"])
def test_programmatic_dependents_read_nothing_before_they_wait(compiled, kernel):
    assert first_load_after_the_wait(compiled[kernel]["ptx"]), kernel
    assert "griddepcontrol" not in compiled["worklist"]["ptx"]


def test_rotary_rounds_each_product(compiled):
    """Rotary never fuses a multiply and an add: with fusion its `(x * cos).to(bf16) + ...`
    became one bf16 fma, the product unrounded, where transformers' eager code rounds it."""
    rope = compiled["rope_store pdl"]["ptx"]
    # `.rn` on every product and sum: PTX may contract an unmarked mul and add into an fma
    assert "fma.rn" not in rope and "mul.bf16" not in rope
    assert "mul.rn.bf16" in rope and "add.rn.bf16" in rope
