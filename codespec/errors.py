"""Errors a user can act on: each message is one line that says what to do."""

from __future__ import annotations


class CodespecError(Exception):
    """Base of every error codespec reports to a user (CLI: one line, exit code 2)."""


class ModelError(CodespecError):
    """A model cannot be found, verified, prepared or loaded."""


class RequestError(CodespecError):
    """A generation request is invalid (empty prompt, bad limits, too long for the model)."""


class SettingError(CodespecError, ValueError):
    """An environment setting holds a value codespec does not know (CODESPEC_FORWARD, ...)."""


def error_line(error: object, flags: tuple[str, ...] = (), prefix: str = "CODESPEC_") -> str:
    """A pydantic ValidationError of Settings as one line naming where the value came
    from: `--flag` for a field in `flags` (given on the command line), else its variable."""
    first = error.errors()[0]  # type: ignore[attr-defined]
    loc = [str(part) for part in first["loc"]]
    if loc and loc[0] in flags:
        return f"--{loc[0].replace('_', '-')} {first['input']}: {first['msg'].lower()}"
    return f"{prefix}{'_'.join(loc).upper()}={first['input']!r}: {first['msg'].lower()}"
