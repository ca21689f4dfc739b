"""`codespec index`: build, inspect and query a repository's suffix index.

    codespec index PATH [--out FILE] [--json]     build (again: re-tokenizes changed files only)
    codespec index stats FILE [--json]            what an index holds
    codespec index query FILE TEXT                the match and the draft for TEXT (debugging)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from codespec.cli.options import add_settings_arguments, print_facts, settings_from_args
from codespec.errors import CodespecError

TOKENIZER_FIELDS = ("model", "cache_dir")


ACTIONS = ("build", "stats", "query")


def register(commands: Any) -> None:
    p = commands.add_parser(
        "index", help="build (PATH), inspect (stats FILE) or query (query FILE TEXT) a suffix index",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", metavar="PATH | stats | query", required=True)

    build = actions.add_parser("build", help="index a repository (the default: `codespec index PATH`)")
    build.add_argument("path", metavar="PATH", help="the repository's folder")
    build.add_argument("--out", metavar="FILE", help="index file to write (default: in the cache dir, named after PATH)")
    build.add_argument("--json", action="store_true", help='print {"files", "tokens", "seconds", "bytes", ...}')
    add_settings_arguments(build, TOKENIZER_FIELDS)
    build.set_defaults(handler=lambda a: _build(Path(a.path), a))

    stats = actions.add_parser("stats", help="what an index file holds")
    stats.add_argument("file", metavar="FILE")
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.set_defaults(handler=lambda a: _stats(Path(a.file), a))

    query = actions.add_parser("query", help="show the match and the draft for TEXT (debugging)")
    query.add_argument("file", metavar="FILE")
    query.add_argument("text", metavar="TEXT", help="the context; its end is matched")
    query.add_argument("--max-tokens", type=int, default=16, metavar="N", help="draft tokens at most (16)")
    query.add_argument("--tree", action="store_true", help="a draft tree, not only the most frequent path")
    query.add_argument("--json", action="store_true", help="print one JSON object")
    add_settings_arguments(query, TOKENIZER_FIELDS)
    query.set_defaults(handler=lambda a: _query(Path(a.file), a.text, a))


def implicit_build(argv: list[str]) -> list[str]:
    """`codespec index PATH ...` means `codespec index build PATH ...`."""
    if len(argv) >= 2 and argv[0] == "index" and argv[1] not in (*ACTIONS, "-h", "--help"):
        return ["index", "build", *argv[1:]]
    return argv


def _build(root: Path, args: argparse.Namespace) -> int:
    from codespec.indexing import build_repository_index, default_index_path
    from codespec.models.loading import load_tokenizer

    if not root.is_dir():
        raise CodespecError(f"{root}: not a directory; give the repository's folder")
    settings = settings_from_args(args)
    out = Path(args.out) if args.out else default_index_path(settings.cache_dir, root)
    report = build_repository_index(root, load_tokenizer(settings), out, progress=not args.json)
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(f"indexed {report.files:,} files, {report.tokens:,} tokens in {report.seconds:.1f} s "
              f"({report.reused_files:,} unchanged files reused) -> {report.path} ({report.bytes / 1e6:.1f} MB)")
    return 0


def _stats(path: Path, args: argparse.Namespace) -> int:
    from codespec.index import SuffixIndex

    started = time.perf_counter()
    index = SuffixIndex.load(path)
    seconds = time.perf_counter() - started
    static = index.stats()["static"]
    assert isinstance(static, dict)
    out = {"path": str(path), "root": index.static.stored.root if index.static else "", **static,
           "load_seconds": round(seconds, 4), "file_bytes": path.stat().st_size}
    print_facts(out, args.json)
    return 0


def _query(path: Path, text: str, args: argparse.Namespace) -> int:
    from codespec.index import SuffixIndex
    from codespec.indexing import tokenizer_fingerprint
    from codespec.models.loading import load_tokenizer
    from codespec.prompts import encode

    tokenizer = load_tokenizer(settings_from_args(args))
    index = SuffixIndex.load(path, tokenizer=tokenizer_fingerprint(tokenizer))
    context = encode(tokenizer, text)
    index.draft(context[-1:], max_tokens=1)  # first call loads the compiled kernels
    started = time.perf_counter()
    draft = index.draft(context, max_tokens=args.max_tokens, tree=args.tree)
    micros = (time.perf_counter() - started) * 1e6
    matched = tokenizer.decode(context[len(context) - draft.match_len :]) if draft.match_len else ""
    nodes = [{"token": tokenizer.decode([t]), "id": t, "parent": p, "count": c}
             for t, p, c in zip(draft.token_ids, draft.parents, draft.counts)]
    if args.json:
        print(json.dumps({"match_len": draft.match_len, "matched": matched, "source": draft.source,
                          "draft": nodes, "micros": round(micros, 1)}))
        return 0
    print(f"matched {draft.match_len} tokens ({draft.source}, {micros:.0f} us): {matched!r}")
    if draft.is_chain:
        print(f"draft: {tokenizer.decode(list(draft.token_ids))!r}  counts {list(draft.counts)}")
    else:
        for i, node in enumerate(nodes):
            print(f"  [{i}] parent {node['parent']:>3}  count {node['count']:>4}  {node['token']!r}")
    sys.stdout.flush()
    return 0
