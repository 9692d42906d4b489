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


def test_the_simulated_look_tests_on_the_seeds_it_decides() -> None:
    """verdict_power's simulation of a look: the seed count comes from the first seeds'
    spread by the experiment's own rule, and the test is made on exactly that many."""
    import numpy as np

    from mappa.experiment.verdicts import paired_t, significant

    spec = importlib.util.spec_from_file_location(
        "verdict_power", Path(__file__).parents[1] / "benchmarks" / "verdict_power.py"
    )
    assert spec is not None and spec.loader is not None
    power = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(power)
    b = np.zeros((2, 10))
    a = np.array(
        [
            [0.10, 0.11, 0.10, 0.11, 0.10, 0.11, -0.5, -0.5, -0.5, -0.5],  # SD 0.006: 6 seeds
            [0.30, -0.10, 0.25, -0.05, 0.1, 0.2, 0.1, 0.2, 0.1, 0.2],  # SD 0.19: 10 seeds
        ]
    )
    seeds, calls = power.adaptive_calls(a, b, 4, {0.08: 8, 0.10: 10}, 6)
    assert seeds.tolist() == [6, 10]
    assert calls[0] and calls[0] == significant(paired_t(a[0, :6], b[0, :6]).p)
    assert calls[1] == significant(paired_t(a[1], b[1]).p)
    # a seed count no simulated experiment ended at has no share of calls, not numpy's nan
    assert power._share(calls[seeds == 8]) == "-"
    assert power._share(np.array([True, False])) == "0.500"
