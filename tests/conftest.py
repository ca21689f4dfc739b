"""Shared fixtures. The real default model is loaded once per session, and prepared
(join + sha256 + convert, ~1 min) on first use if the cache does not hold it yet.

CODESPEC_TEST_DEADLINE (a Unix time): CI's slow step runs the slow tests that start
before it and skips the rest, saying so, so that CI keeps to its time (.ci/run)."""

from __future__ import annotations

import os
import time

import pytest


@pytest.fixture(scope="session")
def default_model():
    from codespec.forward import select as forward
    from codespec.settings import Settings

    # transformers' model too: tests compare against it (its forward, HF generate)
    return forward.load(Settings(), progress=False, transformers=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    deadline = os.environ.get("CODESPEC_TEST_DEADLINE")
    if deadline and time.time() > float(deadline):
        pytest.skip("past CI's time for this step (CODESPEC_TEST_DEADLINE); `python -m pytest -m slow` runs it")
