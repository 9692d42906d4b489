"""Docs generated from code stay in step with it."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_docs_stand_alone() -> None:
    """Users have the repo, not the team's ../shared directory."""
    for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        assert "../shared" not in path.read_text(), path


def test_readme_config_example_validates(tmp_path: Path) -> None:
    import re

    from mappa.config import load_config

    example = re.search(r"```yaml\n(run_dir.*?)```", (REPO / "README.md").read_text(), re.S)
    assert example, "the README's config example is gone"
    (tmp_path / "readme.yaml").write_text(example.group(1))
    cfg = load_config(tmp_path / "readme.yaml")
    assert [a.max_actions for a in cfg.agents] == [1, 3, 1] and cfg.eval.every == 1
