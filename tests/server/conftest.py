"""A served app over the real default model, in process and on a real loopback socket."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from codespec.index import SuffixIndex
from codespec.server.app import create_app
from codespec.server.backend import Backend
from codespec.server.http import server as http_server
from codespec.settings import Settings


def make_backend(default_model, **settings) -> Backend:
    s = Settings(**{"max_tokens_limit": 512, "max_request_bytes": 64 * 1024, **settings})
    return Backend.create(default_model, s, SuffixIndex())


@pytest.fixture(scope="module")
def backend(default_model):
    b = make_backend(default_model)
    yield b
    b.close()


@pytest.fixture(scope="module")
def app(backend):
    return create_app(backend.settings, backend=backend)


@pytest.fixture
async def client(app):
    import httpx2
    import openai

    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test", timeout=120)
    async with openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http,
                                  max_retries=0) as client:
        yield client


@pytest.fixture
async def http(app):
    import httpx2

    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test",
                                  timeout=120) as http:
        yield http


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def live_server(app):
    """The same app under a real uvicorn on 127.0.0.1 (a free port), for socket-level tests."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = http_server(app, app.state.settings.model_copy(update={"port": port}), log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
