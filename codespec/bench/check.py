"""`codespec check`: what keeps speculation lossless and fast, measured on this machine's
backend (the row decoder on a CPU, the cuda backend on a GPU, transformers' elsewhere).

1. rows: every row of random draft-tree passes equals its one-row decode step, logits
   bit for bit, at several context lengths (the exactness contract, forward/base.py);
2. passes: the median wall time of chain passes of 1..64 rows over 512 keys: what a
   verify pass costs against a plain step (the controller's prices come from the same
   curve, forward/profile.py);
3. plain: a one-row step against the weights' bytes read at this machine's measured
   read rate (a plain step's floor);
4. bench (`--bench`): `codespec bench verify` on a few requests, every draft policy at
   batch 1 and 4, each output compared with plain decoding.

    report = run_checks(loaded, settings)     # dict; report["ok"] is False on any difference
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np

from codespec.index import Draft
from codespec.verify.tree import VerifyTree

ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}
PASS_ROWS = (1, 8, 16, 32, 64)
PASS_CONTEXT = 512


def _cache(loaded: Any, settings: Any, slots: int, tokens: int, probes: tuple[int, bool] | None = None) -> Any:
    """KV slots as the engine's verifier sets them up (`probes`: the backend's row block
    and padded attention, measured once by run_checks; None: measured here)."""
    from codespec.engine.kvcache import SlotCache
    from codespec.verify.verifier import Verifier

    forward = loaded.forward
    cache = SlotCache(forward.config, slots=slots, slot_tokens=tokens, dtype=forward.kv_dtype, device=forward.device,
                      chunk=settings.prefill_chunk_tokens)
    Verifier(forward, cache, probes)
    return cache


def _bits(logits: Any, row: int) -> bytes:
    """A row's logits as raw bytes (torch or numpy): equal bytes, equal bits."""
    value = logits[row]
    if hasattr(value, "cpu"):
        import torch

        return value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return np.ascontiguousarray(value).tobytes()


def random_tree(rng: np.random.Generator, vocab: int, nodes: int) -> VerifyTree:
    """A random draft of `nodes - 1` nodes, each one's parent the pending token or among
    the four before it (long chains and branches both), as the engine builds its tree."""
    tokens = rng.integers(0, vocab, nodes).tolist()
    parents = tuple(int(rng.integers(max(-1, i - 4), i)) for i in range(nodes - 1))
    return VerifyTree.build(tokens[0], Draft(tuple(tokens[1:]), parents, (1,) * (nodes - 1), 0, "check"))


def row_checks(loaded: Any, settings: Any, contexts: tuple[int, ...] = (100, 700), nodes: int = 32,
               every: int = 3, probes: tuple[int, bool] | None = None) -> dict[str, Any]:
    """Rows of a random tree pass at each context against the same tokens decoded one
    step at a time in another slot (every `every`-th node's path)."""
    forward = loaded.forward
    vocab = int(forward.config.vocab_size)
    rng = np.random.default_rng(3)
    cache = _cache(loaded, settings, slots=2, tokens=max(contexts) + nodes + 8, probes=probes)
    checked, differing = 0, []
    for context in contexts:
        prompt = rng.integers(0, vocab, context).tolist()
        for slot in (0, 1):
            cache.acquire(prompt)
            forward.prefill(cache, slot, prompt, 0)
            cache.release(slot)
        tree = random_tree(rng, vocab, nodes)
        tree_logits = forward.logits(cache, [(0, context, tree)])
        for node in range(0, nodes, every):
            for step, at in enumerate(tree.path(node)):
                logits = forward.logits(cache, [(1, context + step, VerifyTree.chain(tree.tokens[at]))])
            checked += 1
            if _bits(tree_logits, node) != _bits(logits, 0):
                differing.append({"context": context, "node": node})
    return {"rows_checked": checked, "rows_differing": len(differing), "differing": differing[:8],
            "ok": checked > 0 and not differing}


def _median_ms(run: Callable[[], Any], repeat: int) -> float:
    for _ in range(2):
        run()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        times.append((time.perf_counter() - began) * 1e3)
    return round(statistics.median(times), 3)


def pass_costs(loaded: Any, settings: Any, repeat: int = 9, probes: tuple[int, bool] | None = None) -> dict[str, Any]:
    """Median wall ms of a greedy pass of each of PASS_ROWS rows (a chain) over
    PASS_CONTEXT keys; the pass's choices are on the host when it returns."""
    forward = loaded.forward
    vocab = int(forward.config.vocab_size)
    cache = _cache(loaded, settings, slots=1, tokens=PASS_CONTEXT + max(PASS_ROWS) + 8, probes=probes)
    prompt = [(7 * i) % vocab for i in range(PASS_CONTEXT)]
    cache.acquire(prompt)
    forward.prefill(cache, 0, prompt, 0)
    ms = {rows: _median_ms(lambda rows=rows: forward.choices(
        cache, [(0, PASS_CONTEXT, VerifyTree.chain(11, [13] * (rows - 1)))]), repeat) for rows in PASS_ROWS}
    return {"ms_per_pass": ms, "pass_32_over_step": round(ms[32] / ms[1], 3)}


def read_gbs(device: Any) -> float:
    """The rate this device reads memory in bulk, GB/s (median of a few): on a GPU a
    device copy (bytes read plus written), on a CPU torch's sum over 256 MiB on every
    thread (the C kernels' prefetching loads can beat it: a step's own rate is reported
    beside it)."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)

        def copy() -> None:
            dst.copy_(src)
            torch.cuda.synchronize(device)

        return round(2 * src.nbytes / (_median_ms(copy, 5) / 1e3) / 1e9, 1)
    tensor = torch.ones(1 << 26, dtype=torch.float32)
    return round(tensor.nbytes / (_median_ms(tensor.sum, 5) / 1e3) / 1e9, 1)


def step_bytes(loaded: Any) -> int:
    """The weights' bytes a plain step reads: every weight once, but of the input
    embeddings only a row, unless lm_head is the same tensor (tied: read whole)."""
    config, model = loaded.forward.config, loaded.model
    tied = model is not None and \
        model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    embedding = 0 if tied else int(config.vocab_size) * int(config.hidden_size)
    return (loaded.parameters - embedding) * ELEMENT_BYTES.get(loaded.info()["dtype"], 2)


def plain_floor(loaded: Any, step_ms: float) -> dict[str, Any]:
    """A plain step against its floor: the weights it reads at the measured read rate."""
    read = step_bytes(loaded)
    bandwidth = read_gbs(loaded.forward.device)
    floor_ms = read / (bandwidth * 1e9) * 1e3
    return {"weights_mb": round(read / 2**20, 1), "read_gbs": bandwidth, "floor_ms": round(floor_ms, 3),
            "step_ms": step_ms, "step_over_floor": round(step_ms / floor_ms, 2) if floor_ms else None,
            "step_read_gbs": round(read / (step_ms / 1e3) / 1e9, 1)}


def run_checks(loaded: Any, settings: Any, *, bench: bool = False,
               say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Every stage in turn (module docstring); `say` hears each stage's one-line result."""
    report: dict[str, Any] = {"model": loaded.name, "backend": loaded.backend, "device": str(loaded.forward.device),
                              "dtype": loaded.info()["dtype"]}
    probes = loaded.forward.probe(None)  # measured now: part of what is checked
    report["row_block"], report["padded_rows"] = probes
    rows = report["rows"] = row_checks(loaded, settings, probes=probes)
    say(f"rows: {rows['rows_checked'] - rows['rows_differing']} of {rows['rows_checked']} tree-pass rows equal "
        f"their decode steps bit for bit")
    passes = report["passes"] = pass_costs(loaded, settings, probes=probes)
    say("passes: " + ", ".join(f"{n} rows {ms} ms" for n, ms in passes["ms_per_pass"].items())
        + f" (32 rows: {passes['pass_32_over_step']}x a step)")
    plain = report["plain"] = plain_floor(loaded, passes["ms_per_pass"][1])
    say(f"plain: a step {plain['step_ms']} ms reads the weights' {plain['weights_mb']} MiB at "
        f"{plain['step_read_gbs']} GB/s; a bulk read runs at {plain['read_gbs']} GB/s ({plain['floor_ms']} ms: "
        f"the step takes {plain['step_over_floor']}x that)")
    ok = rows["ok"]
    if bench:
        from codespec.bench.batch_bench import verify_results

        results = verify_results(loaded, settings, ("edit", "fim-repo"), (1, 4), count=4, new_tokens=64)
        report["bench"] = [r.to_json() for r in results]
        same = all(r.identical for r in results)
        say(f"bench: {len(results)} runs (edit, fim-repo; every draft policy at batch 1 and 4), "
            f"{'every output identical to plain decoding' if same else 'SOME OUTPUTS DIFFER from plain decoding'}")
        ok = ok and same
    report["ok"] = ok
    return report
