"""A run's record keeps every training action's coach score, tool status and oracle
verdict, so credit assignment can be checked per episode after the run; a record made
before it still loads."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mappa.experiment.records import Records
from mappa.experiment.spec import RunSpec, load_experiment, plan_runs
from mappa.records import Action, Episode, Score, append_episodes

EXPERIMENT = """\
    base: smoke
    overrides: [eval.every=1, eval.num_tasks=4, tasks.num_tasks=16]
    seeds: [0, 1]
    arms:
      process: []
"""


def _run(tmp_path: Path) -> RunSpec:
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(EXPERIMENT))
    return plan_runs(load_experiment(path), path, tmp_path / "out")[0]


def _action(agent: str, turn: int, **fields: object) -> Action:
    return Action("s1-e0", agent, turn, [1], [2], [-0.1], "in", "out", False, **fields)  # type: ignore[arg-type]


def test_a_record_keeps_each_training_actions_score_status_and_oracle(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run_dir = run.config.run_dir
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    actions = [
        _action("code_executor", 0, tool_status="error", oracle=False, coach=Score(7.0)),
        _action("code_executor", 1, oracle=True, coach=Score(5.0, flagged=True)),
        _action("verifier", 0, oracle=True),  # a run that asks no coach scores nothing
    ]
    episode = Episode("s1-e0", "t7", "q", "12", step=1, actions=actions, correct=True)
    append_episodes(run_dir / "episodes.jsonl", [episode])
    records = Records(tmp_path / "records")
    folder = records.keep(run, 12.0)
    where = {"step": 1, "episode_id": "s1-e0", "task_id": "t7", "correct": True}
    assert records.actions(run) == [
        {**where, "agent": "code_executor", "turn": 0, "score": 7.0, "flagged": False,
         "tool_status": "error", "oracle": False},
        {**where, "agent": "code_executor", "turn": 1, "score": 5.0, "flagged": True,
         "tool_status": None, "oracle": True},
        {**where, "agent": "verifier", "turn": 0, "score": None, "flagged": None,
         "tool_status": None, "oracle": True},
    ]  # fmt: skip
    # a record made before actions were kept loads as before, with no actions
    (folder / "actions.jsonl").unlink()
    assert records.has(run) and records.actions(run) is None
    assert records.read(run).metrics == [{"step": 1}]


COMMITTED = ["sparse_outcomes_cpu", "credit_controls_cpu"]
"""Experiments whose records are committed under docs/results/<name>/ (configs/experiments/
<name>.yaml plans them)."""


def test_committed_records_still_match_their_experiment_files() -> None:
    """A rerun of a committed experiment skips the runs it has recorded only while the
    experiment file still plans those runs' configs: the base config moving on (a new coach
    default) must be pinned in the experiment file, not break the resume."""
    repo = Path(__file__).resolve().parents[2]
    for name in COMMITTED:
        path = repo / "configs" / "experiments" / f"{name}.yaml"
        runs = plan_runs(load_experiment(path), path, repo / "runs" / "experiments" / name)
        records = Records(repo / "docs" / "results" / name)
        assert any([records.has(run) for run in runs]), name  # has() refuses a changed config
