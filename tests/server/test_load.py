"""A bounded load test on loopback: 200 requests at concurrency 8, then still healthy."""

from __future__ import annotations

import asyncio
import time

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.anyio]

REQUESTS, CONCURRENCY = 200, 8
TIME_BOUND_S = 600  # a bound so the test ends, not a performance claim


async def test_200_requests_at_concurrency_8(live_server):
    import httpx2

    statuses: list[int] = []
    gate = asyncio.Semaphore(CONCURRENCY)
    started = time.monotonic()

    async def one(http: httpx2.AsyncClient, i: int) -> None:
        async with gate:
            if time.monotonic() - started > TIME_BOUND_S:
                return
            body = {"prompt": f"# request {i}\ndef f{i}(x):\n    return", "max_tokens": 3, "stream": i % 2 == 0}
            r = await http.post("/v1/completions", json=body)
            statuses.append(r.status_code)

    async with httpx2.AsyncClient(base_url=live_server, timeout=TIME_BOUND_S) as http:
        await asyncio.gather(*(one(http, i) for i in range(REQUESTS)))
        health = await http.get("/health")
    assert len(statuses) == REQUESTS, f"only {len(statuses)} requests ran within {TIME_BOUND_S} s"
    assert statuses.count(200) == REQUESTS
    assert health.status_code == 200 and health.json()["active"] == 0
