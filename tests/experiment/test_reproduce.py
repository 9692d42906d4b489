"""The comparison behind ``mappa experiment --reproduce`` (mappa.experiment.reproduce); the
real rerun of a recorded run is in tests/test_experiment.py's end-to-end test."""

from __future__ import annotations

from typing import Any

from mappa.experiment.reproduce import compare_step, verdict_lines


def _actions() -> list[dict[str, Any]]:
    return [
        {"step": 0, "episode_id": "s0-e0", "agent": "solver", "turn": 0,
         "score": 2.0951557175904587, "tool_status": None, "oracle": False, "correct": False},
        {"step": 0, "episode_id": "s0-e0", "agent": "verifier", "turn": 0,
         "score": 5.97634, "tool_status": "ok", "oracle": True, "correct": True},
    ]  # fmt: skip


METRICS = {
    "step": 0,
    "rl/solver/loss": 0.0123,
    "rl/solver/grad_norm": float("nan"),
    "lr": 1e-5,
    "update_s": 12.5,
    "coach/latency_p50_s": 1.2,
    "rollout_tokens_per_s": 80.0,
    "coach/calls": 2,
    "coach/cache_hits": 0,
}


def test_an_identical_step_is_reproduced_and_timings_are_not_compared() -> None:
    rerun = {**METRICS, "update_s": 99.0, "coach/latency_p50_s": 3.0, "rollout_tokens_per_s": 1.0}
    rerun |= {"coach/calls": 0, "coach/cache_hits": 2}  # how the coach was asked, not what
    c = compare_step(0, _actions(), _actions(), METRICS, rerun)
    assert c.reproduced and (c.actions, c.actions_same) == (2, 2)
    assert (c.metrics, c.metrics_same, c.left_out) == (4, 4, 5)  # a NaN matches a NaN
    lines = verdict_lines("coach-s1", c, [])
    assert lines[0] == (
        "coach-s1, step 0: 2 of 2 training actions identical (coach score, tool status, "
        "oracle verdict, outcome); 4 of 4 metrics identical (5 timings and coach usage "
        "counters not compared)"
    )
    assert lines[1:] == [
        "recorded on this code and environment",
        "reproduced: this machine trains coach-s1's first step exactly as recorded",
    ]


def test_the_last_bit_of_a_score_or_a_loss_is_a_difference_named_with_both_values() -> None:
    rerun = _actions()
    rerun[0]["score"] = 2.0951557175904583  # one ulp away
    metrics = {**METRICS, "rl/solver/loss": 0.0124, "rl/solver/entropy": 1.0}
    c = compare_step(0, _actions(), rerun, METRICS, metrics)
    assert not c.reproduced and (c.actions_same, c.metrics_same) == (1, 3)
    assert c.differences == [
        "action s0-e0 solver turn 0: score 2.0951557175904587 recorded, 2.0951557175904583 now",
        "metric rl/solver/loss: 0.0123 recorded, 0.0124 now",
        "metrics the record lacks: rl/solver/entropy",
    ]
    changes = ["code a -> b", "transformers 5.24.0 -> 5.25.0"]
    lines = verdict_lines("coach-s1", c, changes)
    assert lines[1].startswith("  differs: action s0-e0 solver turn 0: score")
    assert "recorded on another code or environment: code a -> b; transformers" in lines[4]
    assert lines[-1].startswith("not reproduced: this machine's runs would not continue")


def test_a_rerun_with_other_actions_says_so_and_caps_what_it_lists() -> None:
    many = [{**_actions()[0], "episode_id": f"s0-e{i}"} for i in range(8)]
    other = [{**a, "oracle": True} for a in many[:7]]
    c = compare_step(0, many, other, {"step": 0}, {"step": 0})
    assert c.differences[0] == "8 actions recorded, 7 now"
    assert c.actions_same == 0 and len(c.differences) == 8
    lines = verdict_lines("r", c, [])
    assert "  ... and 3 more differences" in lines
    assert sum(line.startswith("  differs:") for line in lines) == 5
