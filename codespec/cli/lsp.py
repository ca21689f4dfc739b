"""`codespec lsp`: the language server for editors' inline completions (stdio).

    codespec lsp                          # the embedded default model in this process
    codespec lsp --server http://127.0.0.1:8000   # share a running `codespec serve`,
                                                  # or a vLLM / SGLang OpenAI-compatible server
    codespec lsp --shared                 # one `codespec serve` per model for all editor windows
    codespec lsp --tcp 127.0.0.1:2087     # listen on a socket (debugging)
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, NoReturn

from codespec.cli.options import (
    CACHE_FIELDS,
    MODEL_FIELDS,
    SPECULATION_FIELDS,
    add_settings_arguments,
    settings_from_args,
)
from codespec.errors import CodespecError


def register(commands: Any) -> None:
    p = commands.add_parser("lsp", help="language server: inline completions for VS Code, Neovim, ...",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", metavar="URL",
                   help="use a running `codespec serve`, or a vLLM / SGLang server (FIM prompts built with "
                        "--model's tokenizer), instead of loading a model")
    p.add_argument("--shared", action="store_true",
                   help="share one local `codespec serve` per model among all editor windows (started on "
                        "first use, it exits a minute after its last editor); the VS Code extension's default")
    p.add_argument("--tcp", metavar="HOST:PORT", help="listen on a TCP socket instead of stdio")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                   help="stderr log level (default info: start-up, indexing and failures, never document "
                        "text; debug adds every protocol message)")
    add_settings_arguments(p, ("api_key", "max_active_requests", "index_max_mb", "next_edit_layout") + MODEL_FIELDS + SPECULATION_FIELDS + CACHE_FIELDS)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from codespec.lsp.server import build_server

    settings = settings_from_args(args)
    if args.server and args.shared:
        raise CodespecError("--server and --shared: give one (--shared starts or finds a local server itself)")
    if args.shared:
        def make_backend() -> Any:
            from codespec.lsp.shared import SharedBackend

            return SharedBackend(settings)
    elif args.server:
        if not args.server.startswith(("http://", "https://")):
            raise CodespecError(f"--server {args.server}: give a URL such as http://127.0.0.1:8000")

        def make_backend() -> Any:
            from codespec.lsp.remote_backend import RemoteBackend

            return RemoteBackend(lambda: remote_backend(args.server, settings))
    else:
        def make_backend() -> Any:
            from codespec.lsp.inprocess_backend import InProcessBackend

            return InProcessBackend(settings)

    address = None
    if args.tcp:
        host, _, port = args.tcp.rpartition(":")
        if not host or not port.isdigit():
            raise CodespecError(f"--tcp {args.tcp}: give HOST:PORT such as 127.0.0.1:2087")
        address = (host, int(port))
    # stdout carries the protocol: logs go to stderr
    configure_logging(args.log_level)
    serve(build_server(make_backend), address)


def serve(server: Any, address: tuple[str, int] | None = None) -> NoReturn:
    """Serve until the editor closes our stdin (or the socket) or sends `exit`, then end
    the process at once: a thread still loading the model or indexing would otherwise
    keep it, and its gigabytes, alive for minutes after the editor went.

    Over stdio the log goes to the editor as `window/logMessage`, each line at its level
    (lsp/logs.py), from the `initialize` request on; stderr keeps what comes before it and,
    after it, fatal errors only (everything at debug level)."""
    from codespec.lsp.logs import EditorLog
    from codespec.lsp.lifecycle import exit_now

    if address is None:
        root = logging.getLogger()
        debug = root.level <= logging.DEBUG
        editor_log = EditorLog(server, quiet=[] if debug else list(root.handlers))
        editor_log.setFormatter(logging.Formatter("%(message)s"))
        if not debug:
            editor_log.addFilter(_one_line)
        root.addHandler(editor_log)
        server.editor_log = editor_log
        server.start_io()
    else:
        server.start_tcp(*address)
    exit_now()


def configure_logging(name: str) -> None:
    """stderr logging at `name`. pygls logs every message it sends at info, whole documents
    included (megabytes per keystroke in a big file): it speaks only from debug."""
    level = getattr(logging, name.upper())
    logging.basicConfig(stream=sys.stderr, level=level, format="codespec-lsp %(levelname)s %(message)s")
    logging.getLogger().setLevel(level)  # also where a handler was already installed
    logging.captureWarnings(True)  # library deprecation warnings: log lines at their level, not raw stderr
    logging.getLogger("pygls").setLevel(level if level == logging.DEBUG else max(level, logging.WARNING))
    if level != logging.DEBUG:  # a malformed frame is one line, its traceback only at debug
        for handler in logging.getLogger().handlers:
            handler.addFilter(_one_line)


def _one_line(record: logging.LogRecord) -> bool:
    """No tracebacks: neither attached (`exc_info`) nor written into pygls' own messages
    ("Unable to deserialize message" carries one). A client that sends many malformed
    frames must not fill the editor's log, or a pipe nobody reads, with them."""
    record.exc_info, record.exc_text = None, None
    if record.name.startswith("pygls"):
        first = record.getMessage().splitlines()
        record.msg, record.args = (first[0] if first else ""), None
    return True


def remote_backend(url: str, settings: Any) -> Any:
    """`codespec serve` gets its own client (its /infill adds repository context); any
    other OpenAI-compatible engine gets FIM prompts built here with --model's tokenizer,
    checked against the engine's when it can tokenize."""
    from codespec.integrations.upstream import UpstreamClient
    from codespec.lsp.http_backend import HttpBackend

    client = UpstreamClient(url, settings.api_key)
    served = client.served_model()
    if served.is_codespec:
        return HttpBackend(url, settings.api_key)
    from codespec.lsp.engine_backend import EngineBackend
    from codespec.models.loading import load_tokenizer
    from codespec.nextedit.prompt import layout_for

    tokenizer = load_tokenizer(settings, progress=False)
    if not client.check_tokenizer(served.name, tokenizer):
        logging.getLogger("codespec.lsp").warning(
            "the engine at %s cannot tokenize: its tokenizer is assumed to be --model's", url)
    return EngineBackend(client, tokenizer, served, layout_for(settings.next_edit_layout, served.name))
