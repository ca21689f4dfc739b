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
