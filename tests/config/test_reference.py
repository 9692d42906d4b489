"""docs/config.md is what the schema generates."""

from __future__ import annotations

from pathlib import Path

from mappa.config import reference_markdown

REPO = Path(__file__).resolve().parents[2]


def test_config_reference_is_up_to_date() -> None:
    written = (REPO / "docs" / "config.md").read_text()
    assert written == reference_markdown() + "\n", "docs/config.md is stale: run `make docs`"
