"""`codespec serve`: the HTTP endpoint for agents and editors (the project's main job).

    codespec serve                               # default model, indexes the current directory
    codespec serve --port 8080 --index repo.csidx
    CODESPEC_API_KEY=secret codespec serve --host 0.0.0.0
    codespec serve --upstream http://gpu-box:8000    # routes here, generation on a vLLM / SGLang server
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from typing import Any

from codespec.cli.options import (
    CACHE_FIELDS,
    MODEL_FIELDS,
    SPECULATION_FIELDS,
    add_settings_arguments,
    settings_from_args,
)
from codespec.errors import CodespecError

SERVE_FIELDS = ("host", "port", "api_key", "index", "repo", "index_max_mb", "upstream", "upstream_api_key",
                "max_tokens_limit", "infill_layout", "next_edit_layout", "infill_max_tokens", "max_request_bytes", "max_header_bytes",
                "header_timeout_s", "body_timeout_s", "idle_timeout_s", "max_active_requests", "max_waiting_requests",
                "log_file")


def register(commands: Any) -> None:
    p = commands.add_parser("serve", help="serve OpenAI- and llama.cpp-compatible HTTP routes",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="a TOML file of settings (flags and env override it)")
    add_settings_arguments(p, SERVE_FIELDS + MODEL_FIELDS + SPECULATION_FIELDS + CACHE_FIELDS)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="what the log keeps; per-request lines only at debug")
    p.add_argument("--exit-when-unused", metavar="DIR",
                   help="exit once no process named in DIR (a file per pid) has been alive for "
                        "CODESPEC_SHARED_GRACE_S (60 s); `codespec lsp --shared` starts its shared server so")
    p.set_defaults(handler=run)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    from codespec.server.app import create_app, load_backend
    from codespec.server.http import serve
    from codespec.server.logs import configure_server_logging

    if args.config:
        if not os.path.isfile(args.config):
            raise CodespecError(f"--config {args.config}: no such file")
    settings = settings_from_args(args, config=args.config)
    configure_server_logging(args.log_level, settings.log_file)
    if not is_loopback(settings.host) and not settings.api_key:
        raise CodespecError(f"--host {settings.host} is reachable from other machines: set an API key "
                            "(CODESPEC_API_KEY or --api-key) or bind to 127.0.0.1")
    if args.exit_when_unused:
        from pathlib import Path

        from codespec.lsp.shared import exit_when_unused

        exit_when_unused(Path(args.exit_when_unused))  # watching from the start: editors gone mid-load too
    backend = load_backend(settings)  # before binding: a bad model or index fails here, in one line
    try:
        # log_config None: uvicorn's loggers go through the handler configured above
        serve(create_app(settings, backend=backend), settings, on_shutdown=backend.drain, log_level=args.log_level,
              log_config=None, access_log=args.log_level == "debug")
    finally:
        backend.close()
    return 0
