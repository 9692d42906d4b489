"""A step's metrics (``mappa.run.metrics``): the per-agent vocabulary on hand-made episodes,
the rollout metrics the loop logs (with the coach's statistics), and the step line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import tiny_run_config

from mappa.coach.stats import NoSignalWatch
from mappa.records import Action, Episode, Score, ToolStatus
from mappa.run.metrics import accuracy, agent_metrics, rollout_metrics, step_line


def _action(
    agent: str,
    text: str,
    status: ToolStatus | None = None,
    n: int = 4,
    truncated: bool = False,
) -> Action:
    obs = None if status is None else f"(a run that ended {status})"
    return Action("e", agent, 0, [1], [7] * n, [0.0] * n, "", text, truncated, obs, status)


def _episode(*actions: Action) -> Episode:
    return Episode("e", "t", "task", "5", actions=list(actions))


def test_tasks_seed_fixes_the_problems_across_run_seeds() -> None:
    """Runs that differ only in ``seed`` see the same problems when ``tasks.seed`` is set
    (an experiment's seeds); unset, each run draws its own (the run seed's)."""
    from mappa.cli import default_config
    from mappa.config import load_config
    from mappa.run.evaluation import heldout_tasks, training_tasks

    def sets(*overrides: str) -> tuple[list[str], list[str]]:
        cfg = load_config(default_config(), list(overrides))
        return [t.prompt for t in training_tasks(cfg)], [t.prompt for t in heldout_tasks(cfg)]

    assert sets("seed=1", "tasks.seed=7") == sets("seed=2", "tasks.seed=7") == sets("seed=7")
    assert sets("seed=1") != sets("seed=2")
    assert sets("seed=1") == sets("seed=5", "tasks.seed=1")


def test_behaviour_metrics_per_agent(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_run_config(tiny_model_dir, tmp_path)
    episodes = [
        _episode(
            _action("problem_solver", "it is 5", n=10),
            _action("code_executor", "```python\nprint(5)\n```", "ok"),
            _action("code_executor", "```python\n1/0\n```", "error"),
            _action("verifier", r"\boxed{5}"),
        ),
        _episode(
            _action("problem_solver", "hmm", n=20, truncated=True),
            _action("code_executor", "no code"),
            _action("verifier", "5"),
        ),
    ]
    m = agent_metrics(episodes, cfg.agents, cfg.tasks.answer_format)
    assert m["tool_call_rate/code_executor"] == 0.5  # one of two episodes ran code
    assert m["exec_error_rate/code_executor"] == 0.5  # one of its two runs failed
    assert m["response_tokens/problem_solver"] == 15 and m["truncation_rate/problem_solver"] == 0.5
    assert m["format_rate/verifier"] == 0.5 and m["format_rate/problem_solver"] == 0.0
    assert "tool_call_rate/verifier" not in m  # only agents that run code have one
    assert m["actions/code_executor"] == 3 and "coach/verifier" not in m  # nothing scored
    assert accuracy([], 1) == {"graded": 0, "accuracy": None, "avg@1": None, "pass@1": None}


def _scored(agent: str, score: float, text: str = "") -> Action:
    a = _action(agent, text)
    a.coach = Score(score, digit_mass=0.9)
    return a


def test_rollout_metrics_hold_accuracy_agent_keys_and_the_coach_statistics(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tiny_run_config(tiny_model_dir, tmp_path, "coach.warn_no_signal_steps=1")
    names = [a.name for a in cfg.agents]
    right = _episode(*(_scored(n, 8.0, r"\boxed{5}") for n in names))
    right.correct = True
    wrong = _episode(*(_scored(n, 8.0) for n in names))
    wrong.correct = False
    watch = NoSignalWatch(
        cfg.coach.warn_no_signal_steps, cfg.rl.min_reward_spread, w_process=cfg.rl.w_process
    )
    scores = [a.coach for e in (right, wrong) for a in e.actions if a.coach is not None]
    with caplog.at_level(logging.WARNING):
        m = rollout_metrics(3, [right, wrong], scores, cfg, watch)
    assert m["step"] == 3 and m["episodes"] == 2 and m["accuracy"] == 0.5
    assert m[f"coach/{names[0]}"] == 8.0 and m[f"actions/{names[-1]}"] == 2  # agent keys
    assert m["coach/calls"] == 6 and m["coach/flagged"] == 0  # the coach's accounting
    assert m[f"coach_bias/agent/{names[-1]}/mean"] == 8.0  # its bias statistics
    # every agent scored 8 twice: no spread, no signal; the watch warns after one such step
    assert m["coach_health/signal_agents"] == 0 and m["coach_health/agents"] == len(names)
    assert m["coach_health/digit_mass"] == pytest.approx(0.9)
    assert "consecutive steps (coach.warn_no_signal_steps=1)" in caplog.text
    assert "failed_episodes" not in m  # a preset pipeline has no workflow to fail
    wrong.error = "Traceback ...\nZeroDivisionError"
    cfg.workflow.function = "my_team:solve"
    assert rollout_metrics(3, [right, wrong], scores, cfg, watch)["failed_episodes"] == 1


@pytest.mark.parametrize(
    ("w_process", "spread", "signal"),
    [(0.5, 0.7, 0), (0.5, 1.2, 1), (2.0, 0.3, 1), (2.0, 0.2, 0)],
)
def test_coach_health_reads_the_spread_as_the_reward_weighs_it(
    w_process: float, spread: float, signal: int, caplog: pytest.LogCaptureFixture
) -> None:
    """rl.min_reward_spread (0.05) is in reward units, and a score enters the reward as
    w_process * score / 10: at 0.5 a 0.7-point spread is 0.035 (no signal), at 2 a
    0.3-point spread is 0.06 (signal)."""
    from mappa.cli import default_config
    from mappa.config import load_config

    overrides = [f"rl.w_process={w_process}", "rl.min_reward_spread=0.05"]
    cfg = load_config(default_config(), [*overrides, "coach.warn_no_signal_steps=1"])
    low = _episode(*(_scored(a.name, 6.0) for a in cfg.agents))
    high = _episode(*(_scored(a.name, 6.0 + spread) for a in cfg.agents))
    watch = NoSignalWatch(1, 0.05, w_process=w_process)
    scores = [a.coach for e in (low, high) for a in e.actions if a.coach is not None]
    with caplog.at_level(logging.WARNING):
        m = rollout_metrics(0, [low, high], scores, cfg, watch)
    assert m["coach_health/signal_agents"] == signal * len(cfg.agents)
    if not signal:
        needed = f">= {10 * 0.05 / w_process:.2g} points apart"
        assert needed in caplog.text and f"rl.w_process={w_process:g}" in caplog.text


def test_step_line_names_each_agents_score_and_the_coach_health() -> None:
    m = {
        "coach/a": 7.5,
        "coach/b": None,
        "accuracy": 0.25,
        "mean_kl": 0.0012345,
        "rollout_tokens_per_s": 12.34,
        "coach/flagged": 1,
        "coach_health/agents": 2,
        "coach_health/signal_agents": 1,
        "coach_health/digit_mass": 0.8,
    }
    assert step_line(4, m, ["a", "b"]) == (
        "step 4: coach[a=7.5 b=-] acc=0.25 kl=0.00123 tok/s=12.3 flagged=1 signal=1/2 mass=0.80"
    )
    del m["coach_health/digit_mass"]
    assert step_line(4, m, ["a", "b"]).endswith("flagged=1 signal=1/2")
    no_coach = {k: v for k, v in m.items() if not k.startswith("coach_health/")}
    assert step_line(4, no_coach, ["a", "b"]).endswith("flagged=1")  # outcome_only: no coach
