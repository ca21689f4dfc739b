"""`codespec` command line: generate, model, bench.

Every command reports a user error as one line on stderr (`codespec: error: ...`) and
exits with status 2; `--json` output goes to stdout alone, progress bars to stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from codespec import __version__
from codespec.errors import CodespecError

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    from codespec.cli import bench, generate, index, lsp, model, serve

    parser = argparse.ArgumentParser(
        prog="codespec",
        description="Code completion made fast by model-free, lossless suffix speculation.",
    )
    parser.add_argument("--version", action="version", version=f"codespec {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    generate.register(commands)
    index.register(commands)
    model.register(commands)
    bench.register(commands)
    serve.register(commands)
    lsp.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from codespec.cli.index import implicit_build

    parser = build_parser()
    args = parser.parse_args(implicit_build(list(sys.argv[1:] if argv is None else argv)))
    _quiet_libraries()
    handler: Handler = args.handler
    try:
        return handler(args)
    except CodespecError as exc:
        print(f"codespec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("codespec: interrupted", file=sys.stderr)
        return 130


def _quiet_libraries() -> None:
    """transformers' own warnings and weight-loading bars would drown our output."""
    import os

    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


if __name__ == "__main__":
    sys.exit(main())
