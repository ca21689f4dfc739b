"""llama.cpp's `llama-server` as a benchmark peer: the backend a CPU user picks instead
of codespec (llama.vim and llama.vscode talk to it).

`scripts/install-bench-peers.sh` builds it from the source vendored in the
llama-cpp-python sdist and writes the default model as a BF16 GGUF (the same values as
codespec's bf16 weights) into `$CODESPEC_PEERS_DIR` (default ~/.cache/codespec/peers).
Benchmark only: codespec never runs it otherwise.

Each system is one server process (one slot, the machine's threads), started before a
workload and stopped after it, driven through `/completion` with the prompt's token ids,
greedy, timed end to end on our side as every other system is. Its prompt cache stays
on between a workload's requests, as codespec's KV prefix cache does.

Systems: `llamacpp` (plain decoding) and one per n-gram speculation type
(`llamacpp-simple`, `llamacpp-mod`, `llamacpp-map-k`); `--systems llamacpp-lookup` picks
all three and the report names the best per workload.
"""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from codespec.settings import child_environment, current

GGUF_BF16 = "qwen2.5-coder-0.5b-instruct-bf16.gguf"
START_TIMEOUT_S = 120
# What each system passes to llama-server: ngram-simple as the issue measured it (a
# 3-token key, 16-token drafts); ngram-mod and ngram-map-k with llama.cpp's own defaults
# (mod: a 24-token rolling hash, drafts of 48-64 tokens, what llama.vim uses; map-k: a
# 12-token key, 48-token drafts).
SPEC_ARGS: dict[str, list[str]] = {
    "llamacpp": [],
    "llamacpp-simple": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                        "--spec-ngram-simple-size-m", "16"],
    "llamacpp-mod": ["--spec-type", "ngram-mod"],
    "llamacpp-map-k": ["--spec-type", "ngram-map-k"],
}
LOOKUP_SYSTEMS = ("llamacpp-simple", "llamacpp-mod", "llamacpp-map-k")


def peers_dir() -> Path:
    settings = current()
    return Path(settings.peers_dir or settings.cache_dir / "peers")


def server_binary() -> Path:
    return peers_dir() / "llama.cpp" / "bin" / "llama-server"


def gguf_path(slug: str = "") -> Path:
    """The BF16 GGUF of a packaged model (its cache slug; default: the default model's)."""
    return peers_dir() / (f"{slug}-bf16.gguf" if slug else GGUF_BF16)


def ensure_gguf(model: Any, log: Any = print) -> Path:
    """A packaged model's BF16 GGUF for llama-server (the values codespec serves), written
    from its part packages with llama.cpp's llama-quantize where it is missing."""
    from codespec.models.default import export_gguf

    out = gguf_path(model.slug)
    if out.exists():
        return out
    log(f"writing {out.name} for llama-server (the official Q4_K_M GGUF, requantized to BF16)")
    with tempfile.TemporaryDirectory(dir=peers_dir()) as tmp:
        q4 = export_gguf(Path(tmp) / model.gguf_file, model, progress=False)
        binary = server_binary().parent / "llama-quantize"
        env = child_environment()
        env["LD_LIBRARY_PATH"] = f"{binary.parent}:{env.get('LD_LIBRARY_PATH', '')}"
        subprocess.run([str(binary), "--allow-requantize", str(q4), str(out) + ".tmp", "BF16"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
        Path(str(out) + ".tmp").replace(out)
    return out


def llamacpp_available() -> str | None:
    """None when the server and the BF16 GGUF are installed, else why not."""
    for path in (server_binary(), gguf_path()):
        if not path.exists():
            return f"{path} is missing: run scripts/install-bench-peers.sh (docs/benchmarks.md)"
    return None


@dataclass
class LlamaOutcome:
    token_ids: list[int]
    wall_s: float
    ttft_s: float | None
    draft_tokens: int
    accepted_draft_tokens: int


class LlamaServer:
    """One llama-server process for one system; `with LlamaServer(...) as server:`."""

    def __init__(self, system: str, threads: int, context: int = 8192, extra: Sequence[str] = (),
                 gguf: Path | None = None) -> None:
        self.system = system
        self.gguf = gguf or gguf_path()  # the model (default: the default model's BF16 GGUF)
        self.extra = list(extra)  # more llama-server flags (the editor bench: llama.vim's)
        self.threads = threads
        self.context = context
        self.process: subprocess.Popen[bytes] | None = None
        self.log = tempfile.NamedTemporaryFile(prefix=f"codespec-{system}-", suffix=".log", delete=False)
        self.url = ""

    def __enter__(self) -> LlamaServer:
        port = _free_port()
        binary = server_binary()
        args = [str(binary), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(port),
                "-t", str(self.threads), "-tb", str(self.threads), "-c", str(self.context), "-np", "1",
                *SPEC_ARGS[self.system], *self.extra]
        env = child_environment()
        env["LD_LIBRARY_PATH"] = f"{binary.parent}:{env.get('LD_LIBRARY_PATH', '')}"
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        tail = Path(self.log.name).read_text(errors="replace")[-1500:]
        raise RuntimeError(f"llama-server ({self.system}) did not start; its log ends:\n{tail}")

    def __exit__(self, *exc: Any) -> None:
        stop_process(self.process, timeout_s=20)
        self.log.close()

    def complete(self, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_ids: Iterable[int],
                 cache_prompt: bool = True) -> LlamaOutcome:
        body = {"prompt": list(prompt_ids), "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1,
                "cache_prompt": cache_prompt, "return_tokens": True, "stream": False}
        request = urllib.request.Request(self.url + "/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        began = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as response:
            answer = json.load(response)
        wall = time.perf_counter() - began
        eos = set(eos_token_ids)
        tokens = [int(t) for t in answer.get("tokens", [])]
        while tokens and tokens[-1] in eos:  # codespec's output excludes the EOS token
            tokens.pop()
        timings = answer.get("timings", {})
        prompt_ms = timings.get("prompt_ms")
        return LlamaOutcome(tokens, wall, None if prompt_ms is None else prompt_ms / 1000,
                            int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0)))


def stop_process(process: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """Terminate a server the bench started, and kill it if it has not left in `timeout_s`."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
