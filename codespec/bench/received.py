"""Completion quality as a user receives it: the quality suite's cases (bench/quality.py)
asked of the servers an editor talks to, and scored on what the editor would show.

    lsp           `codespec lsp` over stdio, driven by a real LSP client (bench/editor.py):
                  its own prompt, its block cut, its latency budget; the inline
                  completion's text as VS Code or Neovim shows it
    llama-server  llama.cpp's server with llama.vim's request for the same cursor
                  (editor.infill_body: 256 lines before, 64 after, `n_predict` 128, its
                  `t_max_predict_ms`), on the same model's BF16 GGUF, as llama.vim shows it

Each case is a file opened at its own path (the document without the truth), one
request at the cursor, the file closed; the workspace holds nothing else, so neither
server has repository context. The prompt-layout table of bench/quality.py scores
prompts on one engine with no budget; this one scores the answers, cut and timed as
served, so that latency and quality are traded with numbers.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from codespec.bench import quality
from codespec.bench.editor import SystemResult, run_editor_bench
from codespec.bench.typing import Ask, Close, Open, Replay

SYSTEMS = ("lsp", "llama-server")


def replay_of(chosen: Sequence[quality.Case]) -> Replay:
    """One open, ask, close per case, each at a path of its own."""
    events: list[Any] = []
    for i, case in enumerate(chosen):
        path = f"case{i:02d}/{case.path}"
        kind = "mid-line" if case.kind == "line" else "line-start"
        events += [Open(path, case.text), Ask(path, case.text, case.offset, case.truth, kind, first=i == 0),
                   Close(path)]
    return Replay(events)


def run(chosen: Sequence[quality.Case], systems: Sequence[str], root: Path, env: dict[str, str],
        gguf: Path | None, log: Callable[[str], None]) -> list[SystemResult]:
    """Every case through each system (editor.run_editor_bench), in case order."""
    root.mkdir(parents=True, exist_ok=True)
    return run_editor_bench(replay_of(chosen), list(systems), root, log, env=env, gguf=gguf)


def summary(chosen: Sequence[quality.Case], results: Sequence[SystemResult]) -> dict[str, Any]:
    """Per system and kind: exact-match rate, mean edit similarity, answered share and
    latency p50 (an unanswered or empty request scores as an empty completion)."""
    out: dict[str, Any] = {}
    for result in results:
        if result.skipped:
            out[result.system] = {"skipped": result.skipped}
            continue
        row: dict[str, Any] = {}
        for kind in quality.KINDS:
            mine = [(case, sample) for case, sample in zip(chosen, result.samples) if case.kind == kind]
            if not mine:
                continue
            scores = [quality.score(case, sample.text or "") for case, sample in mine]
            latencies = [s.latency_s for _, s in mine if s.latency_s is not None]
            row[kind] = {"exact": round(sum(e for e, _ in scores) / len(scores), 3),
                         "similarity": round(statistics.mean(sim for _, sim in scores), 3),
                         "cases": len(scores),
                         "shown": round(sum(bool(s.text) for _, s in mine) / len(mine), 3),
                         "latency_p50_s": round(statistics.median(latencies), 3) if latencies else None}
        out[result.system] = row
    return out
