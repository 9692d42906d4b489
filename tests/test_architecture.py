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


@pytest.mark.parametrize(
    ("module", "upward"),
    [
        ("config/schema.py", "mappa.cli"),  # the leaf config reaching the top
        ("rl/core.py", "mappa.report"),  # pure math reaching the viewer
        ("coach/base.py", "mappa.rl.core"),  # a sibling: coach and rl are independent
        ("run/models.py", "mappa.cluster.launch"),  # a port importing its Ray implementation
        ("cluster/worker.py", "mappa.run.loop"),  # an implementation reaching the loop
    ],
)
def test_an_upward_import_breaks_the_contract(tmp_path: Path, module: str, upward: str) -> None:
    shutil.copytree(ROOT / "src" / "mappa", tmp_path / "mappa")
    target = tmp_path / "mappa" / module
    target.write_text(target.read_text() + f"\nimport {upward}  # noqa: E402, F401\n")
    result = _lint(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "import layers BROKEN" in result.stdout
    importer = "mappa." + module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {upward}" in result.stdout


@pytest.mark.parametrize(
    ("module", "downward", "contract"),
    [
        ("run/loop.py", "mappa.report.summary", "the run layer does not import the report"),
        ("run/checkpoint.py", "mappa.rl.update", "the checkpoint imports no domain package"),
    ],
)
def test_a_forbidden_downward_import_breaks_its_contract(
    tmp_path: Path, module: str, downward: str, contract: str
) -> None:
    """Imports the layers allow (the module sits above) that a forbidden contract refuses:
    the loop reaching the viewer, the checkpoint reaching a domain's guard."""
    shutil.copytree(ROOT / "src" / "mappa", tmp_path / "mappa")
    target = tmp_path / "mappa" / module
    target.write_text(target.read_text() + f"\nimport {downward}  # noqa: E402, F401\n")
    result = _lint(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "import layers KEPT" in result.stdout
    assert f"{contract} BROKEN" in result.stdout
    importer = "mappa." + module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {downward}" in result.stdout
