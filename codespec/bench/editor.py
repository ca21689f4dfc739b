"""`codespec bench editor`: the typing replay (bench/typing.py) against the servers an
editor talks to, one after the other in one run, on the same machine and model.

* `lsp`: `codespec lsp` over stdio, driven by a real LSP client (pygls), as VS Code or
  Neovim drive it: didOpen / didChange (whole text) / didClose, and an inline completion
  request per `Ask`; the workspace is indexed first (the status says ready).
* `infill`: `codespec serve`, driven with llama.vim's `/infill` request: 256 lines
  before the cursor's line, the typed part of the line as `prompt`, the rest of the line
  and 64 lines after as `input_suffix`, `n_predict` 128, `t_max_predict_ms` 250 on the
  first request and 1000 after, `n_indent`, `cache_prompt`. Greedy (temperature 0): its
  top_k 40 / top_p 0.9 samplers would make the systems' outputs incomparable.
* `llama-server`: llama.cpp's server with what llama.vim's README asks for on a CPU
  (`--cache-reuse 256`, batch 1024), the same requests (scripts/install-bench-peers.sh
  installs it; skipped with the reason when it is missing).

Each request's latency is timed on the client's side, from the request to the answer.
Reported per system: the first request after each file opened, warm p50 and p95 (every
other request), the prompt cache's hit rate (tokens of each prompt the server reused),
the share of first lines exactly right, mean characters accepted, and whether every
request was answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from codespec.bench.typing import Ask, Close, Open, Replay, Type, score

EDITOR_SYSTEMS = ("lsp", "infill", "llama-server")
READY_TIMEOUT_S = 600  # model load, calibration, indexing (a first run on a fresh machine)
REQUEST_TIMEOUT_S = 120  # an unanswered request counts as such, the replay goes on
LLAMA_VIM = {"n_prefix_lines": 256, "n_suffix_lines": 64, "n_predict": 128, "first_ms": 250, "later_ms": 1000}


@dataclass
class Sample:
    kind: str
    first: bool
    latency_s: float | None  # None: unanswered within REQUEST_TIMEOUT_S
    first_line_exact: bool
    chars_accepted: int
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    text: str | None = None  # what the editor shows (None: nothing)


@dataclass
class SystemResult:
    system: str
    samples: list[Sample] = field(default_factory=list)
    skipped: str = ""

    def to_json(self) -> dict[str, Any]:
        if self.skipped:
            return {"system": self.system, "skipped": self.skipped}
        answered = [s for s in self.samples if s.latency_s is not None]
        first = [s.latency_s for s in answered if s.first]
        warm = sorted(s.latency_s for s in answered if not s.first)
        prompt = sum(s.prompt_tokens or 0 for s in self.samples)
        cached = sum(s.cached_tokens or 0 for s in self.samples)
        known = any(s.prompt_tokens is not None for s in self.samples)
        n = max(len(self.samples), 1)
        return {
            "system": self.system, "requests": len(self.samples), "answered": len(answered),
            "first_s": round(statistics.median(first), 3) if first else None,
            "warm_p50_s": round(statistics.median(warm), 3) if warm else None,
            "warm_p95_s": round(warm[min(len(warm) - 1, int(0.95 * len(warm)))], 3) if warm else None,
            "cache_hit_rate": round(cached / prompt, 3) if known and prompt else None,
            "first_line_exact": round(sum(s.first_line_exact for s in self.samples) / n, 3),
            "chars_accepted_mean": round(sum(s.chars_accepted for s in self.samples) / n, 2),
        }


def _sample(ask: Ask, latency: float | None, text: str | None, prompt: int | None = None,
            cached: int | None = None) -> Sample:
    s = score(ask, text)
    return Sample(ask.kind, ask.first, latency, s.first_line_exact, s.chars_accepted, prompt, cached, text)


# -- codespec lsp ------------------------------------------------------------------------------
async def run_lsp(replay: Replay, root: Path, env: dict[str, str], log: Callable[[str], None]) -> SystemResult:
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    result = SystemResult("lsp")
    client = LanguageClient("codespec-bench", "1")
    ready = asyncio.Event()

    @client.feature("codespec/status")
    def on_status(params: Any) -> None:
        state = params.get("state") if isinstance(params, dict) else getattr(params, "state", "")
        if state in ("ready", "error"):
            ready.set()

    await client.start_io(sys.executable, "-m", "codespec", "lsp", "--log-level", "warning", env=env)
    try:
        await client.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name="workspace")]))
        client.initialized(types.InitializedParams())
        await asyncio.wait_for(ready.wait(), READY_TIMEOUT_S)
        versions: dict[str, int] = {}
        generated = 0
        for event in replay.events:
            uri = (root / event.path).as_uri()
            if isinstance(event, Open):
                versions[uri] = 1
                client.text_document_did_open(types.DidOpenTextDocumentParams(
                    types.TextDocumentItem(uri=uri, language_id="python", version=1, text=event.text)))
            elif isinstance(event, Close):
                client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))
            elif isinstance(event, Type):
                versions[uri] += 1
                client.text_document_did_change(types.DidChangeTextDocumentParams(
                    types.VersionedTextDocumentIdentifier(uri=uri, version=versions[uri]),
                    [types.TextDocumentContentChangeWholeDocument(text=event.text)]))
            else:
                params = types.InlineCompletionParams(
                    text_document=types.TextDocumentIdentifier(uri),
                    position=types.Position(line=event.line, character=event.character),
                    context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic))
                began = time.perf_counter()
                try:
                    answer = await asyncio.wait_for(client.text_document_inline_completion_async(params),
                                                    REQUEST_TIMEOUT_S)
                    latency: float | None = time.perf_counter() - began
                except asyncio.TimeoutError:
                    answer, latency = None, None
                text = answer.items[0].insert_text if answer and answer.items else None
                cache = _get(_get(await client.protocol.send_request_async("codespec/stats", {}), "backend"),
                             "prompt_cache")
                prompt = cached = None
                if _get(cache, "requests") != generated:  # else the forwarding cache answered: no prompt
                    generated = _get(cache, "requests")
                    last = _get(cache, "last")
                    prompt, cached = _get(last, "prompt_tokens"), _get(last, "cached_tokens")
                result.samples.append(_sample(event, latency, text, prompt, cached))
                log(f"lsp {len(result.samples)}/{len(replay.asks)}: {_ms(latency)} cached {cached}/{prompt} "
                    f"{(text or '')[:48]!r} (typed next: {event.truth[:24]!r})")
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        await stop_client(client)
    return result


async def stop_client(client: Any) -> None:
    """Stop a pygls client and its server process: `stop()` alone waits for the server's
    exit, which a failed session (no `shutdown`/`exit`) never asked for."""
    server = client._server
    if server is not None and server.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            server.terminate()
    await client.stop()


def _get(value: Any, key: str) -> Any:
    if value is None:
        return None
    return value.get(key) if isinstance(value, dict) else getattr(value, key, None)


def _ms(latency: float | None) -> str:
    return "unanswered" if latency is None else f"{latency * 1000:.0f} ms"


# -- llama.vim's /infill (codespec serve, llama-server) ----------------------------------------
def infill_body(ask: Ask, first: bool) -> dict[str, Any]:
    """llama.vim's request for a cursor at `ask` (autoload/llama.vim, `llama#fim`)."""
    lines = ask.text.split("\n")
    row, col = ask.line, ask.character
    line = lines[row]
    prefix = "".join(f"{x}\n" for x in lines[max(0, row - LLAMA_VIM["n_prefix_lines"]):row])
    suffix = line[col:] + "\n" + "".join(f"{x}\n" for x in lines[row + 1:row + 1 + LLAMA_VIM["n_suffix_lines"]])
    middle = line[:col]
    indent = len(middle) - len(middle.lstrip(" "))
    if not middle.strip():  # llama.vim empties a whitespace-only middle and sends the indent as n_indent
        middle = ""
    return {"input_prefix": prefix, "input_suffix": suffix, "input_extra": [], "prompt": middle,
            "n_predict": LLAMA_VIM["n_predict"], "n_indent": indent, "top_k": 40, "top_p": 0.90,
            "samplers": ["top_k", "top_p", "infill"], "temperature": 0, "stream": False, "cache_prompt": True,
            "t_max_prompt_ms": 500,
            "t_max_predict_ms": LLAMA_VIM["first_ms"] if first else LLAMA_VIM["later_ms"],
            "response_fields": list(LLAMA_VIM_FIELDS)}


# what llama.vim asks the server to return (`response_fields`), each of which it reads
LLAMA_VIM_FIELDS = ("content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                    "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                    "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached")


# a small file for llama.vim's checks (tests/server/test_llama_vim.py, scripts/try-llama-vim.py)
SAMPLE_FILE = '''import os


def list_python_files(path):
    """Every .py file under path, sorted."""
    found = []
    for root, _dirs, files in os.walk(path):
        for name in files:
            if name.endswith(".py"):
                found.append(os.path.join(root, name))
    return sorted(found)


'''


def warmup_body(extra: list[dict[str, str]]) -> dict[str, Any]:
    """llama.vim's ring-buffer update: the extra context alone, `n_predict` 0, so that the
    server has its KV ready for the next completion (`s:ring_update`)."""
    return {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "",
            "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
            "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}


def run_infill(system: str, replay: Replay, url: str, log: Callable[[str], None]) -> SystemResult:
    result = SystemResult(system)
    for i, ask in enumerate(replay.asks):
        body = json.dumps(infill_body(ask, i == 0)).encode()
        request = urllib.request.Request(url + "/infill", data=body, headers={"Content-Type": "application/json"})
        began = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                answer = json.load(response)
            latency: float | None = time.perf_counter() - began
        except OSError as exc:
            log(f"{system}: request {i + 1} failed: {exc}")
            answer, latency = {}, None
        prompt = answer.get("timings/prompt_n", _get(answer.get("timings"), "prompt_n"))
        cached = answer.get("tokens_cached")
        evaluated = None if prompt is None else int(prompt) + int(cached or 0)  # prompt_n counts new tokens
        result.samples.append(_sample(ask, latency, _shown(answer.get("content"), ask), evaluated, cached))
        log(f"{system} {i + 1}/{len(replay.asks)}: {_ms(latency)} cached {cached}/{evaluated} "
            f"{(answer.get('content') or '')[:48]!r} (typed next: {ask.truth[:24]!r})")
    return result


def _shown(content: str | None, ask: Ask) -> str | None:
    """What llama.vim shows at the cursor: with an emptied middle the model writes the
    line's indentation too, which the cursor already has."""
    typed = ask.text[ask.offset - ask.character: ask.offset]
    if content and not typed.strip() and content.startswith(typed):
        return content[len(typed):]
    return content


class ServeProcess:
    """`codespec serve` on a free port, indexing the workspace; `with ServeProcess(...)`."""

    def __init__(self, root: Path, env: dict[str, str], extra: tuple[str, ...] = ()) -> None:
        self.root, self.env, self.extra = root, env, extra
        self.log = tempfile.NamedTemporaryFile(prefix="codespec-bench-serve-", suffix=".log", delete=False)
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def __enter__(self) -> ServeProcess:
        from codespec.bench.llamacpp import _free_port

        port = _free_port()
        self.process = subprocess.Popen([sys.executable, "-m", "codespec", "serve", "--port", str(port),
                                         "--repo", str(self.root), *self.extra], env=self.env, stdout=self.log,
                                        stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return self
            except OSError:
                time.sleep(0.3)
        self.__exit__()
        raise RuntimeError(f"codespec serve did not start; its log ends:\n"
                           f"{Path(self.log.name).read_text(errors='replace')[-1500:]}")

    def __exit__(self, *exc: Any) -> None:
        from codespec.bench.llamacpp import stop_process

        stop_process(self.process, timeout_s=30)
        self.log.close()


def run_editor_bench(replay: Replay, systems: list[str], root: Path, log: Callable[[str], None],
                     env: dict[str, str] | None = None, gguf: Path | None = None) -> list[SystemResult]:
    """Each system through the replay; `env`: the codespec servers' environment (default:
    this process's settings), `gguf`: llama-server's model (default: the default model's)."""
    from codespec.bench import llamacpp
    from codespec.settings import child_environment

    env = env if env is not None else child_environment()
    results = []
    for system in systems:
        if system == "lsp":
            results.append(asyncio.run(run_lsp(replay, root, env, log)))
        elif system == "infill":
            with ServeProcess(root, env) as serve:
                results.append(run_infill(system, replay, serve.url, log))
        else:
            missing = llamacpp.llamacpp_available() if gguf is None else (
                None if gguf.exists() and llamacpp.server_binary().exists() else f"{gguf} or llama-server is missing")
            if missing:
                results.append(SystemResult(system, skipped=missing))
                continue
            threads = len(os.sched_getaffinity(0))
            with llamacpp.LlamaServer("llamacpp", threads, extra=["--cache-reuse", "256", "-b", "1024",
                                                                  "-ub", "1024"], gguf=gguf) as server:
                results.append(run_infill(system, replay, server.url, log))
    return results


def print_table(results: list[SystemResult], out: Any) -> None:
    print(f"{'system':<14}{'asked':>6}{'answered':>9}{'first s':>9}{'p50 s':>8}{'p95 s':>8}{'cache hit':>10}"
          f"{'line ok':>8}{'chars':>7}", file=out)
    for r in results:
        j = r.to_json()
        if r.skipped:
            print(f"{r.system:<14}skipped: {r.skipped}", file=out)
            continue

        def f(v: Any, spec: str) -> str:
            return "-" if v is None else format(v, spec)

        print(f"{r.system:<14}{j['requests']:>6}{j['answered']:>9}{f(j['first_s'], '.2f'):>9}"
              f"{f(j['warm_p50_s'], '.2f'):>8}{f(j['warm_p95_s'], '.2f'):>8}{f(j['cache_hit_rate'], '.0%'):>10}"
              f"{j['first_line_exact']:>8.0%}{j['chars_accepted_mean']:>7.1f}", file=out)
