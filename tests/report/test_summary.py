"""The run summary's coach lines, from a hand-written metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

from mappa.report.summary import run_summary

AGENTS = ["solver", "verifier"]


def _run(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_signal_and_digit_mass_over_the_run(tmp_path: Path) -> None:
    rows = [
        {"step": 0, "coach_health/agents": 2, "coach_health/signal_agents": 2,
         "coach_health/digit_mass": 0.99},
        {"step": 1, "coach_health/agents": 2, "coach_health/signal_agents": 1,
         "coach_health/digit_mass": 0.0},  # a step whose scores had no mass still counts
        {"step": 2, "coach_health/agents": 2, "coach_health/signal_agents": 0,
         "coach_health/digit_mass": None},  # a backend that does not know its mass
    ]  # fmt: skip
    text = run_summary(_run(tmp_path, rows), AGENTS)
    assert "  coach signal: 3 of 6 agent-steps; digit mass 0.495 (lowest step 0.000)" in text


def test_no_coach_line_without_scored_steps(tmp_path: Path) -> None:
    """An outcome-only run asks no coach: no coach line, rather than a misleading 0 of 0."""
    text = run_summary(_run(tmp_path, [{"step": 0, "accuracy": 0.5}]), AGENTS)
    assert "coach signal" not in text and "accuracy (training rollouts): 0.50 -> 0.50" in text


def test_mass_left_out_when_no_backend_knew_it(tmp_path: Path) -> None:
    rows = [{"step": 0, "coach_health/agents": 2, "coach_health/signal_agents": 2}]
    assert "  coach signal: 2 of 2 agent-steps\n" in run_summary(_run(tmp_path, rows), AGENTS)


def test_held_out_change_from_the_untrained_team_beyond_the_noise(tmp_path: Path) -> None:
    rows = [
        {"step": 0, "eval_start/accuracy": 3 / 16, "eval_start/graded": 16},
        {"step": 1},
        {"step": 2, "eval/accuracy": 11 / 16, "eval/graded": 16},
    ]
    # 2 * sqrt(3/16 * 13/16 / 16 + 11/16 * 5/16 / 16) = 0.303
    assert (
        "  held-out accuracy, untrained -> after step 2: 0.19 -> 0.69 (3/16 -> 11/16 right, "
        "+0.50; beyond the noise of 16 problems, two standard errors 0.30)"
    ) in run_summary(_run(tmp_path, rows), AGENTS)


def test_held_out_change_within_the_noise_and_without_a_start(tmp_path: Path) -> None:
    rows = [
        {"step": 0, "eval_start/accuracy": 3 / 16, "eval_start/graded": 16},
        {"step": 2, "eval/accuracy": 6 / 16, "eval/graded": 16},
    ]
    text = run_summary(_run(tmp_path, rows), AGENTS)
    assert "(3/16 -> 6/16 right, +0.19; within the noise of 16 problems" in text
    assert "held-out: " not in text  # the change line replaces first -> last
    no_start = run_summary(_run(tmp_path, rows[1:]), AGENTS)
    assert "untrained" not in no_start and "held-out: 0.38 -> 0.38" in no_start
