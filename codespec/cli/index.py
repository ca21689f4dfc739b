"""`codespec index`: build, inspect and query a repository's suffix index.

    codespec index PATH [--out FILE] [--json]     build (again: re-tokenizes changed files only)
    codespec index stats FILE [--json]            what an index holds
    codespec index query FILE TEXT                the match and the draft for TEXT (debugging)
    codespec index export FILE --sglang OUT       the files as SGLang's external n-gram corpus (JSONL)
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


ACTIONS = ("build", "stats", "query", "export")


def register(commands: Any) -> None:
    p = commands.add_parser(
        "index", help="build (PATH), inspect (stats FILE) or query (query FILE TEXT) a suffix index",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", metavar="PATH | stats | query | export", required=True)

    build = actions.add_parser("build", help="index a repository (the default: `codespec index PATH`)")
    build.add_argument("path", metavar="PATH", help="the repository's folder")
    build.add_argument("--out", metavar="FILE", help="index file to write (default: in the cache dir, named after PATH)")
    build.add_argument("--json", action="store_true", help='print {"files", "tokens", "seconds", "bytes", ...}')
    add_settings_arguments(build, (*TOKENIZER_FIELDS, "index_max_mb"))
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

    export = actions.add_parser("export", help="write the index's files for another engine (SGLang)")
    export.add_argument("file", metavar="FILE", help="an index file (`codespec index PATH --out FILE`)")
    export.add_argument("--sglang", metavar="OUT", required=True,
                        help="JSONL for SGLang's --speculative-ngram-external-corpus-path")
    export.add_argument("--max-tokens", type=int, default=None, metavar="N",
                        help="stop before N tokens, separators included (SGLang's default limit: 10,000,000)")
    export.add_argument("--json", action="store_true", help="print one JSON object")
    add_settings_arguments(export, TOKENIZER_FIELDS)
    export.set_defaults(handler=lambda a: _export(Path(a.file), Path(a.sglang), a))


def implicit_build(argv: list[str]) -> list[str]:
    """`codespec index PATH ...` means `codespec index build PATH ...`."""
    if len(argv) >= 2 and argv[0] == "index" and argv[1] not in (*ACTIONS, "-h", "--help"):
        return ["index", "build", *argv[1:]]
    return argv


def _build(root: Path, args: argparse.Namespace) -> int:
    from codespec.indexing import build_repository_index, default_index_path
    from codespec.indexing.build import capped_message
    from codespec.models.loading import load_tokenizer

    if not root.is_dir():
        raise CodespecError(f"{root}: not a directory; give the repository's folder")
    settings = settings_from_args(args)
    out = Path(args.out) if args.out else default_index_path(settings.cache_dir, root)
    report = build_repository_index(root, load_tokenizer(settings), out, progress=not args.json,
                                    max_total_bytes=settings.index_max_mb << 20)
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(f"indexed {report.files:,} files, {report.tokens:,} tokens in {report.seconds:.1f} s "
              f"({report.reused_files:,} unchanged files reused) -> {report.path} ({report.bytes / 1e6:.1f} MB)")
        if report.skipped.over_cap:
            print(capped_message(root, report.files, report.skipped.taken_bytes, settings.index_max_mb << 20))
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


def _load_with_tokenizer(path: Path, args: argparse.Namespace) -> tuple[Any, Any]:
    """The index file and the model's tokenizer, refused when they do not belong together."""
    from codespec.index import SuffixIndex
    from codespec.indexing import tokenizer_fingerprint
    from codespec.models.loading import load_tokenizer

    index = SuffixIndex.load(path)  # a bad file fails here, before the tokenizer loads
    tokenizer = load_tokenizer(settings_from_args(args))
    index.check_tokenizer(tokenizer_fingerprint(tokenizer))
    return index, tokenizer


def _export(path: Path, out: Path, args: argparse.Namespace) -> int:
    from codespec.integrations.sglang import SGLANG_MAX_TOKENS, export_corpus

    limit = SGLANG_MAX_TOKENS if args.max_tokens is None else args.max_tokens
    if limit < 1:
        raise CodespecError(f"--max-tokens {limit}: give a positive number of tokens")
    if out.is_dir():
        raise CodespecError(f"--sglang {out}: a directory; give the JSONL file to write")
    index, tokenizer = _load_with_tokenizer(path, args)
    report = export_corpus(index, tokenizer, out, max_tokens=limit, progress=not args.json)
    if args.json:
        print(json.dumps(report.to_json()))
        return 0
    print(f"wrote {report.files:,} files, {report.tokens:,} tokens -> {report.path} ({report.bytes / 1e6:.1f} MB)")
    if report.left_out:
        print(f"left out {report.left_out:,} files over the {limit:,}-token limit: raise --max-tokens and "
              "SGLang's --speculative-ngram-external-corpus-max-tokens together")
    if report.retokenized:
        print(f"{report.retokenized:,} files tokenize differently in SGLang (they spell special tokens); "
              "their drafts may differ")
    print(f"serve with: --speculative-algorithm NGRAM --speculative-ngram-external-corpus-path {report.path}")
    return 0


def _query(path: Path, text: str, args: argparse.Namespace) -> int:
    from codespec.prompts import encode

    index, tokenizer = _load_with_tokenizer(path, args)
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
