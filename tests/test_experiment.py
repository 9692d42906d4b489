"""``mappa experiment``: the results math on fabricated metrics lines, the experiment file's
validation, and a tiny real experiment end to end (4 arms x 2 seeds x 2 steps)."""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from statistics import mean
from typing import Any

import pytest
import yaml
from conftest import tiny_run_config

from mappa.experiment import ExperimentError
from mappa.experiment.markdown import results_markdown
from mappa.experiment.results import ANSWERED, TRAIN_WINDOW, RunRecord, summarize
from mappa.experiment.runner import Experiment
from mappa.experiment.spec import load_experiment, plan_runs, shipped_configs
from mappa.provenance import note_code, source_revision

AGENTS = ("problem_solver", "code_executor", "verifier")


# ----------------------------------------------------------------- results (pure)
def fake_metrics(
    accuracies: list[float],
    heldout: dict[int, float],
    coach: float | None = None,
    graded: int = 100,
) -> list[dict[str, Any]]:
    """Fabricated metrics.jsonl lines: training accuracy per step (4 episodes each),
    held-out accuracy (and a
    fake behaviour key) over ``graded`` answers at the given step indices, a coach score for
    every agent if given. Every agent takes its optimizer step, except the verifier on a
    step with accuracy 0 (no reward signal, as an outcome-only batch of zeros)."""
    lines: list[dict[str, Any]] = []
    for step, acc in enumerate(accuracies):
        line: dict[str, Any] = {"step": step, "accuracy": acc, "episodes": 4}
        line.update({f"rl/{a}/skipped": "" for a in AGENTS})
        if acc == 0.0:
            line["rl/verifier/skipped"] = "no reward signal"
        if coach is not None:
            line.update({f"coach/{a}": coach + step for a in AGENTS})
        if step in heldout:
            line.update(
                {
                    "eval/accuracy": heldout[step],
                    "eval/tasks": graded,
                    "eval/graded": graded,
                    "eval/avg@1": heldout[step],
                    "eval/format_rate/verifier": 0.5 + step / 100,
                }
            )
        lines.append(line)
    return lines


FAKE_BASE = {"accuracy": 0.25, "tasks": 4, "format_rate/verifier": 0.4}


def _action(episode: str, agent: str, score: float, oracle: bool) -> dict[str, Any]:
    return {"episode_id": episode, "agent": agent, "turn": 0, "score": score,
            "flagged": False, "oracle": oracle, "correct": False}  # fmt: skip


ACTIONS = [  # one failed episode: the solver went wrong first and scored lowest
    _action("e1", "problem_solver", 1.0, False),
    {**_action("e1", "code_executor", 6.0, True), "tool_status": "ok"},
    _action("e1", "verifier", 3.0, False),
    _action("e2", "problem_solver", 8.0, True),
]


def test_results_table_over_seeds_and_verdicts() -> None:
    runs = [
        RunRecord(
            "process",
            0,
            fake_metrics([0.1] * 6 + [0.5] * 5, {4: 0.5, 10: 0.75}, 5.0),
            10.0,
            AGENTS,
            actions=ACTIONS,
        ),
        RunRecord("process", 1, fake_metrics([0.3] * 11, {4: 0.25, 10: 0.5}, 6.0), 30.0, AGENTS),
        RunRecord("outcome", 0, fake_metrics([0.0] * 11, {4: 0.0, 10: 0.0}), 8.0, AGENTS),
        RunRecord("outcome", 1, fake_metrics([0.2] * 11, {4: 0.25, 10: 0.25}), 12.0, AGENTS),
    ]
    results = summarize(runs, FAKE_BASE)
    process, outcome = results["arms"]["process"], results["arms"]["outcome"]
    assert [p["step"] for p in process["heldout"]] == [0, 5, 11]  # base, then steps done
    assert process["heldout"][0] == {
        "step": 0,
        "episodes": 0,
        "n": 1,
        "mean": 0.25,
        "min": 0.25,
        "max": 0.25,
        "std": None,
    }
    assert process["heldout"][1]["mean"] == 0.375 and process["heldout"][2]["n"] == 2
    assert [p["episodes"] for p in process["heldout"]] == [0, 20, 44]  # 4 a step
    assert process["final"]["mean"] == 0.625
    assert (process["final"]["min"], process["final"]["max"]) == (0.5, 0.75)
    assert process["final"]["std"] == pytest.approx(0.1767767)
    assert TRAIN_WINDOW == 5
    assert process["train_accuracy"]["mean"] == pytest.approx(mean([0.5, 0.3]))
    assert process["coach"]["verifier"]["start"]["mean"] == pytest.approx(
        mean([7.0, 8.0])
    )  # 5+2, 6+2
    assert process["coach"]["verifier"]["end"]["mean"] == pytest.approx(mean([13.0, 14.0]))
    assert outcome["coach"] == {}  # no coach asked, no coach rows
    fmt = process["behaviour"]["format_rate/verifier"]
    assert fmt["base"] == 0.4 and fmt["mean"] == pytest.approx(0.6)
    # bookkeeping left out; the accuracy given a formatted answer derived from the two: at
    # step 10 format rate 0.6, final accuracy 0.75 and 0.5 (the base: 0.25 / 0.4)
    assert set(process["behaviour"]) == {"format_rate/verifier", ANSWERED}
    answered = process["behaviour"][ANSWERED]
    assert answered["base"] == pytest.approx(0.625)
    assert (answered["min"], answered["max"]) == pytest.approx((0.5 / 0.6, 0.75 / 0.6))
    assert process["wall_s"]["mean"] == 20.0
    assert process["runs"]["process-s1"] == {
        "steps": 11,
        "final": 0.5,
        "train_accuracy": 0.3,
        "optimizer_steps": dict.fromkeys(AGENTS, 11),
        "wall_s": 30.0,
    }
    steps = outcome["optimizer_steps"]  # seed 0 never right: its verifier never stepped
    assert (steps["verifier"]["min"], steps["verifier"]["max"]) == (0, 11)
    assert steps["problem_solver"]["mean"] == 11
    [comparison] = results["comparisons"]  # every pair: no primary named
    assert comparison["role"] == "secondary" and comparison["test"] == "paired t"
    assert comparison["diff"] == pytest.approx(0.5)  # seeds' gaps 0.75 and 0.25: t 2, 1 df
    assert comparison["verdict"].startswith("undecided: 95 % CI -")
    page = results_markdown(results, "fake")
    assert "| arm | step 0 (0) | step 5 (20) | step 11 (44) |" in page  # episodes by then
    assert "| process | 0.250 (n=1) | 0.375 (0.250-0.500, sd 0.177, n=2) |" in page
    assert "| secondary | process | outcome | paired t | 0, 1 | 0.500 |" in page
    assert "| outcome | verifier | 5.5 (0.0-11.0, sd 7.8, n=2) |" in page
    # seed 0 of the outcome arm had no right episode in any of its 11 steps
    assert outcome["starved_steps"]["max"] == 11 and process["starved_steps"]["max"] == 0
    assert outcome["credit"] is None  # no actions recorded
    credit = process["credit"]
    assert credit["oracle_auc"]["problem_solver"] == {"auc": 1.0, "right": 1, "wrong": 1}
    assert credit["first_wrong_lowest"] == {"hits": 1, "episodes": 1}
    assert "| process | problem_solver | 1.000 | 1 / 1 |" in page
    assert "| process | 1 / 1 |" in page
    assert process["tool_outcomes"] == [
        {"agent": "code_executor", "status": "ok", "actions": 1, "mean_score": 6.0,
         "oracle_right": 1.0}
    ]  # fmt: skip
    assert outcome["tool_outcomes"] == []  # no actions recorded
    assert "| process | code_executor | ok | 1 | 6.00 | 1.000 |" in page


def test_results_degenerate_one_seed_and_an_arm_without_eval() -> None:
    runs = [
        RunRecord("process", 0, fake_metrics([0.5, 0.5], {1: 0.5})),
        RunRecord("silent", 0, fake_metrics([0.0, 0.0], {})),  # no eval line at all
    ]
    results = summarize(runs, None)  # the base model not evaluated either
    process, silent = results["arms"]["process"], results["arms"]["silent"]
    assert process["heldout"] == [
        {"step": 2, "episodes": 8, "n": 1, "mean": 0.5, "min": 0.5, "max": 0.5, "std": None}
    ]
    # metrics that do not count episodes (records made before they did) leave it unknown
    plain = [{k: v for k, v in m.items() if k != "episodes"} for m in runs[0].metrics]
    unknown = summarize([RunRecord("process", 0, plain)], None)["arms"]["process"]["heldout"]
    assert unknown[0]["episodes"] is None
    assert silent["heldout"] == [] and silent["final"]["n"] == 0 and silent["behaviour"] == {}
    assert silent["runs"]["silent-s0"]["final"] is None and silent["wall_s"]["mean"] is None
    assert results["comparisons"][0]["verdict"] == "undecided: no final held-out accuracy"
    assert results["comparisons"][0]["left_out"] == ["silent-s0 (no final evaluation)"]
    one = summarize([runs[0], RunRecord("other", 0, fake_metrics([0.0], {0: 0.0}))], None)
    assert one["comparisons"][0]["verdict"] == "undecided: fewer than 2 seeds"
    assert one["comparisons"][0]["diff"] == 0.5
    page = results_markdown(results, "fake")
    assert "| silent | - |" in page and "## Coach scores" not in page


# ----------------------------------------------------------------- the experiment file
def _experiment(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(text))
    return path


GOOD = """\
    base: smoke
    overrides: [eval.every=1, eval.num_tasks=4, tasks.num_tasks=16]
    seeds: [0, 1]
    arms:
      process: []
      outcome_only: [rl.advantage=outcome_only]
      grpo: [rl.advantage=grpo, rl.w_process=0, rl.w_outcome=1]
"""


def test_plan_resolves_every_arm_and_seed_on_the_same_tasks(tmp_path: Path) -> None:
    path = _experiment(tmp_path, GOOD)
    runs = plan_runs(load_experiment(path), path, tmp_path / "out", "http://127.0.0.1:9/v1")
    # seed by seed: every arm of seed 0 before seed 1 (complete blocks)
    assert [r.name for r in runs] == [
        f"{a}-s{s}" for s in (0, 1) for a in ("process", "outcome_only", "grpo")
    ]
    assert {r.config.task_seed for r in runs} == {0}  # the base's seed, for every run seed
    assert [r.config.seed for r in runs[::3]] == [0, 1]
    assert runs[3].config.run_dir == tmp_path / "out" / "runs" / "process-s1"
    # only the arm that asks a coach is pointed at the experiment's server
    assert [r.config.coach.backend for r in runs] == ["http", "local", "local"] * 2
    assert runs[0].config.coach.http.base_url == "http://127.0.0.1:9/v1"


def test_the_analysis_names_the_comparisons_before_any_run(tmp_path: Path) -> None:
    """Named in the file: read as pairs; absent: no primary, every pair secondary."""
    spec = load_experiment(_experiment(tmp_path, GOOD))
    assert spec.analysis.primary is None and spec.analysis.secondary is None
    named = GOOD + "    analysis:\n      primary: [process, grpo]\n      secondary: []\n"
    spec = load_experiment(_experiment(tmp_path, named))
    assert spec.analysis.primary == ("process", "grpo") and spec.analysis.secondary == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"arms": {"process": ["rl.advantagee=grpo"]}},
            "arm 'process': override rl.advantagee=grpo: unknown key; did you mean rl.advantage\\?",
        ),
        ({"arms": {"process": ["seed=3"]}}, "set by the experiment"),
        ({"arms": {"Bad Name": []}}, "names are lower case"),
        ({"seeds": []}, "seeds: List should have at least 1 item"),
        ({"seeds": [1, 1]}, "seeds repeat"),
        ({"colour": "red"}, "colour: unknown key"),
        ({"seed": [0]}, "seed: unknown key; did you mean seeds\\?"),
        ({"analysis": {"primry": ["grpo", "process"]}}, "did you mean analysis.primary\\?"),
        ({"base": "nowhere"}, r"neither a file next to it .* nor a shipped config \[.*demo"),
        ({"arms": {"a": [], "b": ["train.steps=7"]}}, "differ in rollout budget"),
        ({"arms": {"a": [], "b": ["eval.num_tasks=5"]}}, "differ in their held-out evaluation"),
        ({"arms": {"a": [], "b": ["eval.every=0"]}}, r"arms \['b'\]: held-out eval is off"),
        ({"arms": {"a": [], "b": ["tasks.difficulty=2"]}}, "held-out evaluation"),
        ({"coach_server": {"server": "llamacpp"}}, "coach_server.model: Field required"),
        (
            {"analysis": {"primary": ["process", "outcome"]}},
            r"analysis: .*'outcome' is not an arm \(arms: grpo, outcome_only, process\)",
        ),
        ({"analysis": {"primary": ["grpo", "grpo"]}}, "compares an arm with itself"),
        (
            {"analysis": {"primary": ["grpo", "process"], "secondary": [["process", "grpo"]]}},
            r"\[process, grpo\] is named twice",
        ),
        ({"analysis": {"secondary": [["process"]]}}, "analysis.secondary.0"),
        ({"analysis": {"primary": ["process", "grpo"], "colour": 1}}, "analysis.colour: unknown"),
    ],
)
def test_bad_experiments_are_refused_naming_the_problem(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    raw = yaml.safe_load(textwrap.dedent(GOOD)) | change
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ExperimentError, match=message) as err:
        plan_runs(load_experiment(path), path, tmp_path / "out")
    assert "Value error" not in str(err.value)  # pydantic's prefix to a validator's message


def _refusal(path: Path) -> str:
    with pytest.raises(ExperimentError) as err:
        load_experiment(path)
    return str(err.value)


def test_a_misread_experiment_file_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    """A run config given as an experiment (the reverse of what `mappa train` says about an
    experiment file), an empty file, a YAML syntax error, ``seed:`` for ``seeds:``, a list
    for a mapping."""
    run_config = shipped_configs() / "smoke.yaml"
    keys = "run_dir, seed, model, rollout, workflow, agents, tasks, eval, coach, rl, sandbox, train"
    assert _refusal(run_config) == (
        f"{run_config} is a run config (it has {keys}); run it with: mappa train --config "
        f"{run_config}"
    )
    assert _refusal(_experiment(tmp_path, "# nothing yet\n")) == (
        f"{tmp_path / 'exp.yaml'}: the file is empty; an experiment names its base, seeds and "
        "arms (docs/experiments.md)"
    )
    broken = _experiment(tmp_path, GOOD.replace("[0, 1]", "[0, 1"))
    assert _refusal(broken) == (
        f"{broken}: not valid YAML: line 4, column 5: expected ',' or ']', but got ':' (while "
        "parsing a flow sequence at line 3, column 8); fix the YAML syntax"
    )
    typo = _experiment(tmp_path, GOOD.replace("seeds:", "seed:"))
    assert _refusal(typo) == f"{typo}: seed: unknown key; did you mean seeds?"
    listed = _experiment(tmp_path, "- base: smoke.yaml\n")
    assert _refusal(listed) == (
        f"{listed}: the top level must be a mapping of keys (key: value lines), not a list"
    )


def test_command_line_overrides_reach_every_run_and_bad_files_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mappa.cli import main

    path = _experiment(tmp_path, GOOD)
    runs = plan_runs(load_experiment(path, ["rl.lr=0.002"]), path, tmp_path / "out")
    assert {r.config.rl.lr for r in runs} == {0.002}
    with pytest.raises(ExperimentError, match="overrides: .*set by the experiment"):
        load_experiment(path, ["run_dir=elsewhere"])
    bad = _experiment(tmp_path, GOOD.replace("rl.advantage=grpo", "rl.advantage=ppo"))
    assert main(["experiment", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "arm 'grpo'" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_one_seed_is_allowed_with_a_warning_once_every_check_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    one = GOOD.replace("[0, 1]", "[3]")
    with caplog.at_level(logging.WARNING):
        experiment, _, _ = _fake_experiment(tmp_path / "ok", monkeypatch, False, text=one)
    assert "one seed per arm" in caplog.text and len(experiment.runs) == 3
    caplog.clear()
    bad = one.replace("[rl.advantage=grpo,", "[rl.advantagee=grpo,")
    with caplog.at_level(logging.WARNING), pytest.raises(ExperimentError, match="arm 'grpo'"):
        _fake_experiment(tmp_path / "bad", monkeypatch, False, text=bad)
    assert caplog.text == ""  # a refused experiment says only why, not the warning first


OUTCOME_ARMS = ("outcome_only", "grpo")


def test_shipped_experiments_resolve(tmp_path: Path) -> None:
    """Every experiment under configs/experiments/ (the YAML files with `arms`; files they
    use, such as coach templates, may sit beside them) names a base that resolves and arms
    that are comparable (a paper experiment reads local copies of its Hub data, shaped
    like them: the Hub is out of reach here)."""
    from conftest import paper_data

    folder = Path(__file__).resolve().parents[1] / "configs" / "experiments"
    shipped = [p for p in sorted(folder.glob("*.yaml")) if "arms" in yaml.safe_load(p.read_text())]
    assert shipped, "no shipped experiment"
    for path in shipped:
        data = paper_data(tmp_path / "data") if path.stem.endswith("_paper") else []
        spec = load_experiment(path, data)
        assert len(spec.seeds) >= 2 and "outcome_only" in spec.arms
        runs = plan_runs(spec, path, tmp_path / path.stem)
        # the outcome arms ask no coach; every other arm scores every action (a coach or
        # a rule)
        assert all(r.config.rl.needs_coach == (r.arm not in OUTCOME_ARMS) for r in runs)


def test_the_documented_example_is_a_valid_experiment(tmp_path: Path) -> None:
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "experiments.md").read_text()
    example = re.search(r"```yaml\n(base:.*?)```", doc, re.S)
    assert example, "docs/experiments.md's example is gone"
    path = _experiment(tmp_path, example.group(1))
    spec = load_experiment(path)
    assert spec.coach_server is not None and spec.coach_server.server == "llamacpp"
    runs = plan_runs(spec, path, tmp_path / "out", "http://127.0.0.1:9/v1")
    assert len(runs) == 9 and {r.config.train.steps for r in runs} == {20}


def test_run_state_reads_the_newest_checkpoint(tmp_path: Path) -> None:
    from mappa.experiment.runner import run_state

    path = _experiment(tmp_path, GOOD)
    run = plan_runs(load_experiment(path), path, tmp_path / "out")[0]
    assert run_state(run) == "new"
    for step, state in ((1, "resume"), (run.config.train.steps, "done")):
        ckpt = run.config.run_dir / "checkpoints" / f"step-{step:06d}"
        ckpt.mkdir(parents=True)
        (ckpt / "checkpoint.json").write_text(json.dumps({"step": step}))
        assert run_state(run) == state


class FakeServer:
    """Stands in for a coach server: records when it is started and stopped."""

    name = "fake"
    base_url = "http://127.0.0.1:9/v1"
    log = Path("fake.log")

    def __init__(self) -> None:
        self.proc: object | None = None  # set once started, as a real server's process
        self.running = False
        self.events: list[str] = []
        self.running_during: list[bool] = []  # per child process run, was it up?

    def start(self) -> FakeServer:
        self.proc, self.running = object(), True
        self.events.append("start")
        return self

    def stop(self) -> None:  # like a real server's: stopping a stopped one does nothing
        if self.running:
            self.running = False
            self.events.append("stop")


def _fake_experiment(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    server: bool,
    records: Path | None = None,
    overrides: list[str] | None = None,
    text: str = GOOD,
) -> tuple[Any, list[list[str]], FakeServer]:
    """An Experiment of ``text`` whose child processes are recorded, not run (``FakeServer``
    as its coach server if ``server``); the model is a directory that only looks like one. A
    fake child leaves what a real one would: a run's metrics.jsonl, the base model's
    eval.json."""
    from mappa.experiment.runner import Experiment

    tmp_path.mkdir(parents=True, exist_ok=True)
    model = tmp_path.parent / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    text = text.replace("tasks.num_tasks=16]", f"tasks.num_tasks=16, model.path={model}]")
    if server:
        text += "    coach_server: {model: fake.gguf}\n"
    fake = FakeServer()
    monkeypatch.setattr("mappa.coach.servers.make_server", lambda *args: fake)
    out = tmp_path / "out"
    experiment = Experiment(_experiment(tmp_path, text), out, overrides, records)
    children: list[list[str]] = []

    def child(name: str, action: str, args: list[str], *rest: Any) -> None:
        children.append(args)
        fake.running_during.append(fake.running)
        done = (
            out / "base" / "eval.json" if name == "base" else out / "runs" / name / "metrics.jsonl"
        )
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(
            '{"accuracy": 0.5}' if name == "base" else f'{{"step": 0, "run": "{name}"}}\n'
        )
        if name != "base":
            note_code(done.parent, 0)  # as the training loop does

    monkeypatch.setattr(experiment, "_child", child)
    monkeypatch.setattr(experiment, "write_results", lambda: tmp_path / "out" / "results.md")
    return experiment, children, fake


PROCESS_AND_OUTCOME = ("process-s0", "process-s1", "outcome_only-s0")


def test_rerun_skips_finished_runs_resumes_started_ones_and_restarts_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment, children, _ = _fake_experiment(tmp_path, monkeypatch, server=False)
    named = {r.name: r for r in experiment.runs}
    process0, process1, outcome0 = (named[n] for n in PROCESS_AND_OUTCOME)

    def checkpoint(run: Any, step: int) -> None:
        ckpt = run.config.run_dir / "checkpoints" / f"step-{step:06d}"
        ckpt.mkdir(parents=True)
        (ckpt / "checkpoint.json").write_text(json.dumps({"step": step}))
        config = yaml.safe_dump(run.config.model_dump(mode="json"))
        (run.config.run_dir / "config.yaml").write_text(config)
        (run.config.run_dir / "metrics.jsonl").write_text('{"step": 0}\n' * step)

    checkpoint(process0, process0.config.train.steps)  # finished
    checkpoint(process1, 1)  # interrupted after its first step
    (outcome0.config.run_dir).mkdir(parents=True)  # killed before its first checkpoint
    (outcome0.config.run_dir / "episodes.jsonl").write_text("{}\n")
    (tmp_path / "out" / "base").mkdir(parents=True)
    (tmp_path / "out" / "base" / "eval.json").write_text("{}")  # evaluated already
    experiment.run()
    configs = tmp_path / "out" / "configs"
    # seed 0's arms first (process-s0 skipped), then seed 1's
    assert children[0] == ["train", "--config", str(configs / "outcome_only-s0.yaml")]
    assert children[2] == [
        "train",
        "--config",
        str(configs / "process-s1.yaml"),
        "--resume",
        str(process1.config.run_dir),
    ]
    assert not (outcome0.config.run_dir / "episodes.jsonl").exists()  # started over
    assert len(children) == 5  # process-s0 skipped, the base not evaluated again
    assert (tmp_path / "out" / "records" / "process-s0" / "record.json").is_file()  # kept too


def test_records_let_a_rerun_elsewhere_skip_finished_runs_and_refuse_a_changed_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    records = tmp_path / "records"
    experiment, children, _ = _fake_experiment(tmp_path / "a", monkeypatch, False, records)
    experiment.runs = [r for r in experiment.runs if r.arm == "process"]  # two runs only
    experiment.run()
    assert len(children) == 3  # base + 2 runs
    kept = sorted(p.name for p in records.iterdir())
    assert kept == ["base", "process-s0", "process-s1"]
    assert sorted(p.name for p in (records / "process-s0").iterdir()) == [
        "actions.jsonl",
        "config.yaml",
        "heldout.jsonl",
        "metrics.jsonl",
        "record.json",
    ]
    info = json.loads((records / "process-s0" / "record.json").read_text())
    assert info["code"] == source_revision() is not None  # the run noted it; from a checkout
    # as if another commit had recorded process-s1
    info = json.loads((records / "process-s1" / "record.json").read_text())
    (records / "process-s1" / "record.json").write_text(json.dumps({**info, "code": "abc"}))
    capsys.readouterr()
    # another machine: a fresh output dir, the committed records
    experiment, children, _ = _fake_experiment(tmp_path / "b", monkeypatch, False, records)
    assert experiment.recorded == {"process-s0", "process-s1"}
    experiment.run()
    said = {line.split(": ")[0][-10:]: line for line in capsys.readouterr().out.splitlines()}
    assert "recorded already" in said["process-s0"] and "another code" not in said["process-s0"]
    assert f"another code or environment: code abc -> {source_revision()} " in said["process-s1"]
    assert [c[2].rsplit("/", 1)[-1] for c in children] == [
        f"{arm}-s{s}.yaml" for s in (0, 1) for arm in ("outcome_only", "grpo")
    ]  # neither the base nor the recorded runs again
    stored = {r.seed: r.metrics for r in experiment.run_records() if r.arm == "process"}
    assert stored == {s: [{"step": 0, "run": f"process-s{s}"}] for s in (0, 1)}
    with pytest.raises(
        ExperimentError, match=r"process-s0: its record .* \(rl.lr: 0.0001 -> 0.002\)"
    ):
        _fake_experiment(tmp_path / "c", monkeypatch, False, records, ["rl.lr=0.002"])


def test_made_by_names_other_code_and_says_when_it_is_unknown() -> None:
    from mappa.experiment.runner import made_by, record_changes

    said, hint = "; recorded on another code or environment: ", " (mappa experiment --reproduce"
    assert made_by("abc", "abc") == ""
    assert made_by("abc", "def") == f"{said}code abc -> def{hint} tells if it matters)"
    assert record_changes(None, "def") == ["code not recorded -> def"]
    assert record_changes("abc", None) == ["code abc -> not a git checkout"]
    # and the environment: only what changed, only where the record noted one
    env = {"python": "3.11.7", "transformers": "5.24.0"}
    assert made_by("abc", "abc", env, env) == ""
    assert made_by("abc", "abc", None, env) == ""  # a record older than the field
    assert made_by("abc", "def", env, {**env, "transformers": "5.25.0"}) == (
        f"{said}code abc -> def; transformers 5.24.0 -> 5.25.0{hint} tells if it matters)"
    )


def test_coach_server_starts_only_for_arms_that_ask_a_coach_and_always_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment, children, fake = _fake_experiment(tmp_path, monkeypatch, server=True)
    assert [r.config.coach.backend for r in experiment.runs] == ["http", "local", "local"] * 2
    experiment.run()
    assert len(children) == 7  # base + 6 runs
    # up from the first process run (seed 0's first) until no later run asks a coach
    assert fake.events == ["start", "stop"]
    assert fake.running_during == [False, True, True, True, True, False, False]

    experiment, children, fake = _fake_experiment(tmp_path / "again", monkeypatch, server=True)
    experiment.runs = [r for r in experiment.runs if r.arm != "process"]  # no coach asked
    experiment.run()
    assert fake.events == []  # never started

    experiment, _, fake = _fake_experiment(tmp_path / "fails", monkeypatch, server=True)

    def failing(*args: Any) -> None:
        raise ExperimentError("a run failed")

    monkeypatch.setattr(experiment, "_child", failing)
    experiment.evaluate_base = lambda: None  # type: ignore[method-assign]
    with pytest.raises(ExperimentError, match="a run failed"):
        experiment.run()
    assert fake.events == ["start", "stop"]


def test_reproduce_reruns_one_step_scored_afresh_with_the_server_up_only_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``--reproduce`` asks of the child (its own config, the cache off, one step) and
    of the coach server; the real rerun is in the end-to-end test below."""
    first, _, _ = _fake_experiment(tmp_path / "a", monkeypatch, server=True)
    first.run()  # every run recorded (by fake children)
    records = first.records.root
    experiment, _, fake = _fake_experiment(tmp_path / "b", monkeypatch, True, records)
    configs: list[dict[str, Any]] = []

    def child(name: str, action: str, args: list[str], *rest: Any) -> None:
        assert args[-2:] == ["--stop-after", "1"] and action == "reproduce"
        fake.running_during.append(fake.running)
        cfg = yaml.safe_load(Path(args[args.index("--config") + 1]).read_text())
        configs.append(cfg)
        run_dir = Path(cfg["run_dir"])
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text(f'{{"step": 0, "run": "{name[:-10]}"}}\n')

    monkeypatch.setattr(experiment, "_child", child)
    for name, server_up in (("process-s0", True), ("outcome_only-s0", False)):
        comparison, changes = experiment.reproduce(experiment.recorded_run(name))
        assert comparison.reproduced and changes == []  # same code, same machine
        assert configs[-1]["coach"]["cache"]["mode"] == "off"
        assert configs[-1]["run_dir"] == str(experiment.out / "reproduce" / name)
        assert fake.running_during[-1] is server_up and not fake.running
        assert not (experiment.out / "reproduce" / name).exists()  # matched: removed
    with pytest.raises(ExperimentError, match="--reproduce nope-s0: no such run in "):
        experiment.recorded_run("nope-s0")
    (records / "grpo-s0" / "actions.jsonl").unlink()  # as a format-1 record
    with pytest.raises(ExperimentError, match=r"--reproduce grpo-s0: its record .* older than"):
        experiment.recorded_run("grpo-s0")
    shutil.rmtree(records / "grpo-s1")
    experiment.recorded.discard("grpo-s1")
    with pytest.raises(ExperimentError, match=r"--reproduce grpo-s1: not recorded yet in "):
        experiment.recorded_run("grpo-s1")


# ----------------------------------------------------------------- end to end
@pytest.mark.integration
def test_tiny_experiment_end_to_end_and_rerun_resumes_nothing(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mappa.cli import main
    from mappa.config import load_config
    from mappa.jsonl import read_jsonl
    from mappa.records import read_episodes

    base = tiny_run_config(tiny_model_dir, tmp_path / "unused")
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base.model_dump(mode="json")))
    experiment = _experiment(
        tmp_path,
        """\
        base: base.yaml
        overrides: [eval.every=2, eval.num_tasks=2, train.prompts_per_step=1,
                    train.tensorboard=false]
        seeds: [0, 1]
        arms:
          process: []
          outcome_only: [rl.advantage=outcome_only]
          grpo: [rl.advantage=grpo, rl.w_process=0, rl.w_outcome=1]
          process_oracle: [coach.backend=rules, coach.reference_for=all]
        analysis:
          primary: [process, outcome_only]
        """,
    )
    out = tmp_path / "out"
    assert main(["experiment", str(experiment), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        "[1/8] process-s0: step 1/2" in printed
        and "[8/8] process_oracle-s1: step 2/2" in printed
        and "experiment done in" in printed
    )

    arms = ("process", "outcome_only", "grpo", "process_oracle")
    names = [f"{a}-s{s}" for a in arms for s in (0, 1)]
    results = json.loads((out / "results.json").read_text())
    base_eval = json.loads((out / "base" / "eval.json").read_text())
    heldout_ids = {tuple(t["task_id"] for t in base_eval["per_task"])}
    for name in names:
        run_dir = out / "runs" / name
        arm, seed = name.rsplit("-s", 1)
        cfg = load_config(out / "configs" / f"{name}.yaml")
        assert (cfg.run_dir, cfg.seed, cfg.task_seed) == (run_dir, int(seed), 0)
        metrics = read_jsonl(run_dir / "metrics.jsonl")
        assert [m["step"] for m in metrics] == [0, 1]
        summary = results["arms"][arm]["runs"][name]
        assert summary["final"] == metrics[-1]["eval/accuracy"]
        assert summary["train_accuracy"] == pytest.approx(mean(m["accuracy"] for m in metrics))
        episodes = read_episodes(run_dir / "episodes.jsonl")
        scores = [a.coach for e in episodes for a in e.actions]
        coached = arm.startswith("process")
        assert all(scores) if coached else not any(scores)  # no coach asked
        assert ("coach/verifier" in metrics[0]) == coached
        if arm == "process_oracle":  # right or wrong, as its result checks out
            assert {(s.backend, s.value) for s in scores if s} <= {("rules", 0.0), ("rules", 10.0)}
        assert summary["optimizer_steps"].keys() == {"problem_solver", "code_executor", "verifier"}
        heldout = read_episodes(run_dir / "heldout_episodes.jsonl")
        assert {e.step for e in heldout} == {1}  # one eval, after the last step
        heldout_ids.add(tuple(e.task_id for e in heldout))
    assert len(heldout_ids) == 1  # the base and every run, at every eval: the same tasks
    for arm in arms:
        finals = [results["arms"][arm]["runs"][f"{arm}-s{s}"]["final"] for s in (0, 1)]
        assert results["arms"][arm]["final"]["mean"] == pytest.approx(mean(finals))
        curve = results["arms"][arm]["heldout"]
        assert [p["step"] for p in curve] == [0, 2]
        assert curve[0]["mean"] == base_eval["accuracy"]
    assert bool(results["arms"]["process"]["coach"]) and not results["arms"]["grpo"]["coach"]
    assert len(results["comparisons"]) == 6  # the primary, then every other pair
    assert [c["role"] for c in results["comparisons"]] == ["primary"] + ["secondary"] * 5
    assert (results["comparisons"][0]["a"], results["comparisons"][0]["b"]) == (
        "process",
        "outcome_only",
    )
    assert all(c["bootstrap_ci"] or c["ci"] is None for c in results["comparisons"])
    assert "## Verdicts on final held-out accuracy" in (out / "results.md").read_text()
    assert (out / "heldout_accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "report" / "index.html").is_file()

    # the same command again: everything is there, nothing is trained or evaluated again
    before = {n: (out / "runs" / n / "metrics.jsonl").read_bytes() for n in names}
    timings = read_jsonl(out / "timings.jsonl")
    assert len(timings) == 9
    assert main(["experiment", str(experiment), "--out", str(out)]) == 0
    assert "process-s0: recorded already" in capsys.readouterr().out
    assert {n: (out / "runs" / n / "metrics.jsonl").read_bytes() for n in names} == before
    assert read_jsonl(out / "timings.jsonl") == timings

    # another machine: only the records travel; nothing runs, the results are the same
    records = tmp_path / "committed"
    shutil.copytree(out / "records", records)
    elsewhere = tmp_path / "elsewhere"
    args = ["experiment", str(experiment), "--out", str(elsewhere), "--records", str(records)]
    assert main(args) == 0
    assert not (elsewhere / "runs").exists() and not (elsewhere / "timings.jsonl").exists()
    again = json.loads((elsewhere / "results.json").read_text())
    assert {a: again["arms"][a]["final"] for a in arms} == {
        a: results["arms"][a]["final"] for a in arms
    }
    assert again["comparisons"] == results["comparisons"]  # the per-problem answers travel too

    # this machine trains a recorded run's first step exactly as its record says
    capsys.readouterr()
    assert main([*args, "--reproduce", "process-s0"]) == 0
    printed = capsys.readouterr().out
    assert "process-s0 (its first step again): step 1/1" in printed
    assert re.search(r"process-s0, step 0: (\d+) of \1 training actions identical", printed)
    assert "recorded on this code and environment" in printed
    assert "reproduced: this machine trains process-s0's first step exactly" in printed
    assert not (elsewhere / "reproduce" / "process-s0").exists()  # nothing to look at
    # a record this machine does not reproduce, to the last bit: named, the rerun kept
    path = records / "process-s0" / "actions.jsonl"
    rows = read_jsonl(path)
    rows[0]["score"] = math.nextafter(rows[0]["score"], math.inf)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([*args, "--reproduce", "process-s0"]) == 1
    printed = capsys.readouterr().out
    assert "  differs: action s0-e0 problem_solver turn 0: score " in printed
    assert "not reproduced: " in printed
    assert (elsewhere / "reproduce" / "process-s0" / "metrics.jsonl").is_file()
    assert main([*args, "--reproduce", "nope-s0"]) == 2
    assert "--reproduce nope-s0: no such run in" in capsys.readouterr().err


def test_progress_shows_every_step_even_when_several_end_between_two_looks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        json.dumps({"step": 0, "accuracy": 0.25})
        + "\n"
        + json.dumps({"step": 1, "accuracy": 0.5, "eval/accuracy": 0.75})
        + "\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", "pass"])  # a child that is done at once
    Experiment._watch(proc, "arm-s0", 0.0, (metrics, 3))
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in printed] == [
        "arm-s0: step 1/3 accuracy 0.250",
        "arm-s0: step 2/3 accuracy 0.500 held-out 0.750",
    ]
