"""CLI flags built from `Settings` fields, so that `--help` and the environment agree.

>>> import argparse
>>> p = argparse.ArgumentParser(); add_settings_arguments(p, ["max_draft_tokens"])
>>> settings_from_args(p.parse_args(["--max-draft-tokens", "4"])).max_draft_tokens
4
"""

from __future__ import annotations

import argparse
import json
import typing
from typing import Iterable

from pydantic import ValidationError

from codespec.errors import CodespecError, error_line
from codespec.settings import Settings

MODEL_FIELDS = ("model", "dtype", "device", "quantize", "cache_dir", "threads")
SPECULATION_FIELDS = ("draft_policy", "max_draft_tokens", "min_match_tokens", "max_match_tokens", "look_ahead",
                      "draft_model", "draft_model_window")
CACHE_FIELDS = ("kv_cache_mb", "kv_slot_tokens", "prefill_chunk_tokens")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_settings_arguments(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    """Add one flag per named setting; unset flags fall back to env and defaults."""
    for name in names:
        field = Settings.model_fields[name]
        choices = typing.get_args(field.annotation) if typing.get_origin(field.annotation) is typing.Literal else None
        env = f"CODESPEC_{name.upper()}"
        parser.add_argument(
            _flag(name),
            dest=f"setting_{name}",
            default=None,
            choices=choices,
            metavar=None if choices else name.upper(),
            help=f"{field.description} [env {env}]",
        )


def settings_from_args(args: argparse.Namespace, config: str | None = None) -> Settings:
    """Settings from CODESPEC_* env (over the TOML file `config`, where given), overridden
    by the flags the user gave."""
    given = {
        key.removeprefix("setting_"): value
        for key, value in vars(args).items()
        if key.startswith("setting_") and value is not None
    }
    try:
        return Settings.with_file(config, **given) if config else Settings(**given)
    except ValidationError as exc:
        raise CodespecError(error_line(exc, tuple(given))) from None


def print_facts(facts: dict[str, object], as_json: bool) -> None:
    """One JSON object, or one aligned `key: value` line per fact."""
    if as_json:
        print(json.dumps(facts))
        return
    width = max((len(k) for k in facts), default=0)
    for key, value in facts.items():
        print(f"{key:>{width}}: {value}")
