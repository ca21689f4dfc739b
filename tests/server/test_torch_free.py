"""`codespec serve` on the torch-free backend (forward/select.py): a real server process
over a tiny Qwen2 model saved as bf16 safetensors with its own tokenizer, which answers a
completion without ever importing torch or transformers.

On a CPU without AVX-512 BF16 the test asks for the row decoder's portable code
(CODESPEC_FORWARD=rowdecoder), so it runs on every machine with a C compiler."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from codespec.kernels import rowgemm
from tests.tiny import tiny_model
from tests.caches import fresh_cache

pytestmark = pytest.mark.skipif(rowgemm.library() is None or not hasattr(rowgemm.library(), "rowdecoder_forward"),
                                reason=f"no C forward: {rowgemm.unavailable()}")
WORDS = ["<unk>", "<|endoftext|>", *(f"w{i}" for i in range(254))]


def tiny_model_dir(path):
    """A Qwen2 model the row decoder knows (64-dim heads, whole stripes), in bfloat16, with
    a word-level tokenizer.json of its 256-token vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = tiny_model("qwen2", vocab_size=len(WORDS), seed=2, dtype=torch.bfloat16, hidden_size=256,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=192)
    model.generation_config.eos_token_id = 1
    model.save_pretrained(path)
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|endoftext|>", "unk_token": "<unk>",
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def stream(url: str, body: dict) -> list[str]:
    """A streamed request's `data:` payloads, in order."""
    request = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return [line[len("data: "):].strip() for line in response.read().decode().splitlines()
                if line.startswith("data: ")]


def test_serve_answers_without_importing_torch(tmp_path):
    model = tiny_model_dir(tmp_path / "model")
    (tmp_path / "repo").mkdir()
    port = free_port()
    env = {**os.environ, "CODESPEC_CACHE_DIR": fresh_cache(tmp_path / "cache")}
    if rowgemm.isa() == rowgemm.SCALAR:
        env["CODESPEC_FORWARD"] = "rowdecoder"  # the portable C code: exact, slow, any CPU
    server = subprocess.Popen([sys.executable, "-m", "codespec", "serve", "--model", str(model), "--port", str(port),
                               "--repo", str(tmp_path / "repo")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stdout.read()
            try:
                get(base + "/health")
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not start in 120 s"
                time.sleep(0.3)
        prompt = " ".join(f"w{i}" for i in (5, 6, 7, 8, 9, 5, 6, 7))
        out = get(base + "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0})
        assert out["usage"]["completion_tokens"] > 0
        health = get(base + "/health")
        assert health["forward"]["backend"] == "rowdecoder" and health["forward"]["torch_free"], health
        assert health["forward"]["torch_imported"] is False, health
        # logprobs (which load torch for their softmax, as sampling does), streamed and not, on completions and chat
        body = {"prompt": prompt, "max_tokens": 2, "logprobs": 5}
        out = get(base + "/v1/completions", body)
        assert len(out["choices"][0]["logprobs"]["top_logprobs"][0]) == 5, out
        events = stream(base + "/v1/completions", body)
        assert events[-1] == "[DONE]" and not any('"error"' in e for e in events), events
        chat = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2, "logprobs": True,
                "top_logprobs": 3}
        out = get(base + "/v1/chat/completions", chat)
        assert len(out["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 3, out
        events = stream(base + "/v1/chat/completions", chat)
        assert events[-1] == "[DONE]" and not any('"error"' in e for e in events), events
    finally:
        server.terminate()
        server.wait(timeout=30)
