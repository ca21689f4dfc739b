"""Measurements shared by scripts/gpu_check.py and scripts/gpu_probes.py (CUDA only):
device and host timings, rows against their decode steps, the pass-cost curve, a step's
kernels."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch


def _time(run: Callable[[], Any], repeat: int = 30) -> float:
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times), 4)


def pass_replay(forward: Any, cache: Any, context: int, tree: Any) -> Callable[[], None]:
    """A replay of the graph that runs `tree`'s pass over `context` keys, with that pass's
    metadata in the bucket: the graph of the layout the backend gives a pass of its rows
    (the bucket's, the wide passes' with CODESPEC_CUDA_PASS_ROW_GROUP, the narrow steps'
    with CODESPEC_CUDA_NARROW_STEPS). Until 2026-11-28 the step stage replayed whatever
    pass ran last: its `device_step_ms` was a 32-row pass's."""
    forward.choices(cache, [(0, context, tree)])  # the pass's metadata (and its graph captured)
    bucket = forward._buckets[cache]
    layout = forward.layout(len(tree.tokens))
    graph = bucket.graphs.get(layout)
    if graph is not None:
        return graph.replay

    def without_graphs() -> None:  # the bucket's pass itself (on CPU: the tests)
        with torch.inference_mode():
            forward._replay(cache, bucket, layout)

    return without_graphs


def device_ms(replay: Callable[[], None], replays: int = 20) -> float:
    """Device ms a replay, `replays` back to back between two events (no host between)."""
    return round(_time(lambda: [replay() for _ in range(replays)], 10) / replays, 4)


def _graph_us(run: Callable[[], Any], calls: int = 20) -> float:
    """Device time per call of `run`, `calls` of them captured in one CUDA graph: no host
    launch cost in the figure, as inside the backend's own graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            run()
    us = _time(graph.replay, repeat=10) * 1e3 / calls
    del graph
    return round(us, 2)


def _wall_ms(run: Callable[[], Any], repeat: int = 30) -> float:
    """Host wall time per call (a pass ends with its choices on the host)."""
    for _ in range(3):
        run()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        times.append((time.perf_counter() - began) * 1e3)
    return round(statistics.median(times), 4)


def _engine(loaded: Any, slots: int = 2):
    from codespec.engine import Engine

    return Engine(loaded.forward, loaded.tokenizer, eos_token_ids=[], slots=slots)


def hbm_copy_gbs() -> float:
    """Device-to-device copy bandwidth, bytes read plus written."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (_time(lambda: dst.copy_(src), repeat=10) / 1e3) / 1e9


def random_tree(generator: torch.Generator, vocab: int, nodes: int = 64) -> Any:
    """A random draft tree of `nodes` nodes (parents before children) over `vocab`."""
    from codespec.policy.tree import VerifyTree

    parents = [-1] + [int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, nodes)]
    depths = [0]
    for parent in parents[1:]:
        depths.append(depths[parent] + 1)
    tokens = torch.randint(0, vocab, (nodes,), generator=generator).tolist()
    return VerifyTree(tuple(tokens), tuple(parents), tuple(depths), tuple(range(nodes - 1)))


def row_checks(loaded: Any) -> dict[str, Any]:
    """Rows of tree passes against one-row decode steps, logits bit for bit."""
    from codespec.policy.tree import VerifyTree

    forward = loaded.forward
    engine = _engine(loaded)
    cache = engine.cache
    generator = torch.Generator().manual_seed(3)
    vocab = forward.config.vocab_size
    checked = differing = 0
    for context in (100, 700, 1900):
        prompt = torch.randint(0, vocab, (context,), generator=generator).tolist()
        for slot in (0, 1):
            cache.acquire(prompt)
            forward.prefill(cache, slot, prompt, 0)
            cache.release(slot)
        tree = random_tree(generator, vocab)
        tokens = tree.tokens
        tree_logits = forward.logits(cache, [(0, context, tree)])
        for node in range(0, 64, 5):  # node's path, decoded token by token in slot 1
            path = tree.path(node)
            for step, at in enumerate(path):
                logits = forward.logits(cache, [(1, context + step, VerifyTree.chain(tokens[at]))])
            checked += 1
            differing += int(not torch.equal(tree_logits[node], logits[0]))
    return {"rows_checked": checked, "rows_differing": differing}


def pass_ms(loaded: Any, forward: Any, rows: Any, context: int = 512) -> dict[int, float]:
    """Host wall ms per pass of `forward` by rows (chains of that many), over `context`
    keys of a prefilled prompt."""
    from codespec.policy.tree import VerifyTree

    cache = _engine(loaded, slots=1).cache
    prompt = [(7 * i) % forward.config.vocab_size for i in range(context)]
    cache.acquire(prompt)
    forward.prefill(cache, 0, prompt, 0)
    cache.release(0)
    return {n: _wall_ms(lambda n=n: forward.choices(cache, [(0, context, VerifyTree.chain(11, [13] * (n - 1)))]))
            for n in rows}


def cost_curve(loaded: Any) -> dict[str, Any]:
    """Median ms per verify pass by rows (chains), and the plain step against bandwidth."""
    curve = {str(context): pass_ms(loaded, loaded.forward, (1, 2, 4, 8, 16, 32, 48, 64, 65, 96, 128, 192), context)
             for context in (512, 2048)}
    step = curve["512"][1]
    floor = step_floor(loaded)
    return {"ms_per_pass": curve, "ratio_32_rows_to_1": round(curve["512"][32] / step, 3),
            "ratio_32_rows_to_1_at_2048": round(curve["2048"][32] / curve["2048"][1], 3),
            **floor, "step_over_floor": round(step / floor["floor_ms"], 2)}


def step_bytes(model: Any) -> int:
    """The weights' bytes a plain step reads: every weight once, but of the input
    embeddings only a row, unless lm_head is the same tensor (tied: read whole)."""
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return weights if embed.data_ptr() == head.data_ptr() else weights - embed.numel() * embed.element_size()


def step_floor(loaded: Any) -> dict[str, float]:
    """The weights a step reads over the measured HBM copy bandwidth: a plain step's floor."""
    read = step_bytes(loaded.model)
    bandwidth = hbm_copy_gbs()
    return {"weights_read_per_step_mb": round(read / 2**20, 1), "hbm_copy_gbs": round(bandwidth, 1),
            "floor_ms": round(read / (bandwidth * 1e9) * 1e3, 4)}


def profile_step(loaded: Any) -> dict[str, Any]:
    """Where a one-row step's GPU time goes: kernels per step and the costliest kinds
    (torch.profiler over 20 replays). Compiling the whole pass as one program failed on
    the H100 (inductor could not build the attention kernel's tl.dot with input_precision)."""
    from torch.profiler import ProfilerActivity, profile

    from codespec.policy.tree import VerifyTree

    forward = loaded.forward
    engine = _engine(loaded, slots=1)
    cache = engine.cache
    prompt = [(7 * i) % forward.config.vocab_size for i in range(512)]
    cache.acquire(prompt)
    forward.prefill(cache, 0, prompt, 0)
    step = lambda: forward.choices(cache, [(0, 512, VerifyTree.chain(11))])  # noqa: E731
    base = _wall_ms(step)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    per_step = sum(e.count for e in kernels) / 20
    gpu_ms = sum(e.device_time_total for e in kernels) / 20 / 1e3
    top = sorted(kernels, key=lambda e: -e.device_time_total)[:15]
    result = {"wall_ms": base, "kernels_per_step": per_step, "gpu_busy_ms_per_step": round(gpu_ms, 4),
              "top": [(e.key[:90], e.count // 20, round(e.device_time_total / 20 / 1e3, 4)) for e in top]}
    return result


def step_anatomy(loaded: Any, context: int = 512, repeat: int = 50) -> dict[str, Any]:
    """Where a plain step's wall time goes, the bar the H100 runs missed (1.45 ms against
    1.17 ms of kernels): the host's work before the graph launches (rows laid out, the
    staging copy queued), the launch call, the wait for the choices, and the graph's own
    device time between CUDA events around it; then the same graph replayed 20 times
    back to back (no host in between): what a step costs the device alone. Medians, us."""
    from codespec.policy.tree import VerifyTree

    forward = loaded.forward
    cache = _engine(loaded, slots=1).cache
    prompt = [(7 * i) % forward.config.vocab_size for i in range(context)]
    cache.acquire(prompt)
    forward.prefill(cache, 0, prompt, 0)
    cuda = torch.cuda.is_available() and forward.device.type == "cuda"
    step = lambda: forward.choices(cache, [(0, context, VerifyTree.chain(11))])  # noqa: E731
    for _ in range(3):
        step()  # the graph is captured
    real = forward._replay
    marks: dict[str, Any] = {}

    def replay(cache_: Any, bucket: Any, wide: bool = False) -> None:
        marks["bucket"] = bucket
        marks["launch"] = time.perf_counter()
        if cuda:
            marks["start"].record()
        real(cache_, bucket, wide)
        if cuda:
            marks["end"].record()
        marks["launched"] = time.perf_counter()

    samples: dict[str, list[float]] = {"prepare_us": [], "launch_us": [], "wait_us": [], "wall_us": [], "graph_us": []}
    forward._replay = replay
    try:
        for _ in range(repeat):
            if cuda:
                marks["start"], marks["end"] = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            began = time.perf_counter()
            step()
            ended = time.perf_counter()
            samples["prepare_us"].append((marks["launch"] - began) * 1e6)
            samples["launch_us"].append((marks["launched"] - marks["launch"]) * 1e6)
            samples["wait_us"].append((ended - marks["launched"]) * 1e6)
            samples["wall_us"].append((ended - began) * 1e6)
            if cuda:
                marks["end"].synchronize()
                samples["graph_us"].append(marks["start"].elapsed_time(marks["end"]) * 1e3)
    finally:
        del forward._replay
    result = {name: round(statistics.median(values), 1) for name, values in samples.items() if values}
    bucket = marks["bucket"]
    if cuda and bucket.graphs.get(None) is not None:
        result["graph_back_to_back_us"] = round(_time(lambda: [bucket.graphs[None].replay() for _ in range(20)], 10)
                                                * 1e3 / 20, 1)
    return result
