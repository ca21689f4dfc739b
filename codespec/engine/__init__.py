"""The engine: requests in, committed tokens out, over one forward backend.

    engine.py      Engine (prefill, then batched verify passes, the controller's choice)
    run.py         Run (one request's life), GenerationConfig, Generation
    ahead.py       the next pass's drafts on a guess while a pass runs (a GPU's)
    verifier.py    the verify pass: acceptance, KV compaction, commit (one for every backend)
    kvcache.py     KV slots with exact prompt-prefix reuse
    scheduler.py   continuous batching on one worker thread
    sampling.py    lossless speculative sampling (imports torch: sampled requests only)
    stopping.py    EOS, token limits and stop strings; textstream.py: safe text to stream
    stats.py       a request's speculation statistics; a process's start-up ages

`from codespec.engine import Engine` loads engine.py on first use, so a CLI command that
only needs stats.py does not import the engine's dependencies.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CacheFull", "Engine", "Generation", "GenerationConfig", "Run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from codespec.engine import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'codespec.engine' has no attribute {name!r}")
