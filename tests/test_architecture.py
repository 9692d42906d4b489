"""The import-layer contracts `make lint` checks ([tool.importlinter] in pyproject.toml) hold
on the package, and break on an upward import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
LINT = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="the dev extra installs import-linter")


def _lint(package_parent: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports with the repo's contracts, on the ``mappa`` found under ``package_parent``."""
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(LINT), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
        cwd=package_parent,
    )


def test_the_package_keeps_its_layers() -> None:
    result = _lint(ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "import layers KEPT" in result.stdout
    assert "the run layer does not import the report KEPT" in result.stdout
    assert "the checkpoint imports no domain package KEPT" in result.stdout


LAYERS = "import layers"


@pytest.mark.parametrize(
    ("module", "imported", "contract"),
    [
        ("config/schema.py", "mappa.cli", LAYERS),  # the leaf config reaching the top
        ("rl/core.py", "mappa.report", LAYERS),  # pure math reaching the viewer
        ("coach/base.py", "mappa.rl.core", LAYERS),  # a sibling: coach and rl are independent
        ("run/models.py", "mappa.cluster.launch", LAYERS),  # a port importing its Ray side
        ("cluster/worker.py", "mappa.run.loop", LAYERS),  # an implementation reaching the loop
        # downward imports the layers allow and a forbidden contract refuses:
        ("run/loop.py", "mappa.report.summary", "the run layer does not import the report"),
        ("run/checkpoint.py", "mappa.rl.update", "the checkpoint imports no domain package"),
    ],
)
def test_an_import_against_a_contract_breaks_it(
    tmp_path: Path, module: str, imported: str, contract: str
) -> None:
    shutil.copytree(ROOT / "src" / "mappa", tmp_path / "mappa")
    target = tmp_path / "mappa" / module
    target.write_text(target.read_text() + f"\nimport {imported}  # noqa: E402, F401\n")
    result = _lint(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{contract} BROKEN" in result.stdout
    assert contract == LAYERS or f"{LAYERS} KEPT" in result.stdout  # that contract alone
    importer = "mappa." + module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {imported}" in result.stdout
