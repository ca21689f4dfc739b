"""`codespec bench load`: a real `codespec serve` under concurrent short requests.

The same mixed request list (FIM at a function body's start, a plain completion after a
`def` line, a chat request about a function; 24 new tokens each) over functions of
standard-library modules the model's prompts meet nowhere else, sent at concurrency 1, 4
and 8 to a fresh server each (so no level reuses another's cached prompts), with at most
8 requests generating at once. Reported per level: wall time, generated tokens per
second, requests per second, p50/p95 latency, throughput against concurrency 1, and
whether every output equals concurrency 1's (greedy: batching must not change a token).

    levels = run_load(requests(24), (1, 4, 8), log=print)
    print_table(levels, sys.stdout)
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

MODULES = ("colorsys", "statistics", "bisect", "textwrap", "fnmatch", "shlex")
NEW_TOKENS = 24
CONTEXT_LINES = 40  # short requests: the lines before the function (a few hundred tokens)


@dataclass(frozen=True)
class LoadRequest:
    name: str
    route: str
    body: dict[str, Any]


@dataclass
class Level:
    concurrency: int
    wall_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    tokens: int = 0
    prompt_tokens: int = 0  # read by the model (not served from the KV prefix cache)
    prefill_s: float = 0.0  # the requests' times to first token, summed
    outputs: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def to_json(self, base: Level | None = None) -> dict[str, Any]:
        tps = self.tokens / self.wall_s if self.wall_s else 0.0
        out = {"concurrency": self.concurrency, "requests": len(self.latencies_s), "failed": len(self.failures),
               "wall_s": round(self.wall_s, 2), "tokens": self.tokens, "tokens_per_s": round(tps, 2),
               "requests_per_s": round(len(self.latencies_s) / self.wall_s, 3) if self.wall_s else 0.0,
               "p50_s": round(statistics.median(self.latencies_s), 2) if self.latencies_s else None,
               "p95_s": round(_p95(self.latencies_s), 2) if self.latencies_s else None,
               "prompt_tokens": self.prompt_tokens, "prefill_s": round(self.prefill_s, 2),
               # one request at a time, the share of the wall spent before first tokens: what batching cannot share
               "prefill_share": round(self.prefill_s / self.wall_s, 2) if self.wall_s and self.concurrency == 1
               else None}
        if base is not None and base.wall_s and base.tokens:
            out["throughput_vs_1"] = round(tps / (base.tokens / base.wall_s), 2)
            out["outputs_equal_to_1"] = self.outputs == base.outputs
        return out


def summaries(levels: list[Level]) -> list[dict[str, Any]]:
    """Each level's figures, the later ones against the first (concurrency 1)."""
    return [level.to_json(None if level is levels[0] else levels[0]) for level in levels]


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def requests(count: int = 24, new_tokens: int = NEW_TOKENS) -> list[LoadRequest]:
    """`count` requests cycling FIM, completion and chat over the modules' functions."""
    functions = [(m, fn) for m in MODULES for fn in _functions(m)]
    picked = functions[:: max(1, len(functions) // count)][:count]
    out = []
    for i, (module, fn) in enumerate(picked):
        source = inspect.getsource(importlib.import_module(module))
        lines = source.splitlines(keepends=True)
        head = "".join(lines[max(0, fn.lineno - CONTEXT_LINES) : fn.body[0].lineno - 1])
        text = "".join(lines[fn.lineno - 1 : fn.end_lineno])
        kind = ("fim", "completion", "chat")[i % 3]
        if kind == "fim":
            body = {"prompt": head, "suffix": "".join(lines[fn.end_lineno :][:20]), "max_tokens": new_tokens}
            route = "/v1/completions"
        elif kind == "completion":
            body = {"prompt": "".join(lines[max(0, fn.lineno - CONTEXT_LINES) : fn.lineno]), "max_tokens": new_tokens}
            route = "/v1/completions"
        else:
            body = {"messages": [{"role": "user", "content": f"In one sentence, what does this do?\n\n{text[:1500]}"}],
                    "max_tokens": new_tokens}
            route = "/v1/chat/completions"
        out.append(LoadRequest(f"{module}.{fn.name}:{kind}", route, {**body, "temperature": 0}))
    return out


def _functions(module: str) -> list[ast.FunctionDef]:
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and len(n.body) >= 3]


def _level(url: str, reqs: list[LoadRequest], concurrency: int) -> Level:
    """Every request, `concurrency` in flight at once (a thread each, stdlib HTTP)."""
    level = Level(concurrency, latencies_s=[0.0] * len(reqs), outputs=[""] * len(reqs))
    counted = threading.Lock()

    def one(i: int, req: LoadRequest) -> None:
        began = time.perf_counter()
        call = urllib.request.Request(url + req.route, data=json.dumps(req.body).encode(), method="POST",
                                      headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(call, timeout=600) as r:
                answer = json.loads(r.read())
        except (OSError, ValueError) as exc:
            body = exc.read().decode(errors="replace")[:300] if isinstance(exc, urllib.error.HTTPError) else ""
            level.failures.append(f"{req.name}: {exc} {body}".rstrip())
            return
        finally:
            level.latencies_s[i] = time.perf_counter() - began
        choice = answer["choices"][0]
        level.outputs[i] = choice["text"] if "text" in choice else choice["message"]["content"]
        stats = answer.get("codespec", {})
        with counted:
            level.tokens += answer["usage"]["completion_tokens"]
            level.prompt_tokens += stats.get("prompt_tokens", 0) - stats.get("cached_prompt_tokens", 0)
            level.prefill_s += stats.get("ttft_s", 0.0)

    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(lambda item: one(*item), enumerate(reqs)))
    level.wall_s = time.perf_counter() - began
    return level


def run_load(reqs: list[LoadRequest], concurrencies: tuple[int, ...], log: Callable[[str], None],
             env: dict[str, str] | None = None) -> list[Level]:
    """Each level against a fresh `codespec serve` (8 active requests at most)."""
    from codespec.bench.editor import ServeProcess
    from codespec.settings import child_environment

    levels = []
    with tempfile.TemporaryDirectory(prefix="codespec-load-") as empty:
        for concurrency in concurrencies:
            with ServeProcess(Path(empty), env or child_environment(),
                              extra=("--max-active-requests", str(max(concurrencies)))) as server:
                _level(server.url, reqs[-1:], 1)  # warm-up: first-call costs out of the timing
                _check_idle(server.url)
                level = _level(server.url, reqs, concurrency)
            levels.append(level)
            j = summaries(levels)[-1]
            log(f"concurrency {concurrency}: {j['tokens_per_s']} tok/s, p50 {j['p50_s']} s, p95 {j['p95_s']} s"
                + (f", {len(level.failures)} failed" if level.failures else ""))
            for failure in level.failures[:3]:  # why, not only how many (an HTTP error carries its body)
                log(f"  failed: {failure}")
    return levels


def _check_idle(url: str) -> None:
    """The warm-up left no request active (each level starts from an idle server)."""
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        health = json.loads(r.read())
    if health["active"]:
        raise RuntimeError(f"the warm-up request is still active: {health}")


def print_table(levels: list[Level], out: Any) -> None:
    print(f"{'concurrency':>11}{'requests':>9}{'wall s':>8}{'tok/s':>8}{'req/s':>7}{'p50 s':>7}{'p95 s':>7}"
          f"{'vs 1':>6}{'same output':>12}{'prompt tok':>11}{'prefill share':>14}", file=out)
    for j in summaries(levels):
        same = "-" if "outputs_equal_to_1" not in j else ("yes" if j["outputs_equal_to_1"] else "NO")
        ratio = f"{j['throughput_vs_1']:.2f}x" if "throughput_vs_1" in j else "1.00x"
        print(f"{j['concurrency']:>11}{j['requests']:>9}{j['wall_s']:>8.1f}{j['tokens_per_s']:>8.2f}"
              f"{j['requests_per_s']:>7.2f}{j['p50_s']:>7.2f}{j['p95_s']:>7.2f}{ratio:>6}{same:>12}"
              f"{j['prompt_tokens']:>11}{'-' if j['prefill_share'] is None else format(j['prefill_share'], '.0%'):>14}",
              file=out)
