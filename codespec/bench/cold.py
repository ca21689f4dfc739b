"""`codespec bench cold`: what a user pays per `codespec generate`, a fresh process each.

Warm benchmarks run every request in one process and hide what a CLI user pays every
time: interpreter and library imports, the model load, engine start-up. Here every
request of the held-out set (bench/heldout.py: stdlib FIM and edit requests no other
benchmark or test uses) runs in its own process under each system, interleaved:

    plain              codespec generate --no-spec
    hf_prompt_lookup   this module's worker: the same model loaded the same way
                       (load_transformers), transformers' generate with prompt lookup (10 tokens)
    codespec           codespec generate with default settings; FIM requests also get
                       --index FILE, the index of their package (the target file excluded)
    codespec-prediction  codespec generate --prediction FILE: requests that carry the
                       output their client expects (`codespec bench apply`, bench/apply.py)
    llamacpp-simple,   llama.cpp's llama-server with n-gram lookup (bench/llamacpp.py), a warm
    -mod, -map-k       server: its time is the request's alone (prompt not cached), with no
                       process start to pay

Each process is timed from spawn to exit by this one; each child reports its model load
(`load_transformers`) and its age at the first token. "Net" is wall minus model load: what
speculation can change. Cold start is spawn to first token.

    results = run_cold(settings, requests, systems, repeat=1, on_run=print)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from codespec.bench.llamacpp import LOOKUP_SYSTEMS

COLD_SYSTEMS = ("plain", "hf_prompt_lookup", "codespec")
APPLY_SYSTEMS = ("plain", "hf_prompt_lookup", "codespec", "codespec-prediction", *LOOKUP_SYSTEMS)
NEW_TOKENS = {"fim": 128, "edit": 320}  # as the workloads suite: a completion, a whole function
SETTING_FLAGS = ("model", "dtype", "device", "threads", "cache_dir")  # passed on to every child


@dataclass
class ColdRun:
    """One request under one system in one fresh process."""

    request: str
    kind: str
    system: str
    token_ids: list[int]
    wall_s: float  # spawn to exit, measured by the parent
    model_load_s: float
    first_token_s: float  # the child's age at its first token
    passes: int = 0
    accepted_tokens_per_pass: float = 0.0

    @property
    def net_s(self) -> float:
        return self.wall_s - self.model_load_s


@dataclass
class ColdResult:
    """Every request's runs, by system (several when repeated)."""

    runs: dict[tuple[str, str], list[ColdRun]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)

    def add(self, run: ColdRun) -> None:
        self.runs.setdefault((run.request, run.system), []).append(run)
        self.kinds[run.request] = run.kind

    def median(self, request: str, system: str, what: str) -> float:
        return statistics.median(getattr(r, what) for r in self.runs[(request, system)])

    def identical(self, request: str, system: str) -> bool:
        reference = self.runs[(request, "plain")][0].token_ids
        return all(r.token_ids == reference for r in self.runs[(request, system)])


def worker_command(system: str, prompt: Path, new_tokens: int, index: Path | None, flags: list[str],
                   prediction: Path | None = None) -> list[str]:
    new = str(new_tokens)
    if system == "hf_prompt_lookup":
        return [sys.executable, "-m", "codespec.bench.cold", str(prompt), new, *flags]
    command = [sys.executable, "-m", "codespec", "generate", "--json", "--max-new-tokens", new, *flags]
    if system == "plain":
        command.append("--no-spec")
    elif index is not None:
        command += ["--index", str(index)]
    if system == "codespec-prediction" and prediction is not None:
        command += ["--prediction", str(prediction)]
    return command + [str(prompt)]


def new_tokens(request: Any) -> int:
    """A request's token limit: its own (agent requests), else its kind's."""
    return getattr(request, "max_new_tokens", None) or NEW_TOKENS[request.kind]


def run_process(command: list[str]) -> tuple[dict[str, Any], float]:
    began = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"{' '.join(command[:6])} ... failed ({proc.returncode}): {tail[0]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def run_cold(settings: Any, tokenizer: Any, requests: Sequence[Any], systems: Sequence[str], repeat: int,
             on_run: Callable[[ColdRun], None]) -> ColdResult:
    """Run every request under every system in fresh processes: per round, per request,
    the systems one after another (so load drifts hit them alike)."""
    from codespec.index import SuffixIndex
    from codespec.indexing import tokenizer_fingerprint
    from codespec.prompts import encode_texts

    flags = setting_flags(settings)
    result = ColdResult()
    servers = [s for s in systems if s in LOOKUP_SYSTEMS]
    processes = ["plain", *[s for s in systems if s not in servers and s != "plain"]]
    with tempfile.TemporaryDirectory(prefix="codespec-cold-") as tmp:
        work = Path(tmp)
        prompts, indexes, built, predictions = {}, {}, {}, {}
        for i, request in enumerate(requests):
            prompts[request.name] = work / f"prompt{i}.txt"
            # every system tokenizes this same text (special tokens recognised) to the same ids
            prompts[request.name].write_text(tokenizer.decode(list(request.prompt_ids)), encoding="utf-8")
            if getattr(request, "prediction", None):
                predictions[request.name] = work / f"prediction{i}.txt"
                predictions[request.name].write_text(request.prediction, encoding="utf-8")
            if request.repository:
                key = tuple(sorted(request.repository))
                if key not in built:
                    built[key] = work / f"index{len(built)}.idx"
                    tokens = dict(zip(key, encode_texts(tokenizer, [request.repository[p] for p in key])))
                    SuffixIndex.build(tokens, tokenizer=tokenizer_fingerprint(tokenizer)).save(built[key])
                indexes[request.name] = built[key]
        # untimed: pages the weights in and stores the machine profile when there is none
        run_process(worker_command("codespec", prompts[requests[0].name], 16, None, flags))
        for _ in range(repeat):
            for request in requests:
                for system in processes:
                    if system == "codespec-prediction" and request.name not in predictions:
                        continue
                    out, wall = run_process(worker_command(system, prompts[request.name], new_tokens(request),
                                                           indexes.get(request.name), flags,
                                                           predictions.get(request.name)))
                    stats = out.get("stats", {})
                    run = ColdRun(request.name, request.kind, system, out["token_ids"], wall,
                                  out["startup"]["model_load_s"], out["startup"]["first_token_s"],
                                  stats.get("verify_passes", 0), stats.get("accepted_tokens_per_pass", 0.0))
                    result.add(run)
                    on_run(run)
    for system in servers:
        for run in _served(system, tokenizer, requests, repeat, settings):
            result.add(run)
            on_run(run)
    return result


def _served(system: str, tokenizer: Any, requests: Sequence[Any], repeat: int, settings: Any) -> list[ColdRun]:
    """Every request through one warm llama-server: each request's own time, its prompt
    computed afresh (no prompt cache), as a fresh process computes it."""
    from codespec.bench.llamacpp import LlamaServer
    from codespec.prompts import special_id

    eos = {i for i in (tokenizer.eos_token_id, special_id(tokenizer, "<|endoftext|>"),
                       special_id(tokenizer, "<|im_end|>")) if i is not None}
    runs = []
    with LlamaServer(system, threads=settings.threads or os.cpu_count() or 1) as server:
        server.complete(requests[0].prompt_ids, 4, eos, cache_prompt=False)  # untimed: pages the weights in
        for _ in range(repeat):
            for request in requests:
                out = server.complete(request.prompt_ids, new_tokens(request), eos, cache_prompt=False)
                passes = max(1, len(out.token_ids) - out.accepted_draft_tokens)
                runs.append(ColdRun(request.name, request.kind, system, out.token_ids, out.wall_s, 0.0,
                                    out.ttft_s or 0.0, passes, len(out.token_ids) / passes))
    return runs


def setting_flags(settings: Any) -> list[str]:
    flags = []
    for name in SETTING_FLAGS:
        flags += [f"--{name.replace('_', '-')}", str(getattr(settings, name))]
    return flags


def summary(result: ColdResult, systems: Sequence[str]) -> dict[str, Any]:
    requests = list(result.kinds)
    out: dict[str, Any] = {"requests": {}}
    for name in requests:
        row = {"kind": result.kinds[name]}
        for system in systems:
            if (name, system) not in result.runs:
                continue
            row[system] = {what: round(result.median(name, system, what), 3)
                           for what in ("wall_s", "model_load_s", "net_s", "first_token_s")}
            row[system]["identical"] = result.identical(name, system)
            row[system]["tokens"] = len(result.runs[(name, system)][0].token_ids)
            row[system]["accepted_tokens_per_pass"] = result.runs[(name, system)][0].accepted_tokens_per_pass
        out["requests"][name] = row
    for system in systems:
        ran = [n for n in requests if (n, system) in result.runs]
        if not ran:
            continue
        out[system] = {
            "cold_start_to_first_token_s": round(statistics.median(
                result.median(n, system, "first_token_s") for n in ran), 3),
            "median_model_load_s": round(statistics.median(result.median(n, system, "model_load_s") for n in ran), 3),
        }
        for kind in sorted(set(result.kinds.values())):
            names = [n for n in ran if result.kinds[n] == kind]
            if names:
                out[system][f"{kind}_net_s"] = round(sum(result.median(n, system, "net_s") for n in names), 3)
    return out


def _net(result: ColdResult, system: str, names: Sequence[str]) -> float:
    return sum(result.median(n, system, "net_s") for n in names)


def checks(result: ColdResult, systems: Sequence[str]) -> dict[str, bool]:
    found: dict[str, bool] = {}
    names = list(result.kinds)
    if "codespec" in systems:
        found["codespec identical to plain on every request"] = all(result.identical(n, "codespec") for n in names)
        found["codespec net time <= plain on every request"] = all(
            result.median(n, "codespec", "net_s") <= result.median(n, "plain", "net_s") for n in names)
        edits = [n for n in names if result.kinds[n] == "edit"]
        if "hf_prompt_lookup" in systems and edits:
            found["codespec >= 1.5x hf_prompt_lookup on edit (net time)"] = \
                _net(result, "hf_prompt_lookup", edits) >= 1.5 * _net(result, "codespec", edits)
    applies = [n for n in names if result.kinds[n] == "apply"]
    if "codespec-prediction" in systems and applies:
        ours = _net(result, "codespec-prediction", applies)
        found["codespec-prediction identical to plain on every request"] = all(
            result.identical(n, "codespec-prediction") for n in names if (n, "codespec-prediction") in result.runs)
        found["codespec-prediction >= 4x plain on apply (net time)"] = _net(result, "plain", applies) >= 4 * ours
        if "hf_prompt_lookup" in systems:
            found["codespec-prediction >= 2x hf_prompt_lookup on apply (net time)"] = \
                _net(result, "hf_prompt_lookup", applies) >= 2 * ours
    return found


def format_table(result: ColdResult, systems: Sequence[str]) -> str:
    """One row per request: each system's net time, codespec's (with its prediction where
    it ran) against plain and HF prompt lookup, its tokens per pass, and whether every
    codespec output equals plain's (HF's and llama.cpp's numerics differ: not compared)."""
    ours = "codespec-prediction" if "codespec-prediction" in systems else "codespec"
    head = ["request", "tokens", *[f"{s} net s" for s in systems], f"{ours}/plain", f"{ours} vs hf",
            "tok/pass", "identical"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in result.kinds:
        net = {s: result.median(name, s, "net_s") for s in systems if (name, s) in result.runs}
        mine = ours if ours in net else "codespec"
        spec = mine in net
        compared = [s for s in net if s.startswith("codespec")]
        lines.append("| " + " | ".join([
            name,
            str(len(result.runs[(name, "plain")][0].token_ids)),
            *[f"{net[s]:.2f}" if s in net else "" for s in systems],
            f"{net['plain'] / net[mine]:.2f}x" if spec else "",
            f"{net['hf_prompt_lookup'] / net[mine]:.2f}x" if spec and "hf_prompt_lookup" in net else "",
            f"{result.runs[(name, mine)][0].accepted_tokens_per_pass:.2f}" if spec else "",
            "yes" if all(result.identical(name, s) for s in compared) else "NO",
        ]) + " |")
    return "\n".join(lines)


def _worker(argv: Sequence[str]) -> int:
    """`python -m codespec.bench.cold PROMPT_FILE MAX_NEW_TOKENS [--model ...]`: Hugging
    Face prompt lookup in a fresh process, reporting as `codespec generate --json` does."""
    import argparse

    from codespec.engine.stats import process_age, startup_report
    from codespec.prompts import read_prompt
    from codespec.settings import Settings

    parser = argparse.ArgumentParser(prog="python -m codespec.bench.cold")
    parser.add_argument("prompt")
    parser.add_argument("max_new_tokens", type=int)
    for name in SETTING_FLAGS:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name)
    args = parser.parse_args(argv)
    from codespec.bench.peers import hf_prompt_lookup
    from codespec.forward.base import eos_ids
    from codespec.models.loading import load_transformers, resolve_model_path
    from codespec.prompts import encode_prompt

    imported = process_age()
    settings = Settings(**{n: getattr(args, n) for n in SETTING_FLAGS if getattr(args, n) is not None})
    loading = process_age()
    model, tokenizer, _ = load_transformers(settings, *resolve_model_path(settings.model, settings, progress=False))
    loaded_at = process_age()
    ids = encode_prompt(tokenizer, read_prompt(args.prompt))
    started = process_age()
    out = hf_prompt_lookup(model, ids, args.max_new_tokens, eos_ids(model.generation_config, tokenizer))
    print(json.dumps({"token_ids": out.token_ids, "stats": {"generated_tokens": len(out.token_ids),
                                                            "wall_s": round(out.wall_s, 4)},
                      "startup": startup_report(imported, loading, loaded_at, started, out.ttft_s or out.wall_s)}))
    return 0


if __name__ == "__main__":
    status = _worker(sys.argv[1:])
    sys.stdout.flush()
    os._exit(status)  # the exit `codespec generate` takes (cli/main.py: run), so both skip the teardown
