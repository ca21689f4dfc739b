"""docs/settings.md is the settings' own reference, generated from their fields: a
setting added, renamed or redescribed without regenerating it fails here."""

from __future__ import annotations

from pathlib import Path

from codespec.settings import reference_markdown

DOC = Path(__file__).parents[1] / "docs" / "settings.md"


def test_the_settings_reference_is_current():
    assert DOC.read_text(encoding="utf-8") == reference_markdown(), (
        "docs/settings.md is stale: python -c 'from codespec.settings import reference_markdown as r; "
        "print(r(), end=\"\")' > docs/settings.md")
