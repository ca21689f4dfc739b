"""`codespec generate`: one completion of a prompt file, greedy, with speculation on or off.

    codespec generate prompt.txt                 # text to stdout, stats to stderr
    codespec generate --json --no-spec - < p.txt  # exactly one JSON object on stdout
    codespec generate --chat --prediction app.py ask.txt   # drafts from the expected answer too
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from codespec.cli.options import MODEL_FIELDS, SPECULATION_FIELDS, add_settings_arguments, settings_from_args
from codespec.engine.stats import process_age, startup_report
from codespec.prompts import read_prompt


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
    p.add_argument("--prediction", metavar="FILE",
                   help="the output you expect (a file being rewritten): drafts from it too, never changes the output")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    add_settings_arguments(p, MODEL_FIELDS + SPECULATION_FIELDS)
    p.set_defaults(handler=run, fast_exit=True)  # nothing to tear down once the answer is out (main.run)


def run(args: argparse.Namespace) -> int:
    from codespec.forward import select as forward
    from codespec.engine.engine import Engine, GenerationConfig
    from codespec.index.prediction import prediction_usage
    from codespec.prompts import encode_prompt

    imported = process_age()

    # Built first: bad limits or sampling values fail before anything loads.
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop=tuple(args.stop), speculate=not args.no_spec,
                              temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    settings = settings_from_args(args)
    text = read_prompt(args.prompt_file)
    predicted = read_prompt(args.prediction, "prediction") if args.prediction else None
    index = None
    if args.index:  # before the model: a bad index file fails in milliseconds
        from codespec.index import SuffixIndex

        index = SuffixIndex.load(args.index)
    loading = process_age()
    loaded = forward.load(settings)  # no torch import where the torch-free backend serves it
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
    engine = Engine.from_settings(loaded.forward, tokenizer, settings, index=index)
    if predicted is not None:
        config = replace(config, prediction=tuple(encode_prompt(tokenizer, predicted)))  # verbatim, as the prompt
    started = process_age()
    result = engine.generate(prompt_ids, config)
    kept = prediction_usage(config.prediction, result.token_ids) if config.prediction else None
    if args.json:
        out = result.to_json()
        if kept is not None:
            out["prediction"] = {"accepted_prediction_tokens": kept[0], "rejected_prediction_tokens": kept[1]}
        # where a fresh process's time went before the request (bench cold start reads it)
        out["startup"] = startup_report(imported, loading, loaded_at, started, result.stats.ttft_s)
        out["startup"]["path"] = "direct" if loaded.torch_free else "transformers"
        out["startup"]["backend"] = loaded.backend
        print(json.dumps(out))
        return 0
    sys.stdout.write(result.text)
    if not result.text.endswith("\n"):
        sys.stdout.write("\n")
    s = result.stats
    print(
        f"[{s.generated_tokens} tokens in {s.wall_s:.2f} s ({s.generated_tokens / max(s.wall_s, 1e-9):.1f} tok/s), "
        f"ttft {s.ttft_s:.2f} s, {s.verify_passes} verify passes, "
        f"{s.accepted_tokens_per_pass:.2f} accepted tokens/pass, finish: {result.finish_reason}"
        + (f", prediction: {kept[0]} tokens kept, {kept[1]} not" if kept is not None else "") + "]",
        file=sys.stderr,
    )
    return 0
