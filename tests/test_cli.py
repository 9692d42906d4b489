"""The command line's seams: version, help, and one-line errors that name the input and the
fix, all raised before any model loads."""

from __future__ import annotations

import pytest

import mappa
from mappa.cli import main
from mappa.experiment.spec import shipped_configs


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"mappa {mappa.__version__}"


def test_help_opens_with_a_whole_plain_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    description = " ".join(out.split("\n\n")[1].split())  # the paragraph after the usage
    assert "``" not in out
    assert description[0].isupper() and description.endswith(".")
    assert "train" in description and "experiment" in description


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: every error here must come before it."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("mappa.run.build.load_policies", refuse)


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err.strip()


def test_an_override_typo_is_named_with_the_closest_key(
    no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "rl.kl_betta=0.1"]) == 2
    error = _one_line_error(capsys)
    assert error == "mappa: override rl.kl_betta=0.1: unknown key; did you mean rl.kl_beta?"


@pytest.mark.parametrize("command", ["train", "eval"])
def test_an_experiment_file_as_a_run_config_points_to_mappa_experiment(
    command: str, no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = shipped_configs() / "experiments" / "process_vs_outcome_cpu.yaml"
    assert main([command, "--config", str(path)]) == 2
    error = _one_line_error(capsys)
    assert error.startswith(f"mappa: {path} is an experiment file (it has base, seeds, arms)")
    assert error.endswith(f"run it with: mappa experiment {path}")
