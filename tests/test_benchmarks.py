"""Every benchmark script still imports against the package: they run rarely and by hand,
so a renamed or moved name would otherwise surface only when someone needs the numbers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parents[1] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_benchmark_script_imports(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"benchmark_{script.stem}"
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)  # main() runs only under __main__
    assert callable(getattr(module, "main", None))
