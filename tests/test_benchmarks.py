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


def test_gpu_check_takes_the_vllm_engine_wherever_vllm_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``make gpu-check`` exercises the paper's engine where vLLM is installed, and stays on
    the hf engine where it is not (CI's main venv)."""
    script = Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("benchmark_gpu_check", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "benchmark_gpu_check", module)
    spec.loader.exec_module(module)
    real = importlib.util.find_spec
    for installed, engine in ((True, "vllm"), (False, "hf")):
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a, on=installed: (
                (object() if on else None) if name == "vllm" else real(name, *a)
            ),
        )
        assert module.rollout_engine("auto") == engine
    assert module.rollout_engine("hf") == "hf"
