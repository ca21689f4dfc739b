"""`codespec generate`: one completion of a prompt file, greedy, with speculation on or off.

    codespec generate prompt.txt                 # text to stdout, stats to stderr
    codespec generate --json --no-spec - < p.txt  # exactly one JSON object on stdout
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from codespec.cli.options import MODEL_FIELDS, SPECULATION_FIELDS, add_settings_arguments, settings_from_args
from codespec.errors import CodespecError, RequestError

MAX_PROMPT_BYTES = 8 << 20  # a prompt larger than this is a mistake, not a request


def register(commands: Any) -> None:
    p = commands.add_parser("generate", help="complete a prompt (file or stdin) with the model")
    p.add_argument("prompt_file", nargs="?", default="-", metavar="PROMPT_FILE|-",
                   help="prompt text, tokenized verbatim (special tokens such as <|fim_prefix|> "
                   "are recognised); '-' or nothing reads stdin")
    p.add_argument("--index", metavar="FILE", help="draft from this suffix index too (built by `codespec index PATH`)")
    p.add_argument("--no-spec", action="store_true", help="run the same engine with speculation off")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="tokens to generate at most (128)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop before this text (repeatable)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: lossless sampling")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus cut for sampling (1.0)")
    p.add_argument("--top-k", type=int, default=0, help="top-k cut for sampling (0: none)")
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template as a user turn")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    add_settings_arguments(p, MODEL_FIELDS + SPECULATION_FIELDS)
    p.set_defaults(handler=run, fast_exit=True)  # nothing to tear down once the answer is out (main.run)


def read_prompt(source: str) -> str:
    """The prompt's text; binary, non-UTF-8 or oversized input is refused with a clear line."""
    if source == "-":
        if sys.stdin.isatty():
            raise CodespecError("no prompt: give PROMPT_FILE or pipe the prompt into stdin")
        data = sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1)
        name = "stdin"
    else:
        path = Path(source)
        if not path.is_file():
            raise CodespecError(f"prompt file {source}: no such file")
        with open(path, "rb") as f:
            data = f.read(MAX_PROMPT_BYTES + 1)
        name = source
    if len(data) > MAX_PROMPT_BYTES:
        raise RequestError(f"prompt {name} is larger than {MAX_PROMPT_BYTES >> 20} MiB")
    if b"\x00" in data:
        raise RequestError(f"prompt {name} looks binary (it contains NUL bytes); give a text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"prompt {name} is not UTF-8 text (bad byte at offset {exc.start})") from None
    if not text:
        raise RequestError(f"prompt {name} is empty")
    return text


def process_age() -> float:
    """Seconds since this process started (Linux: from /proc; elsewhere since codespec's
    CLI was imported, which misses the interpreter's own start-up)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def startup_report(imported: float, loading: float, loaded_at: float, started: float, ttft: float) -> dict[str, float]:
    """`generate --json`'s `startup` from process ages (`process_age`): after imports,
    around the model load, at the request's start, and its time to first token."""
    return {"imports_s": round(imported, 4), "model_load_s": round(loaded_at - loading, 4),
            "engine_s": round(started - loaded_at, 4), "first_token_s": round(started + ttft, 4)}


def run(args: argparse.Namespace) -> int:
    from codespec.engine import Engine, GenerationConfig
    from codespec.models.loading import load_model
    from codespec.prompts import encode_prompt

    imported = process_age()

    # Built first: bad limits or sampling values fail before anything loads.
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop=tuple(args.stop), speculate=not args.no_spec,
                              temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    settings = settings_from_args(args)
    text = read_prompt(args.prompt_file)
    index = None
    if args.index:  # before the model: a bad index file fails in milliseconds
        from codespec.index import SuffixIndex

        index = SuffixIndex.load(args.index)
    loading = process_age()
    loaded = load_model(settings, direct=True)  # no torch import where the direct path serves it
    loaded_at = process_age()
    tokenizer = loaded.tokenizer
    if args.chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
    prompt_ids = encode_prompt(tokenizer, text)
    if index is not None:
        from codespec.indexing import tokenizer_fingerprint

        index.check_tokenizer(tokenizer_fingerprint(tokenizer, settings.cache_dir))
    engine = Engine.from_settings(loaded.model, tokenizer, settings, index=index)
    started = process_age()
    result = engine.generate(prompt_ids, config)
    if args.json:
        out = result.to_json()
        # where a fresh process's time went before the request (bench cold start reads it)
        out["startup"] = startup_report(imported, loading, loaded_at, started, result.stats.ttft_s)
        out["startup"]["path"] = "direct" if loaded.direct else "transformers"
        print(json.dumps(out))
        return 0
    sys.stdout.write(result.text)
    if not result.text.endswith("\n"):
        sys.stdout.write("\n")
    s = result.stats
    print(
        f"[{s.generated_tokens} tokens in {s.wall_s:.2f} s ({s.generated_tokens / max(s.wall_s, 1e-9):.1f} tok/s), "
        f"ttft {s.ttft_s:.2f} s, {s.verify_passes} verify passes, "
        f"{s.accepted_tokens_per_pass:.2f} accepted tokens/pass, finish: {result.finish_reason}]",
        file=sys.stderr,
    )
    return 0
