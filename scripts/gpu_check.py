"""The whole GPU verification of the `cuda` backend in one run (scripts/gpu-check.sh).

The GPU machine has no network and takes 64 MiB of files per call, so the default
model's weights (1 GB in bf16) cannot travel: the model here is the default model's
architecture and shapes (its config.json, carried) with seeded random weights in bf16,
and its real tokenizer (carried). Stages, each timed and each allowed to fail alone:

1. kernel: kernels/row_attention.py's Triton kernel against its reference on CUDA, and a
   row's bits alone / in a 64-row pass / with its keys scattered along a tree path;
2. rows: on the model, every row of 64-row tree passes equals its one-row decode step,
   bit for bit (logits), at contexts 100..1900;
3. costs: the pass-cost curve (median ms per pass by rows, at 512 and 2048 keys), a
   one-row step against the weights' bytes over the measured HBM copy bandwidth;
4. stress: tests/test_lossless_stress.py (every held-out request, alone and in batches of
   4 and 8, every draft policy) on this model;
5. verify: `codespec bench verify` (draft policies at batch 1 and 8, outputs compared
   with plain decoding);
6. edit: `codespec bench workloads --workloads edit` (plain, transformers' prompt
   lookup, codespec), and the same edit requests sent twice, so that codespec's index
   holds the first answer (a random model copies nothing from its prompt: acceptance
   comes from past generations, as the issue asks).

Probes: `profile` (kernels and GPU time of a step) and `fused` (the backend with fused
layers, CODESPEC_CUDA_FUSED: its rows, costs and profile), both in the default stages;
`gemm` (the layer's products in CUDA graphs: cuBLAS against kernels/row_linear.py's
tiles) and `tiles` (the backend with the tiles that beat cuBLAS), on request.

Writes <out>/gpu-check.json and prints a summary table last.

    python scripts/gpu_check.py --assets .gpu --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
ASSET_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def stage(results: dict[str, Any], name: str, run: Callable[[], Any], out: Path | None = None) -> None:
    began = time.perf_counter()
    try:
        results[name] = {"ok": True, **(run() or {})}
    except Exception as error:  # one stage's failure must not hide the others' results
        results[name] = {"ok": False, "error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-3000:]}
    results[name]["seconds"] = round(time.perf_counter() - began, 1)
    print(f"[gpu-check] {name}: {'ok' if results[name]['ok'] else 'FAILED ' + results[name]['error']} "
          f"({results[name]['seconds']} s)", flush=True)
    if out is not None:  # after every stage: a run cut short keeps what it measured
        (out / "gpu-check.json").write_text(json.dumps(results, indent=1, default=str))


def random_model_dir(assets: Path, where: Path) -> Path:
    """The default model's config and tokenizer with seeded random bf16 weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    where.mkdir(parents=True, exist_ok=True)
    for name in ASSET_FILES:
        shutil.copy(assets / name, where / name)
    config = AutoConfig.from_pretrained(where)
    config.dtype = "bfloat16"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(where)
    return where


def load(model_dir: Path) -> Any:
    from codespec import forward
    from codespec.settings import Settings

    return forward.load(Settings(model=str(model_dir), device="cuda", dtype="bfloat16"), progress=False,
                        transformers=True)


def hbm_copy_gbs() -> float:
    """Device-to-device copy bandwidth, bytes read plus written."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (_time(lambda: dst.copy_(src), repeat=10) / 1e3) / 1e9


def kernel_checks() -> dict[str, Any]:
    from codespec.kernels.row_attention import row_attention, row_attention_ref

    torch.manual_seed(1)
    keys, values = (torch.randn(4, 2, 2304, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    rows = 64
    query = torch.randn(rows, 14, 64, device="cuda", dtype=torch.bfloat16)
    context = torch.randint(1, 2000, (rows,), device="cuda")
    path = torch.stack([torch.sort(torch.randperm(200, device="cuda")[:8] + 2050).values for _ in range(rows)])
    path_len = torch.randint(0, 9, (rows,), device="cuda")
    slots = torch.randint(0, 4, (rows,), device="cuda")
    meta = dict(slots=slots, context=context, path=path.contiguous(), path_len=path_len)
    got = row_attention(query, keys, values, **meta, scale=0.125)
    ref = row_attention_ref(query, keys, values, slots, context, path, path_len, 0.125)
    relative = float((got.float() - ref.float()).norm() / ref.float().norm())
    alone_equal = all(torch.equal(got[r], row_attention(query[r:r + 1], keys, values, slots=slots[r:r + 1],
                                                        context=context[r:r + 1], path=path[r:r + 1].contiguous(),
                                                        path_len=path_len[r:r + 1], scale=0.125)[0])
                      for r in range(0, rows, 7))
    # scattered path keys against the same keys laid out contiguously in another slot
    r = int(torch.argmax(path_len))
    n, tail = int(context[r]), path[r, : int(path_len[r])]
    for store in (keys, values):
        store[(int(slots[r]) + 1) % 4, :, :n] = store[int(slots[r]), :, :n]
        store[(int(slots[r]) + 1) % 4, :, n:n + len(tail)] = store[int(slots[r]), :, tail]
    got = row_attention(query, keys, values, **meta, scale=0.125)  # keys changed in other slots only
    contiguous = row_attention(query[r:r + 1], keys, values, slots=((slots[r:r + 1] + 1) % 4),
                               context=context[r:r + 1] + len(tail), path=path[r:r + 1].contiguous(),
                               path_len=torch.zeros_like(path_len[r:r + 1]), scale=0.125)
    times = _time(lambda: row_attention(query, keys, values, **meta, scale=0.125))
    return {"relative_error_vs_reference": relative, "row_alone_equal": alone_equal,
            "scattered_equals_contiguous": bool(torch.equal(got[r], contiguous[0])),
            "ms_64_rows_one_layer": times, **rope_store_checks(), "attention_us_by_key_block": key_block_probe()}


def rope_store_checks() -> dict[str, bool]:
    """kernels/rope_store.py on CUDA: q, K and V with the bits of transformers' eager
    arithmetic (the interpreter cannot check bf16 bits: it rounds toward zero)."""
    from codespec.kernels.rope_store import rope_store

    torch.manual_seed(5)
    rows, heads, kv_heads, dim = 64, 14, 2, 64
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, device="cuda", dtype=torch.bfloat16)
    angle = torch.randn(rows, dim, device="cuda")
    cos, sin = angle.cos().to(torch.bfloat16), angle.sin().to(torch.bfloat16)
    source = torch.where(torch.arange(rows, device="cuda") < 40, torch.arange(rows, device="cuda"), 0)
    slots = torch.randint(0, 2, (rows,), device="cuda")
    slots[40:] = slots[0]
    where = torch.randperm(300, device="cuda")[:rows]
    where[40:] = where[0]
    stores = [torch.zeros(2, kv_heads, 300, dim, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    results = [rope_store(qkv, cos, sin, source, slots, where, stores[2 * i], stores[2 * i + 1], heads=heads,
                          kv_heads=kv_heads, force_triton=triton) for i, triton in enumerate((True, False))]
    differ = lambda a, b: int((a != b).sum())  # noqa: E731
    return {"rope_store_q_differing": differ(*results), "rope_store_q_elements": results[0].numel(),
            "rope_store_k_differing": differ(stores[0], stores[2]), "rope_store_v_differing": differ(stores[1], stores[3]),
            "rope_store_q_max_difference": float((results[0].float() - results[1].float()).abs().max())}


def key_block_probe() -> dict[str, Any]:
    """Device us per call of row_attention for one real row among 64 (a decode step), in
    CUDA graphs, by KEY_BLOCK: whether smaller blocks (more programs at once) pay."""
    from codespec.kernels import row_attention as module

    torch.manual_seed(6)
    keys, values = (torch.randn(1, 2, 4096, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    query = torch.randn(64, 14, 64, device="cuda", dtype=torch.bfloat16)
    zeros = torch.zeros(64, dtype=torch.int64, device="cuda")
    path = torch.zeros(64, 64, dtype=torch.int64, device="cuda")
    result: dict[str, Any] = {}
    default = module.KEY_BLOCK
    try:
        for block in (64, 128):
            module.KEY_BLOCK = block
            for keys_in_row in (512, 2048):
                context = zeros.clone()
                context[0] = keys_in_row
                result[f"{block}/{keys_in_row}"] = _graph_us(lambda c=context: module.row_attention(
                    query, keys, values, slots=zeros, context=c, path=path, path_len=zeros, scale=0.125))
    finally:
        module.KEY_BLOCK = default
    return result


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


def _engine(loaded: Any, slots: int = 2):
    from codespec.engine import Engine

    return Engine(loaded.forward, loaded.tokenizer, eos_token_ids=[], slots=slots)


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
        # a random tree of 64 nodes (parents before children)
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, 64)]
        depths = [0]
        for parent in parents[1:]:
            depths.append(depths[parent] + 1)
        tokens = torch.randint(0, vocab, (64,), generator=generator).tolist()
        tree = VerifyTree(tuple(tokens), tuple(parents), tuple(depths), tuple(range(63)))
        tree_logits = forward.logits(cache, [(0, context, tree)])
        for node in range(0, 64, 5):  # node's path, decoded token by token in slot 1
            path = tree.path(node)
            for step, at in enumerate(path):
                logits = forward.logits(cache, [(1, context + step, VerifyTree.chain(tokens[at]))])
            checked += 1
            differing += int(not torch.equal(tree_logits[node], logits[0]))
    return {"rows_checked": checked, "rows_differing": differing}


def cost_curve(loaded: Any) -> dict[str, Any]:
    """Median ms per verify pass by rows (chains), and the plain step against bandwidth."""
    from codespec.policy.tree import VerifyTree

    forward = loaded.forward
    engine = _engine(loaded, slots=1)
    cache = engine.cache
    curve: dict[str, dict[int, float]] = {}
    for context in (512, 2048):
        prompt = [(7 * i) % forward.config.vocab_size for i in range(context)]
        cache.acquire(prompt)
        forward.prefill(cache, 0, prompt, 0)
        cache.release(0)
        points = {}
        for rows in (1, 2, 4, 8, 16, 32, 48, 64, 65, 96, 128, 192):
            tree = VerifyTree.chain(11, [13] * (rows - 1))
            points[rows] = _wall_ms(lambda: forward.choices(cache, [(0, context, tree)]))
        curve[str(context)] = points
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in loaded.model.parameters()}.values())
    embed = loaded.model.get_input_embeddings().weight
    read = weights - embed.numel() * embed.element_size()  # a step gathers a row of the embeddings, reads the rest
    bandwidth = hbm_copy_gbs()
    floor_ms = read / (bandwidth * 1e9) * 1e3
    step = curve["512"][1]
    return {"ms_per_pass": curve, "ratio_32_rows_to_1": round(curve["512"][32] / step, 3),
            "ratio_32_rows_to_1_at_2048": round(curve["2048"][32] / curve["2048"][1], 3),
            "weights_read_per_step_mb": round(read / 2**20, 1), "hbm_copy_gbs": round(bandwidth, 1),
            "floor_ms": round(floor_ms, 4), "step_over_floor": round(step / floor_ms, 2)}


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


def _products(model: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    from codespec.forward.cuda import _LayerWeights

    w = _LayerWeights.of(model.model.layers[0])
    return {"qkv": (w.qkv, w.qkv_bias), "o": (w.o, w.o_bias), "down": (w.down, None), "gate_up": (w.gate_up, None),
            "lm_head": (model.lm_head.weight.detach(), None)}


@torch.inference_mode()
def gemm_probe(loaded: Any, budget_s: float = 75.0) -> dict[str, Any]:
    """The layer's products at the bucket's shape (64 rows), in CUDA graphs: cuBLAS
    (F.linear) against kernels/row_linear.py's tiles, and the fastest tile's row
    exactness and error on the device. Each product gets a share of `budget_s` for tiles."""
    import torch.nn.functional as F

    from codespec.kernels.row_linear import Config, row_linear

    result: dict[str, Any] = {}
    products = _products(loaded.model)
    for name, (weight, bias) in products.items():
        began = time.perf_counter()
        n_size, k_size = weight.shape
        x = torch.randn(64, k_size, device="cuda", dtype=weight.dtype)
        entry: dict[str, Any] = {"n": n_size, "k": k_size, "weight_mb": round(weight.numel() * 2 / 2**20, 2),
                                 "floor_us": round(weight.numel() * 2 / 2.98e12 * 1e6, 2),
                                 "cublas_us": _graph_us(lambda: F.linear(x, weight, bias))}
        tiles: dict[str, Any] = {}
        widths = (64, 128, 256) if name == "lm_head" else (16, 32, 64, 128)
        for block_n in widths:
            for block_k in (128, 64, 256):
                steps, programs = k_size // block_k, n_size // block_n
                if k_size % block_k or n_size % block_n:
                    continue
                for splits in (1, 2, 4, 8):
                    if splits > steps or (splits > 1 and programs * splits > 4 * 132) or (
                            splits > 1 and programs >= 264):
                        continue
                    if time.perf_counter() - began > budget_s / len(products):
                        break
                    config = Config(block_m=64, block_n=block_n, block_k=block_k, splits=splits,
                                    num_stages=3 if block_k * block_n >= 256 * 64 else 4)
                    key = f"{block_n}x{block_k}/{splits}"
                    try:
                        tiles[key] = _graph_us(lambda c=config: row_linear(x, weight, bias, config=c))
                    except Exception as error:  # a tile the device cannot run: say so, go on
                        tiles[key] = f"{type(error).__name__}: {str(error)[:100]}"
        entry["row_linear_us"] = tiles
        timed = {k: v for k, v in tiles.items() if isinstance(v, float)}
        if timed:
            best = min(timed, key=timed.get)
            block_n, rest = best.split("x")
            block_k, splits = rest.split("/")
            config = Config(block_m=64, block_n=int(block_n), block_k=int(block_k), splits=int(splits),
                            num_stages=3 if int(block_k) * int(block_n) >= 256 * 64 else 4)
            full = row_linear(x, weight, bias, config=config)
            others = torch.randn_like(x)
            others[3] = x[3]
            moved = torch.roll(others, 17, dims=0)
            reference = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
            entry.update(best=best, best_config=config.__dict__, best_over_cublas=round(timed[best] / entry["cublas_us"], 3),
                         best_row_exact=bool(torch.equal(row_linear(moved, weight, bias, config=config)[20], full[3])),
                         best_relative_error=float((full.float() - reference).norm() / reference.norm()))
        result[name] = entry
    return result


def tiles_probe(loaded: Any, gemm: dict[str, Any]) -> dict[str, Any]:
    """The whole backend with row_linear's fastest tiles where they beat cuBLAS by 5%:
    the step and passes at 512 keys (host wall ms) and its rows against its decode steps."""
    from codespec.forward.cuda import CudaForward
    from codespec.kernels.row_linear import Config
    from codespec.policy.tree import VerifyTree

    chosen = {name: Config(**entry["best_config"]) for name, entry in gemm.items()
              if isinstance(entry, dict) and entry.get("best_over_cublas", 9) < 0.95 and entry.get("best_row_exact")}
    if not chosen:
        return {"chosen": {}, "note": "no tile beat cuBLAS by 5%"}
    forward = CudaForward(loaded.model, tiles=chosen)
    engine = _engine(loaded, slots=1)
    cache = engine.cache
    prompt = [(7 * i) % forward.config.vocab_size for i in range(512)]
    cache.acquire(prompt)
    forward.prefill(cache, 0, prompt, 0)
    cache.release(0)
    ms = {n: _wall_ms(lambda n=n: forward.choices(cache, [(0, 512, VerifyTree.chain(11, [13] * (n - 1)))]))
          for n in (1, 2, 32, 64)}
    swapped = loaded.forward
    loaded.forward = forward
    try:
        rows = row_checks(loaded)
    finally:
        loaded.forward = swapped
    return {"chosen": {k: v.__dict__ for k, v in chosen.items()}, "ms_per_pass_512": ms, **rows}


def fused_probe(loaded: Any) -> dict[str, Any]:
    """The backend with fused layers (CODESPEC_CUDA_FUSED: every product through
    row_linear with the norm, SiLU and residual inside): its rows against its decode
    steps, the pass-cost curve and the step's kernels, beside the default backend's."""
    from codespec.forward.cuda import CudaForward

    forward = CudaForward(loaded.model, fused=True)
    default = loaded.forward
    loaded.forward = forward
    try:
        return {"tiles": {name: tile.__dict__ for name, tile in forward.tiles.items()}, **row_checks(loaded),
                **cost_curve(loaded), "profile": profile_step(loaded)}
    finally:
        loaded.forward = default


def subprocess_stage(command: list[str], env: dict[str, str], timeout: int, keep: Path | None = None) -> dict[str, Any]:
    began = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    result: dict[str, Any] = {"returncode": done.returncode, "tail": (done.stdout + done.stderr)[-4000:],
                              "wall_s": round(time.perf_counter() - began, 1)}
    if keep is not None and keep.is_dir():
        found = sorted(keep.glob("*.json"))
        result["json"] = {p.name: json.loads(p.read_text()) for p in found[:4]}
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {(done.stdout + done.stderr)[-1500:]}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", default=str(ROOT / ".gpu"), help="the default model's config and tokenizer files")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    parser.add_argument("--stages", default="kernel,rows,costs,profile,fused,stress,verify,edit")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = args.stages.split(",")
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "cuda": torch.version.cuda}
    import transformers
    import triton

    results.update(transformers=transformers.__version__, triton=triton.__version__)
    began = time.perf_counter()
    model_dir = random_model_dir(Path(args.assets), Path("/tmp/codespec-random-default"))
    loaded = load(model_dir)
    results["backend"] = {"name": loaded.backend, "reason": loaded.reason, "rows": getattr(loaded.forward, "rows", None),
                          "setup_s": round(time.perf_counter() - began, 1)}
    print(f"[gpu-check] {results['device']}: backend {loaded.backend} ({loaded.reason})", flush=True)
    if "kernel" in wanted:
        stage(results, "kernel", kernel_checks, out)
    if "rows" in wanted:
        stage(results, "rows", lambda: row_checks(loaded), out)
    if "costs" in wanted:
        stage(results, "costs", lambda: cost_curve(loaded), out)
    if "profile" in wanted:
        stage(results, "profile", lambda: profile_step(loaded), out)
    if "gemm" in wanted:
        stage(results, "gemm", lambda: gemm_probe(loaded), out)
    if "fused" in wanted:
        stage(results, "fused", lambda: fused_probe(loaded), out)
    if "tiles" in wanted and results.get("gemm", {}).get("ok"):
        stage(results, "tiles", lambda: tiles_probe(loaded, results["gemm"]), out)
    del loaded
    torch.cuda.empty_cache()
    env = {**os.environ, "CODESPEC_MODEL": str(model_dir), "CODESPEC_DEVICE": "cuda", "CODESPEC_DTYPE": "bfloat16",
           "CODESPEC_CACHE_DIR": "/tmp/codespec-cache", "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    bench = [sys.executable, "-m", "codespec", "bench"]
    model_args = ["--model", str(model_dir), "--device", "cuda", "--dtype", "bfloat16"]
    if "stress" in wanted:
        stage(results, "stress", lambda: subprocess_stage(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "slow or not slow",
             "-o", "addopts=", "tests/test_lossless_stress.py"], env, 200), out)
    if "verify" in wanted:
        stage(results, "verify", lambda: subprocess_stage(
            [*bench, "verify", "--sets", "edit,fim-repo", "--batches", "1,8", "--requests", "8", *model_args,
             "--out", "/tmp/verify"], env, 180, Path("/tmp/verify")), out)
    if "edit" in wanted:
        stage(results, "edit", lambda: subprocess_stage(
            [*bench, "workloads", "--workloads", "edit", "--systems", "hf_prompt_lookup,codespec", "--repeat", "1",
             "--max-new-tokens", "128", *model_args, "--out", "/tmp/edit"], env, 180, Path("/tmp/edit")), out)
    results["total_s"] = round(time.perf_counter() - began, 1)
    (out / "gpu-check.json").write_text(json.dumps(results, indent=1, default=str))
    summary = {name: {k: v for k, v in value.items() if k not in ("trace", "tail", "json")}
               for name, value in results.items() if isinstance(value, dict)}
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
