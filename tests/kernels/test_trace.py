"""The traced fused layers (kernels/trace.py) through the Triton kernels under the
interpreter, whose logical clock orders every program's marks: a traced pass computes
the untraced pass's bits, every launch of the pass has its region with each program's
phases in order, and the timeline adds the launches' shares up to the pass."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from codespec.engine import Engine
from codespec.errors import SettingError
from codespec.forward.cuda import CudaForward
from codespec.kernels.trace import PHASES, SM_COLUMN, summary, timeline
from codespec.models.tiny import tiny_model
from codespec.policy.tree import VerifyTree
from tests.kernels.interpreter_patch import PADDING_ROW_WARNINGS

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")
pytestmark = PADDING_ROW_WARNINGS


@pytest.mark.parametrize("schedule,reduce", [("worklist", "launch"), ("fold", "fold")])
def test_a_traced_step_marks_every_program_of_every_launch_in_order(monkeypatch, schedule, reduce):
    from codespec.kernels import row_attention, row_linear

    for module in (row_linear, row_attention):
        monkeypatch.setattr(module, "use_triton", lambda tensor, force: True)  # CPU tensors: the interpreter
    monkeypatch.setenv("CODESPEC_CUDA_ATTENTION", schedule)
    monkeypatch.setenv("CODESPEC_CUDA_REDUCE", reduce)
    model = tiny_model("qwen2", vocab_size=32, seed=5, dtype=torch.float32)
    prompt = list(range(1, 12))
    logits = {}
    for traced in (False, True):
        forward = CudaForward(model, rows=16, fused=True, trace=traced)
        cache = Engine(forward, None, eos_token_ids=[], slots=1).cache
        cache.acquire(prompt)
        forward.prefill(cache, 0, prompt, 0)
        if traced:
            forward.tracer.clear()  # the prefill's marks: the step's alone below
        logits[traced] = forward.logits(cache, [(0, len(prompt), VerifyTree.chain(3, [4, 5]))])
    assert torch.equal(logits[True], logits[False])  # a mark is a store of a clock, nothing more

    layers = model.config.num_hidden_layers
    attention = ["attention"] if schedule == "fold" else ["attention", "attention_combine"]
    kinds = ["qkv", *attention, "o", "gate_up", "down"]
    assert forward.tracer.labels == [f"{kind}.{i}" for i in range(layers) for kind in kinds] + ["lm_head"]
    line = forward.tracer.timeline()
    previous_end, ended = 0, PHASES.index("ended")
    for label, marks in forward.tracer.regions:
        assert (marks[:, 0] > previous_end).all(), label  # the interpreter runs launches one after another
        assert not marks[:, SM_COLUMN].any(), label  # no SM to name under the interpreter
        for program in marks[:, :SM_COLUMN].tolist():
            reached = [mark for mark in program if mark > 0]
            assert program[0] > 0 and program[ended] > 0 and reached == sorted(reached), (label, program)
        previous_end = int(marks[:, ended].max())
    products = [marks for label, marks in forward.tracer.regions
                if label.split(".")[0] in ("qkv", "o", "gate_up", "down", "lm_head")]
    # a step's one row lies in the first block of 16 rows: its programs compute, the other
    # block's (padding) only start, wait and end
    assert all((marks[:, PHASES.index("computed")] > 0).any() for marks in products)
    assert sum(launch["share"] for launch in line["launches"]) == line["total"] > 0
    kinds_seen = summary(line)
    assert set(kinds) | {"lm_head"} <= set(kinds_seen)
    assert kinds_seen["qkv"]["launches"] == layers


def test_tracing_asks_for_the_fused_layers():
    model = tiny_model("qwen2", vocab_size=32, seed=5, dtype=torch.float32)
    with pytest.raises(SettingError, match="CODESPEC_CUDA_FUSED=1"):
        CudaForward(model, rows=16, fused=False, trace=True)


def test_the_trace_stage_reads_a_timeline_of_every_launch(monkeypatch):
    """scripts/gpu_trace.py's stage on CPU: the kernels under the interpreter (its logical
    clock), each pass run again where the GPU replays its graph; every variant's step
    and 32-row pass get a timeline whose kinds are the fused layers' launches."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "scripts"))
    gpu_trace = pytest.importorskip("gpu_trace")
    from codespec.kernels import row_attention, row_linear

    for module in (row_linear, row_attention):
        monkeypatch.setattr(module, "use_triton", lambda tensor, force: True)  # CPU tensors: the interpreter
    monkeypatch.setattr(gpu_trace, "device_ms", lambda replay: replay() or 1.0)  # device timings: the GPU's alone
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(gpu_trace, "REPLAYS", 1)
    # the five-launch layers, and with wide passes in a graph of their own (two of three:
    # the interpreter is slow)
    five = "fused m16 pdl/prefetch fold, fold attention"
    every = "fused m16 pdl/prefetch fold, fold attention, pass row group"
    monkeypatch.setattr(gpu_trace, "TRACED", {label: gpu_trace.TRACED[label] for label in (five, every)})
    monkeypatch.setenv("CODESPEC_CUDA_ROWS", "32")
    model = tiny_model("qwen2", vocab_size=16, seed=3, dtype=torch.float32)
    loaded = types.SimpleNamespace(model=model, forward=CudaForward(model, rows=32), tokenizer=None)
    result = gpu_trace.trace_probe(loaded, context=10)
    for label in gpu_trace.TRACED:
        for part in ("step", "pass32"):
            seen = result[label][part]
            assert {"qkv", "attention", "o", "gate_up", "down", "lm_head"} <= set(seen["kinds"]), (label, part)
            assert seen["median_total_us"] == seen["kinds"]["total"] > 0
            assert seen["device_ms"] == seen["traced_device_ms"] == 1.0
    table = gpu_trace.report(result)  # what the docs take: a table per variant and pass
    assert table.count("| kind | launches | share |") == 2 * len(gpu_trace.TRACED)
    assert "| qkv | 2 |" in table and "| lm_head | 1 |" in table
    # a bucket of 32 rows: two blocks of 16, two programs a column block and split; the
    # 32-row pass with a pass row group replays the wide passes' graph, one group of both
    programs = {(label, part): result[label][part]["kinds"]["qkv"]["programs"] for label in gpu_trace.TRACED
                for part in ("step", "pass32")}
    assert programs[five, "step"] == programs[every, "step"] == programs[five, "pass32"]
    assert programs[five, "pass32"] == 2 * programs[every, "pass32"]


def test_a_launchs_programs_are_counted_by_the_sm_they_ran_on():
    """Where the marks name each program's SM (%smid + 1 on a GPU), a launch says how its
    working programs (those that computed) shared the SMs and the K loop's median time
    alone on an SM and shared: here SM 1 runs two (4 and 6 ticks), SM 2 one (3), and a
    program of padding rows (no `computed` mark) on SM 3 counts for nothing there, but as
    an idle program (when the last ended against the work's end)."""
    #                      start waited computed reduced ended  sm
    region = torch.tensor([[1, 2, 6, 0, 7, 2],
                           [1, 2, 8, 0, 9, 2],
                           [1, 3, 6, 0, 7, 3],
                           [1, 2, 0, 0, 3, 4]])
    launch = timeline([("gate_up.0", region)], unit=1.0)["launches"][0]
    assert (launch["sms"], launch["most_on_one_sm"]) == (2, 2)
    assert (launch["computed_alone"], launch["computed_shared"]) == (3.0, 5.0)
    assert summary({"launches": [launch], "total": 8.0})["gate_up"]["most_on_one_sm"] == 2
    # the padding rows' program: idle, ending 6 ticks before the last working one (9)
    assert (launch["idle_programs"], launch["idle_end_after_work"]) == (1, -6.0)
    unknown = region.clone()
    unknown[:, SM_COLUMN] = 0  # the interpreter's marks: no SM
    assert "sms" not in timeline([("gate_up.0", unknown)], unit=1.0)["launches"][0]
    assert "sms" not in timeline([("gate_up.0", region[:, :SM_COLUMN])], unit=1.0)["launches"][0]
