"""`codespec bench index`: the suffix index at 10 k .. 10 M tokens of real code.

Corpus: `.py` files of the standard library and of the installed packages, tokenized
with the model's tokenizer, in a fixed shuffled order; every 40th file is held out.
For each size: build throughput, bytes per token, load time (with checksum), draft
latency (median, p99) for 32-token drafts on held-out contexts, dynamic-index append
throughput, and draft quality: replaying held-out files, a draft token counts as
accepted while it equals the file's next token (no model involved).
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from codespec.index import DynamicIndex, StaticIndex, SuffixIndex
from codespec.indexing import tokenizer_fingerprint
from codespec.prompts import encode_texts
from codespec.indexing.walk import read_text, walk_repository

SIZES = (10_000, 100_000, 1_000_000, 10_000_000)
HELD_OUT_EVERY = 40
CONTEXT_TOKENS = 32
DRAFT_TOKENS = 32
QUERIES = 2000
WARMUP = 50


@dataclass
class Corpus:
    files: list[np.ndarray]  # indexed, in order
    held_out: list[np.ndarray]


def code_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = [Path(paths["stdlib"]), Path(paths["purelib"])]
    return [r for r in dict.fromkeys(roots) if r.is_dir()]


def load_corpus(tokenizer: Any, cache_dir: Path, need: int, log: Callable[[str], None]) -> Corpus:
    """Tokenized `.py` files, cached per tokenizer and file list in `cache_dir/bench`."""
    files = sorted({f.absolute for root in code_roots() for f in walk_repository(root) if f.path.endswith(".py")})
    rng = np.random.default_rng(0)
    order = [files[i] for i in rng.permutation(len(files))]
    key = hashlib.sha256((tokenizer_fingerprint(tokenizer) + str(need) + "\n".join(map(str, order))).encode())
    cache = Path(cache_dir) / "bench" / f"corpus-{key.hexdigest()[:16]}.npz"
    if cache.is_file():
        data = np.load(cache)
        bounds, held = data["bounds"], data["held"]
        arrays = np.split(data["tokens"], bounds[1:-1]) if len(bounds) > 2 else [data["tokens"]]
        return Corpus([a for a, h in zip(arrays, held) if not h], [a for a, h in zip(arrays, held) if h])
    log(f"tokenizing real code from {', '.join(map(str, code_roots()))} (cached for later runs) ...")
    indexed: list[np.ndarray] = []
    held_out: list[np.ndarray] = []
    total = 0
    for i in range(0, len(order), 64):
        batch = order[i : i + 64]
        texts = [read_text(p)[0] for p in batch]
        for j, ids in enumerate(encode_texts(tokenizer, texts)):
            arr = np.asarray(ids, dtype=np.int32)
            if (i + j) % HELD_OUT_EVERY == 0:
                held_out.append(arr)
            else:
                indexed.append(arr)
                total += arr.size
        if total >= need:
            break
    all_arrays = indexed + held_out
    held = np.array([False] * len(indexed) + [True] * len(held_out))
    bounds = np.cumsum([0] + [a.size for a in all_arrays])
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache.parent, suffix=".npz", delete=False) as tmp:
        np.savez(tmp, tokens=np.concatenate(all_arrays), bounds=bounds, held=held)
    Path(tmp.name).replace(cache)
    return Corpus(indexed, held_out)


def take(files: list[np.ndarray], size: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    total = 0
    for i, f in enumerate(files):
        if total >= size:
            break
        part = f[: size - total]
        out[f"f{i}.py"] = part
        total += part.size
    return out


def queries(held_out: list[np.ndarray], count: int, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """(context, truth): 32 tokens before a random held-out position and 32 after."""
    rng = np.random.default_rng(seed)
    usable = [f for f in held_out if f.size > CONTEXT_TOKENS + DRAFT_TOKENS]
    out = []
    for _ in range(count):
        f = usable[int(rng.integers(len(usable)))]
        p = int(rng.integers(CONTEXT_TOKENS, f.size - DRAFT_TOKENS))
        out.append((f[p - CONTEXT_TOKENS : p], f[p : p + DRAFT_TOKENS]))
    return out


def accepted_length(draft_ids: tuple[int, ...], truth: np.ndarray) -> int:
    n = 0
    for a, b in zip(draft_ids, truth.tolist()):
        if a != b:
            break
        n += 1
    return n


def measure_size(corpus: Corpus, size: int, qs: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    files = take(corpus.files, size)
    tokens = sum(f.size for f in files.values())
    started = time.perf_counter()
    static = StaticIndex.build(files)
    build_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.csidx"
        file_bytes = static.save(path)
        started = time.perf_counter()
        index = SuffixIndex.load(path)
        load_s = time.perf_counter() - started
        for context, _ in qs[:WARMUP]:
            index.draft(context, DRAFT_TOKENS)
        latencies = np.empty(len(qs))
        accepted = np.empty(len(qs))
        for i, (context, truth) in enumerate(qs):
            t0 = time.perf_counter_ns()
            draft = index.draft(context, DRAFT_TOKENS)
            latencies[i] = (time.perf_counter_ns() - t0) / 1000
            accepted[i] = accepted_length(draft.token_ids, truth)
        del index
    append_tps = measure_appends(files, tokens)
    return {
        "tokens": tokens,
        "build_tokens_per_s": round(tokens / build_s),
        "bytes_per_token": round(static.nbytes() / tokens, 2),
        "file_bytes": file_bytes,
        "load_s": round(load_s, 4),
        "draft_p50_us": round(float(np.percentile(latencies, 50)), 1),
        "draft_p99_us": round(float(np.percentile(latencies, 99)), 1),
        "accepted_per_draft": round(float(accepted.mean()), 3),
        "dynamic_append_tokens_per_s": round(append_tps),
    }


def measure_appends(files: dict[str, np.ndarray], tokens: int) -> float:
    """Documents appended to a dynamic index sized to hold them, merges included."""
    dynamic = DynamicIndex(budget_tokens=max(tokens, 1))
    started = time.perf_counter()
    for key, doc in files.items():
        dynamic.add(key, doc)
    return tokens / (time.perf_counter() - started)


def run_index_bench(tokenizer: Any, cache_dir: Path, sizes: tuple[int, ...], log: Callable[[str], None]) -> list[dict]:
    need = max(sizes)
    corpus = load_corpus(tokenizer, cache_dir, need + need // (HELD_OUT_EVERY - 1) + 1, log)
    available = sum(f.size for f in corpus.files)
    qs = queries(corpus.held_out, QUERIES)
    results = []
    for size in sizes:
        if size > available:
            log(f"skipping {size:,} tokens: only {available:,} tokens of code found")
            continue
        log(f"measuring {size:,} tokens ...")
        results.append(measure_size(corpus, size, qs))
    return results


def format_index_table(results: list[dict]) -> str:
    header = (f"{'tokens':>11}{'build tok/s':>13}{'B/token':>9}{'load s':>8}{'p50 us':>8}{'p99 us':>8}"
              f"{'acc/draft':>10}{'append tok/s':>14}")
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r['tokens']:>11,}{r['build_tokens_per_s']:>13,}{r['bytes_per_token']:>9.2f}{r['load_s']:>8.3f}"
            f"{r['draft_p50_us']:>8.1f}{r['draft_p99_us']:>8.1f}{r['accepted_per_draft']:>10.3f}"
            f"{r['dynamic_append_tokens_per_s']:>14,}"
        )
    return "\n".join(lines)


def stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
