"""`codespec check`: is this machine's backend lossless and how fast is it (bench/check.py).

    codespec check                              # rows against steps, pass costs, the plain step's floor
    codespec check --bench --json out.json      # and the verify suite's outputs against plain decoding
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from codespec.cli.options import MODEL_FIELDS, add_settings_arguments, settings_from_args
from codespec.errors import CodespecError


def register(commands: Any) -> None:
    p = commands.add_parser("check", help="check this machine's backend: tree-pass rows equal decode steps bit "
                            "for bit, verify-pass costs, a plain step against the weights' read time")
    p.add_argument("--bench", action="store_true",
                   help="also run the verify suite on a few requests (every draft policy, batch 1 and 4) and "
                   "compare each output with plain decoding")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON to FILE")
    add_settings_arguments(p, MODEL_FIELDS)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from codespec.forward import select as forward
    from codespec.bench.check import run_checks

    settings = settings_from_args(args)
    out = Path(args.json) if args.json else None
    if out is not None and not out.parent.is_dir():  # before minutes of checks, not after
        raise CodespecError(f"--json {out}: the folder {out.parent} does not exist")
    loaded = forward.load(settings, progress=sys.stderr.isatty())
    print(f"{loaded.name}: {loaded.backend} backend on {loaded.forward.device}, {loaded.info()['dtype']}",
          file=sys.stderr)
    report = run_checks(loaded, settings, bench=args.bench, say=print)
    if out is not None:
        from codespec.cli.bench import write_json

        try:
            write_json(out, report)
        except OSError as exc:
            raise CodespecError(f"--json {out}: cannot write it: {exc.strerror or exc}") from None
    print("all checks passed" if report["ok"] else "a check FAILED: see above")
    return 0 if report["ok"] else 1
