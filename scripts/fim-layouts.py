"""Score fill-in-the-middle prompt layouts on the typing replay, the model alone.

Every request of `codespec bench editor`'s replay (codespec/bench/typing.py) is built as
`codespec lsp` builds it (lsp/window.py: the window before the cursor's line, the typed
part of the line as the middle, held-back spaces), in each layout, generated greedily
(48 tokens) and cut at the block end as the language server cuts it; the score is the
bench's (first line exactly right, characters accepted). No server, no latency figures:
this compares what the model writes, and how much of each prompt the KV cache held.

    python scripts/fim-layouts.py                      # psm, spm, llama.cpp's spm order
    python scripts/fim-layouts.py --layouts spm --requests 24
"""

from __future__ import annotations

import argparse
import json
import time

from codespec import forward
from codespec.bench.typing import score, typing_replay
from codespec.engine import Engine, GenerationConfig
from codespec.lsp.cut import Landing
from codespec.lsp.options import LspOptions
from codespec.lsp.syntax import Mode, classify
from codespec.lsp.window import fim_request
from codespec.prompts import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, encode, fim_ids, grid_start, special_id
from codespec.settings import Settings


def llama_spm(tokenizer, request) -> list[int]:
    """llama.cpp's `--spm-infill` order, <|fim_suffix|>S<|fim_prefix|>P<|fim_middle|>m (not
    one of prompts.FIM_LAYOUTS: the default model fails at it)."""
    pre, suf, mid = (special_id(tokenizer, t) for t in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE))
    before, after = encode(tokenizer, request.prefix), encode(tokenizer, request.suffix)
    before = before[grid_start(len(before), request.prefix_tokens):]
    return [suf, *after[: request.suffix_tokens], pre, *before, mid, *encode(tokenizer, request.middle)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default="psm,spm,llama-spm")
    parser.add_argument("--requests", type=int, default=None, help="the replay's first N requests (default: all)")
    args = parser.parse_args()
    settings = Settings()
    loaded = forward.load(settings, progress=False)
    engine = Engine.from_settings(loaded.forward, loaded.tokenizer, settings)
    asks = typing_replay(limit=args.requests).asks
    results = []
    for layout in args.layouts.split(","):
        engine.cache.clear()
        lines = chars = cached = prompt_tokens = 0
        for n, ask in enumerate(asks, 1):
            mode = classify(ask.text, ask.offset, "python")
            if mode is Mode.NONE:
                continue
            request, held = fim_request(ask.text, ask.offset, LspOptions(fim_layout="psm"), ask.path)
            ids = llama_spm(loaded.tokenizer, request) if layout == "llama-spm" else fim_ids(
                loaded.tokenizer, request.prefix, request.suffix, request.middle, prefix_tokens=request.prefix_tokens,
                suffix_tokens=request.suffix_tokens, layout=layout)
            began = time.perf_counter()
            out = engine.generate(ids, GenerationConfig(max_new_tokens=48))
            healed = held.heal(out.text)
            landing = Landing.at(ask.text, ask.offset, "python", mode)
            shown = "" if healed is None else landing.fit(healed)
            s = score(ask, shown)
            lines, chars = lines + s.first_line_exact, chars + s.chars_accepted
            cached, prompt_tokens = cached + out.stats.cached_prompt_tokens, prompt_tokens + len(ids)
            print(f"{layout} {n}/{len(asks)} {time.perf_counter() - began:.1f}s cached "
                  f"{out.stats.cached_prompt_tokens}/{len(ids)} {shown[:40]!r} (typed: {ask.truth[:30]!r})", flush=True)
        results.append({"layout": layout, "requests": len(asks), "first_line_exact": round(lines / len(asks), 3),
                        "chars_accepted_mean": round(chars / len(asks), 2),
                        "cache_hit_rate": round(cached / max(prompt_tokens, 1), 3)})
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
