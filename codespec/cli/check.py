"""`codespec check`: is this machine's backend lossless and how fast is it (bench/check.py).

    codespec check                              # rows against steps, pass costs, the plain step's floor
    codespec check --bench --json out.json      # and the verify suite's outputs against plain decoding
    codespec check --model DIR --random-weights --device cuda   # a GPU machine without the weights
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from codespec.cli.options import MODEL_FIELDS, add_settings_arguments, settings_from_args
from codespec.errors import ModelError

MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja")


def register(commands: Any) -> None:
    p = commands.add_parser("check", help="check this machine's backend: tree-pass rows equal decode steps bit "
                            "for bit, verify-pass costs, a plain step against the weights' read time")
    p.add_argument("--bench", action="store_true",
                   help="also run the verify suite on a few requests (every draft policy, batch 1 and 4) and "
                   "compare each output with plain decoding")
    p.add_argument("--random-weights", action="store_true",
                   help="the model's config and tokenizer (--model DIR) with seeded random weights: a check "
                   "where the weights cannot be carried (needs transformers)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON to FILE")
    add_settings_arguments(p, MODEL_FIELDS)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from codespec.forward import select as forward
    from codespec.bench.check import run_checks

    settings = settings_from_args(args)
    with tempfile.TemporaryDirectory(prefix="codespec-check-") as scratch:
        if args.random_weights:
            settings = settings.model_copy(update={"model": str(random_model(settings, Path(scratch)))})
        loaded = forward.load(settings, progress=sys.stderr.isatty())
        print(f"{loaded.name}: {loaded.backend} backend on {loaded.forward.device}, {loaded.info()['dtype']}",
              file=sys.stderr)
        report = run_checks(loaded, settings, bench=args.bench, say=print)
    if args.json:
        path = Path(args.json)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
    print("all checks passed" if report["ok"] else "a check FAILED: see above")
    return 0 if report["ok"] else 1


def random_model(settings: Any, where: Path) -> Path:
    """`settings.model` (a directory with a config and tokenizer) with seeded random
    weights in the serving dtype, saved under `where`."""
    source = Path(settings.model)
    if not (source / "config.json").is_file():
        raise ModelError(f"--random-weights needs --model DIR holding config.json and the tokenizer; {source} has none")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    for name in MODEL_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, where / name)
    config = AutoConfig.from_pretrained(where)
    dtype = torch.float32 if settings.dtype == "float32" else torch.bfloat16
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(where)
    return where
