"""Bearer-token auth, and the refusal to expose an unauthenticated server."""

from __future__ import annotations

import pytest

from codespec.cli.main import main
from codespec.server.app import create_app

from .conftest import make_backend

pytestmark = [pytest.mark.model, pytest.mark.anyio]


async def test_api_key_is_required_when_set(default_model):
    import httpx2

    backend = make_backend(default_model, api_key="s3cret")
    try:
        app = create_app(backend.settings, backend=backend)
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
            health = await http.get("/health")  # open for probes: the effective settings, never the key
            assert health.status_code == 200 and "s3cret" not in health.text
            assert health.json()["settings"]["max_draft_tokens"] == backend.settings.max_draft_tokens
            r = await http.get("/v1/models")
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            r = await http.get("/v1/models", headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401
            r = await http.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
            assert r.status_code == 200
    finally:
        backend.close()


def test_non_loopback_bind_needs_a_key(capsys, monkeypatch):
    monkeypatch.delenv("CODESPEC_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--repo", ""]) == 2
    assert "set an API key" in capsys.readouterr().err
