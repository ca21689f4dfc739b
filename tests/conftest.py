"""Shared fixtures. The real default model is loaded once per session, and prepared
(join + sha256 + convert, ~1 min) on first use if the cache does not hold it yet."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def default_model():
    from codespec import forward
    from codespec.settings import Settings

    # transformers' model too: tests compare against it (its forward, HF generate)
    return forward.load(Settings(), progress=False, transformers=True)
