"""The command line's seams: version, help, and one-line errors that name the input and the
fix, all raised before any model loads."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

import mappa
from mappa.cli import default_config, main
from mappa.config import RunConfig, load_config
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


def test_eval_refuses_missing_adapters_before_a_model_loads(
    tmp_path: Path, no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-run"
    assert main(["eval", "--adapters", str(missing)]) == 2
    assert _one_line_error(capsys) == (
        f"mappa: --adapters {missing}: no such directory; give a run dir or its adapters/ dir"
    )
    (tmp_path / "adapters" / "verifier").mkdir(parents=True)  # the others' are missing
    assert main(["eval", "--adapters", str(tmp_path)]) == 2
    error = _one_line_error(capsys)
    assert f"--adapters {tmp_path / 'adapters'}: no adapter for problem_solver" in error


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--temperature", "-1"], "--temperature -1.0: Input should be greater than or equal to 0"),
        (["--samples", "0"], "--samples 0: Input should be greater than or equal to 1"),
        (
            ["--samples", "4", "--temperature", "0"],
            "--samples 4 --temperature 0.0: samples > 1 needs temperature > 0 (greedy samples "
            "are identical)",
        ),
    ],
)
def test_eval_flags_out_of_range_are_one_line(
    flags: list[str], error: str, no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", *flags]) == 2
    assert _one_line_error(capsys) == f"mappa: {error}"


def test_a_flag_argparse_refuses_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--samples", "many"])
    assert exit_.value.code == 2
    assert _one_line_error(capsys) == (
        "mappa eval: argument --samples: invalid int value: 'many'; see mappa eval --help"
    )


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib (the optional ``report`` extra) as if it were not installed."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)


@pytest.mark.parametrize(
    ("command", "name", "message"),
    [
        (
            "report",
            "no-run",
            "no such run directory; give a run directory `mappa train` wrote (its run_dir)",
        ),
        ("experiment", "none.yaml", "experiment file not found"),
    ],
)
def test_a_missing_path_is_named_before_matplotlib_is_needed(
    command: str,
    name: str,
    message: str,
    tmp_path: Path,
    no_matplotlib: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    missing = tmp_path / name
    assert main([command, str(missing)]) == 2
    assert _one_line_error(capsys) == f"mappa: {missing}: {message}"


def _fake_train(capsys: pytest.CaptureFixture[str], seen: list[str]) -> Callable[..., int]:
    """A fake ``_train`` that records what was printed before training would start."""

    def fake(cfg: RunConfig, resume: Path | None, stop_after: int | None) -> int:
        seen.append(capsys.readouterr().out)
        return 0

    return fake


def test_a_bare_train_says_what_it_will_run_before_loading(
    monkeypatch: pytest.MonkeyPatch, no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[str] = []
    monkeypatch.setattr("mappa.cli._train", _fake_train(capsys, seen))
    assert main(["train", "train.steps=3", "run_dir=runs/here"]) == 0
    model = load_config(default_config()).model.path
    assert seen == [
        f"mappa train: the demo config {default_config()} (no --config given): 3 steps with "
        f"{model}, run dir runs/here\n"
    ]
    seen.clear()  # the demo's own run dir has {time} in it: the time is shown, filled in
    assert main(["train", "train.steps=3"]) == 0
    [line] = seen
    assert "{time}" not in line and re.search(r"run dir runs/demo-\d{8}-\d{6}\n$", line)
    seen.clear()  # a run stopped early says so; one that would stop at its end does not
    for stop, steps in (("1", "the first 1 of 3 steps"), ("3", "3 steps"), ("9", "3 steps")):
        assert main(["train", "train.steps=3", "run_dir=runs/here", "--stop-after", stop]) == 0
        assert seen.pop().startswith(f"mappa train: the demo config {default_config()} (no "
                                     f"--config given): {steps} with ")  # fmt: skip


def test_overrides_are_taken_after_options_too(
    tmp_path: Path, no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's ``mappa experiment EXPERIMENT.yaml [--out DIR] [key.path=value ...]``:
    an override after an option reaches the runs (its typo is named as an override)."""
    path = shipped_configs() / "experiments" / "credit_controls_cpu.yaml"
    out = tmp_path / "out"
    assert main(["experiment", str(path), "--out", str(out), "rl.kl_betta=0.1"]) == 2
    assert "override rl.kl_betta=0.1: unknown key; did you mean rl.kl_beta?" in (
        _one_line_error(capsys)
    )
    assert not out.exists()
    demo = str(default_config())
    assert main(["train", "train.steps=1", "--config", demo, "rl.kl_betta=0.1"]) == 2
    assert _one_line_error(capsys).startswith("mappa: override rl.kl_betta=0.1: unknown key")


def test_an_unknown_argument_is_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["train", "train.steps=1", "--bogus", "extra"])
    assert exit_.value.code == 2
    assert _one_line_error(capsys) == (
        "mappa train: unrecognized arguments: --bogus extra; see mappa train --help"
    )


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["trian"], "mappa: argument command: invalid choice: 'trian' (did you mean train?)"),
        (
            ["coach-serve", "--server", "llamcpp"],
            "mappa coach-serve: argument --server: invalid choice: 'llamcpp' (did you mean "
            "llamacpp?)",
        ),
    ],
)
def test_a_mistyped_choice_names_the_closest(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert _one_line_error(capsys).startswith(f"{error}; see mappa")


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["eval", "--limit", "0"], "mappa eval: argument --limit: 0: give at least 1"),
        (["train", "--stop-after", "0"], "mappa train: argument --stop-after: 0: give at least 1"),
        (["eval", "--limit", "-1"], "mappa eval: argument --limit: -1: give at least 1"),
        (
            ["coach-check", "--episodes", "runs/x", "--limit", "0"],
            "mappa coach-check: argument --limit: 0: give at least 1",
        ),
        (
            ["coach-serve", "--port", "99999"],
            "mappa coach-serve: argument --port: 99999: give 0-65535 (0: a free port)",
        ),
    ],
)
def test_a_number_out_of_range_is_refused_before_anything_loads(
    argv: list[str],
    error: str,
    monkeypatch: pytest.MonkeyPatch,
    no_model: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a coach server was made")

    monkeypatch.setattr("mappa.coach.servers.make_server", refuse)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert _one_line_error(capsys) == f"{error}; see {error.split(':')[0]} --help"


@pytest.mark.parametrize("name", ["smoke", "smoke.yaml"])
def test_config_takes_the_name_of_a_shipped_config(
    name: str, monkeypatch: pytest.MonkeyPatch, no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """As an experiment's ``base:`` does; --help calls the default config ``demo``."""
    seen: list[str] = []
    monkeypatch.setattr("mappa.cli._train", _fake_train(capsys, seen))
    assert main(["train", "--config", name, "run_dir=runs/here"]) == 0
    assert seen[0].startswith(f"mappa train: config {shipped_configs() / 'smoke.yaml'}: ")


def test_a_config_that_is_no_file_says_what_it_is_and_which_names_there_are(
    tmp_path: Path, no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    names = ", ".join(sorted(p.stem for p in shipped_configs().glob("*.yaml")))
    assert "demo" in names and "smoke" in names
    assert main(["train", "--config", "smok"]) == 2
    assert _one_line_error(capsys) == (
        f"mappa: --config smok: no such file, nor a shipped config; give a config YAML file or "
        f"one of {names}"
    )
    assert main(["eval", "--config", str(tmp_path)]) == 2
    assert _one_line_error(capsys) == (
        f"mappa: --config {tmp_path}: is a directory; give a config YAML file or one of {names}"
    )


def test_resume_says_what_the_path_is_instead_of_a_run(
    tmp_path: Path, no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("")
    for path, problem in [
        (tmp_path / "missing", "no such run directory"),
        (file, "is a file; give a run directory"),
        (tmp_path, "not a training run (no config.yaml)"),
    ]:
        assert main(["train", "--resume", str(path)]) == 2
        assert _one_line_error(capsys) == f"mappa: {path}: {problem}"


def _finished_run(run_dir: Path, steps: int) -> Path:
    """A run dir as ``mappa train`` leaves one after ``steps`` steps of the demo config: its
    config.yaml and its final checkpoint (taken as it is: no checksums recorded)."""
    cfg = load_config(default_config(), [f"train.steps={steps}", f"run_dir={run_dir}"])
    (run_dir / "checkpoints" / f"step-{steps:06d}").mkdir(parents=True)
    (run_dir / "checkpoints" / f"step-{steps:06d}" / "checkpoint.json").write_text(
        json.dumps({"step": steps})
    )
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return run_dir


def test_resuming_a_finished_run_says_how_to_extend_it_before_loading(
    tmp_path: Path, no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _finished_run(tmp_path / "run", 2)
    assert main(["train", "--resume", str(run_dir)]) == 2
    assert _one_line_error(capsys) == (
        f"mappa: {run_dir}: the run already did 2 steps (train.steps=2); to extend it, resume "
        "with train.steps=M, M > 2"
    )
    assert main(["train", "--resume", str(run_dir), "train.steps=1"]) == 2
    assert "already did 2 steps (train.steps=1)" in _one_line_error(capsys)


def test_resuming_with_another_config_names_the_keys_in_one_short_line(
    tmp_path: Path, no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The smoke config differs from the demo's in its agents (a screenful each) and a
    dozen other keys: the first few are named, long values left out, the rest counted."""
    run_dir = _finished_run(tmp_path / "run", 2)
    smoke = str(shipped_configs() / "smoke.yaml")
    assert main(["train", "--resume", str(run_dir), "--config", smoke]) == 2
    error = _one_line_error(capsys)
    assert error.startswith(f"mappa: {run_dir}: the config differs from the run's config.yaml in ")
    assert "agents, " in error and re.search(r"\(\S+ -> \S+\)", error)
    assert re.search(r" and \d+ more; ", error) and len(error) < 400
    assert error.endswith(
        "resume with the run's own config, changing only keys `mappa train --help` lists under "
        "--resume"
    )


def test_a_bare_eval_says_what_it_will_evaluate_before_loading(
    monkeypatch: pytest.MonkeyPatch, no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[str] = []

    def fake(cfg: RunConfig, job: object) -> int:
        seen.append(capsys.readouterr().out)
        return 0

    monkeypatch.setattr("mappa.cli._eval", fake)
    assert main(["eval"]) == 0
    cfg = load_config(default_config())
    assert seen == [
        f"mappa eval: the demo config {default_config()} (no --config given): "
        f"{cfg.model.path} untrained (no --adapters) on {cfg.eval.num_tasks} tasks from "
        "arithmetic (held out), output dir runs/eval-base\n"
    ]
    seen.clear()
    assert main(["eval", "--config", "smoke", "--limit", "3", "--out", "here"]) == 0
    [line] = seen
    assert line.startswith(f"mappa eval: config {shipped_configs() / 'smoke.yaml'}: ")
    assert line.endswith(" on 3 tasks from arithmetic (held out), output dir here\n")


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["eval", "--tasks", "{tmp}/missing.json"],
            "--tasks: {tmp}/missing.json: no such task file or dataset directory",
        ),
        (  # the held-out set's column keys are eval.*; a row without answer is not graded
            ["eval", "--tasks", "{tmp}/questions.jsonl"],
            "--tasks: {tmp}/questions.jsonl: line 1 has no 'answer' or 'final_answer' answer; "
            "its columns: prompt. Name the answer's column with eval.answer_field, or set "
            "tasks.require_answers: false for tasks without one (left out of the accuracy).",
        ),
        (
            ["train", "tasks.source=arithmetc"],
            "tasks.source: arithmetc: no such task file or dataset directory; did you mean "
            "arithmetic?",
        ),
    ],
)
def test_a_task_source_that_cannot_load_names_its_flag_or_key(
    argv: list[str],
    error: str,
    tmp_path: Path,
    no_model: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "questions.jsonl").write_text('{"prompt": "1+1?"}\n')
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    assert _one_line_error(capsys) == f"mappa: {error.format(tmp=tmp_path)}"


@pytest.mark.parametrize(
    ("command", "text", "fix"),
    [
        (["train", "--config"], "rl:\n  lr: [1, 2\n", "; fix the YAML syntax"),
        (["eval", "--config"], "# nothing yet\n", "or omit --config for the demo config"),
        (["experiment"], "rl: {lr: 0.001}\n", "run it with: mappa train --config {path}"),
        (["experiment"], "", "an experiment names its base, seeds and arms (docs/experiments.md)"),
        (["experiment"], "base: smoke\nseeds: [0\n", "; fix the YAML syntax"),
    ],
)
def test_a_file_that_is_not_what_the_command_reads_is_one_line(
    command: list[str],
    text: str,
    fix: str,
    tmp_path: Path,
    no_model: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A YAML syntax error, an empty file, a run config given as an experiment: the file
    named, the fix said, nothing loaded."""
    path = tmp_path / "file.yaml"
    path.write_text(text)
    assert main([*command, str(path)]) == 2
    error = _one_line_error(capsys)
    assert error.startswith(f"mappa: {path}") and error.endswith(fix.format(path=path))


def test_a_dry_run_refused_on_a_cpu_is_the_problem_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Where there is no memory estimate (a CPU run), a refused dry run prints the problem
    and nothing before it; one that passes says there is no estimate and why."""
    assert main(["train", "--dry-run", "tasks.source=/nope.json"]) == 2
    out, err = capsys.readouterr()
    assert (
        out == ""
        and err == "mappa: tasks.source: /nope.json: no such task file or dataset directory\n"
    )
    assert main(["train", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("memory estimate: none (a CPU run, ")


def test_ctrl_c_is_one_line_with_where_the_run_can_go_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C anywhere in a command: exit 130 (as a shell reports an interrupted program),
    ``mappa: interrupted`` and the notes the loop added (its resume hint), no traceback."""
    import mappa.cli as cli

    def interrupted(argv: list[str] | None) -> int:  # a command the user interrupts
        err = KeyboardInterrupt()
        err.add_note("The newest checkpoint is step 2 (...); continue with `mappa train ...`.")
        raise err

    monkeypatch.setattr(cli, "_command", interrupted)
    assert main(["train"]) == 130
    assert capsys.readouterr().err == (
        "mappa: interrupted\n"
        "The newest checkpoint is step 2 (...); continue with `mappa train ...`.\n"
    )


def test_outputs_that_cannot_be_written_are_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file where an output directory goes, a path under a file, a run_dir holding
    another run: one line naming the flag or key, before a model loads or a run starts."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    experiment = str(Path(mappa.__file__).parent / "configs/experiments/credit_controls_cpu.yaml")
    cases = [
        (["train", f"run_dir={a_file}"], f"run_dir {a_file}: is a file; choose another run_dir"),
        (["train", f"run_dir={run}"], f"continue it with `mappa train --resume {run}`"),
        (["eval", "--out", str(a_file)], f"--out: {a_file} is a file; a directory is needed"),
        (["report", str(run), "--out", f"{a_file}/x"], f"--out: cannot create {a_file}/x"),
        (["experiment", experiment, "--records", str(a_file)], f"--records: {a_file} is a"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (argv, err)


def test_an_unknown_option_names_the_closest_option_or_the_override_meant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cases = [
        (["train", "--dryrun"], "mappa train: unrecognized arguments: --dryrun (did you mean "
         "--dry-run?); see mappa train --help"),
        (["train", "--steps"], "(config keys are key=value overrides: train.steps=...?)"),
        (["train", "--rl.lr=1e-4"], "(config keys are key=value overrides: rl.lr=1e-4?)"),
        (["report", "x", "--outt", "y"], "(did you mean --out?); see mappa report --help"),
    ]  # fmt: skip
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (argv, err)
