"""The Python API (``mappa.train``, ``mappa.evaluate``, ``mappa.load_config``) runs what
the command line runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import mappa
from mappa.cli import default_config
from mappa.config import RunConfig, load_config


def test_train_reads_a_config_file_with_overrides_and_runs_the_loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[RunConfig, Path | None]] = []

    def fake_loop(cfg: RunConfig, resume: Path | None = None) -> Path:  # the loop, faked
        seen.append((cfg, resume))
        return tmp_path

    monkeypatch.setattr("mappa.run.loop.train", fake_loop)
    assert mappa.train(str(default_config()), ["seed=7"], resume=str(tmp_path)) == tmp_path
    [(cfg, resume)] = seen
    assert cfg.seed == 7 and cfg == load_config(default_config(), ["seed=7"])
    assert resume == tmp_path
    assert mappa.train(cfg) == tmp_path and seen[-1] == (cfg, None)
    with pytest.raises(ValueError, match="overrides apply to a config file"):
        mappa.train(cfg, ["seed=8"])


def test_load_config_checks_as_the_command_line_does() -> None:
    from mappa.config import ConfigError

    assert mappa.ConfigError is ConfigError and "ConfigError" in mappa.__all__
    assert mappa.load_config(default_config(), ["seed=7"]).seed == 7
    with pytest.raises(ConfigError, match="did you mean rl.lr"):
        mappa.load_config(default_config(), ["rl.lrr=0.1"])
    with pytest.raises(TypeError, match=r"give a list of key=value strings, e.g. \['rl.lr=1'\]"):
        mappa.load_config(default_config(), "rl.lr=1")


def test_a_config_is_a_path_a_shipped_name_or_a_run_config() -> None:
    """As ``--config`` takes: a shipped config by name; a dict (a config already read) is
    one line saying how to make it a RunConfig, not ``Path``'s message about os.PathLike."""
    assert mappa.load_config("demo") == load_config(default_config())
    message = (
        "config: give a config file's path or a shipped config's name, not a dict (train and "
        "evaluate take a RunConfig too: mappa.config.RunConfig.model_validate(d) builds one "
        "from a dict d)"
    )
    for call in (mappa.load_config, mappa.train):
        with pytest.raises(TypeError) as err:
            call({"seed": 1})  # type: ignore[arg-type]
        assert str(err.value) == message


def test_python_dash_m_mappa_runs_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mappa", "--version"], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == f"mappa {mappa.__version__}"


def test_evaluate_refuses_missing_adapters_before_a_model_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As ``mappa eval --adapters`` does: one line naming the argument, the path and the
    fix, not a PEFT traceback after the base model loaded."""
    from mappa.run import evaluation

    def no_load(*_: object) -> None:
        raise AssertionError("a model loaded")

    monkeypatch.setattr(evaluation, "evaluate_model", no_load)
    with pytest.raises(FileNotFoundError) as err:
        mappa.evaluate(default_config(), adapters=tmp_path / "missing")
    assert str(err.value) == (
        f"adapters= {tmp_path / 'missing'}: no such directory; give a run dir or its adapters/ dir"
    )
    (tmp_path / "run" / "adapters" / "problem_solver").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"no adapter for problem_solver, code_executor"):
        mappa.evaluate(default_config(), adapters=tmp_path / "run")


@pytest.mark.integration
def test_evaluate_runs_what_mappa_eval_runs(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The team on the config's held-out set: eval.json written, its metrics returned."""
    import json

    from conftest import tiny_run_config

    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run", "eval.num_tasks=2")
    result = mappa.evaluate(cfg, out=tmp_path / "eval")
    written = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert result["tasks"] == written["tasks"] == 2
    assert result["accuracy"] == written["accuracy"] and len(result["per_task"]) == 2
