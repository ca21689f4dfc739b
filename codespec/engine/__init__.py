"""The engine: requests in, committed tokens out, over one forward backend.

    engine.py      Engine (prefill, then batched verify passes, the controller's choice)
    run.py         Run (one request's state), GenerationConfig, Generation
    ahead.py       the next pass's drafts on a guess while a pass runs (a GPU's)
    kvcache.py     KV slots with exact prompt-prefix reuse
    scheduler.py   continuous batching on one worker thread
    stopping.py    EOS, token limits and stop strings; textstream.py: safe text to stream
    stats.py       a request's speculation statistics; a process's start-up ages

Draft trees, the verify pass and acceptance (greedy, sampled) are codespec/verify/.
The package imports nothing itself: `from codespec.engine.engine import Engine`.
"""
