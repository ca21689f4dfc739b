"""codespec: code completion made fast by model-free, lossless suffix speculation."""

from __future__ import annotations

__version__ = "0.1.0"
