"""Coach health: can a step's coach scores teach each agent anything (``coach_health/...``),
and the warning when an agent's scores carry no signal for several steps in a row."""

from __future__ import annotations

import logging

import pytest

from mappa.coach.stats import (
    NoSignalWatch,
    agent_health,
    coach_health,
    health_metrics,
)
from mappa.records import Action, Episode, Score


def scores(*values: float) -> list[Score]:
    return [Score(v) for v in values]


def test_spread_std_ties_and_mode_share() -> None:
    h = agent_health(scores(2.0, 4.0, 4.0, 8.0), min_reward_spread=0.05, w_process=1.0)
    assert h.n == 4 and h.spread == 6.0
    assert h.std == pytest.approx(2.1794494717703)  # population std of 2, 4, 4, 8
    assert h.tie_rate == pytest.approx(1 / 6)  # one tied pair of six
    assert h.mode_share == 0.5 and h.signal
    assert h.digit_mass is None  # no backend told it


def test_ties_are_within_1e_9_and_the_mode_is_rounded_to_a_tenth() -> None:
    h = agent_health([Score(7.0), Score(7.0 + 1e-12), Score(7.04), Score(6.96)], 0.0, 1.0)
    assert h.tie_rate == pytest.approx(1 / 6)  # 7.0 ~ 7.0+1e-12 only
    assert h.mode_share == 1.0  # every one rounds to 7.0
    assert h.signal  # 0.08 points > 0: with min_reward_spread 0 any difference is signal


def test_all_equal_scores_carry_no_signal_even_with_a_zero_threshold() -> None:
    for threshold in (0.0, 0.05):
        h = agent_health(scores(6.0, 6.0, 6.0), threshold, 1.0)
        assert (h.spread, h.std, h.tie_rate, h.mode_share) == (0.0, 0.0, 1.0, 1.0)
        assert not h.signal


def test_signal_threshold_is_in_reward_units() -> None:
    assert agent_health(scores(6.0, 6.5), 0.05, 1.0).signal  # 0.5 points = 0.05 reward: enough
    assert not agent_health(scores(6.0, 6.4), 0.05, 1.0).signal
    assert not agent_health(scores(2.0, 9.0), 0.8, 1.0).signal  # 0.7 < 0.8
    assert agent_health(scores(5.8, 6.3), 0.05, 1.0).signal  # float noise does not cut it off


@pytest.mark.parametrize(
    ("w_process", "enough", "too_little"),
    [(1.0, 0.5, 0.4), (0.5, 1.0, 0.9), (2.0, 0.25, 0.2), (-2.0, 0.25, 0.2)],
)
def test_signal_threshold_scales_with_the_process_weight(
    w_process: float, enough: float, too_little: float
) -> None:
    # a score enters the reward as w_process * score / 10: at weight 0.5 a half-point
    # spread is 0.025 reward, below rl.min_reward_spread 0.05; at weight 2 a quarter
    # point already reaches it
    assert agent_health(scores(6.0, 6.0 + enough), 0.05, w_process).signal
    assert not agent_health(scores(6.0, 6.0 + too_little), 0.05, w_process).signal


def test_scores_under_a_zero_process_weight_carry_no_signal() -> None:
    assert not agent_health(scores(0.0, 10.0), 0.05, 0.0).signal


def test_a_single_action_has_no_pairs_and_no_signal() -> None:
    h = agent_health(scores(9.0), 0.0, 1.0)
    assert (h.n, h.spread, h.std, h.tie_rate, h.mode_share, h.signal) == (
        1,
        0.0,
        0.0,
        None,
        1.0,
        False,
    )


def test_flagged_fallbacks_are_left_out_but_their_digit_mass_counts() -> None:
    fallback = Score(5.0, flagged=True, flag_reason="low_score_mass", digit_mass=0.1)
    h = agent_health([Score(9.0, digit_mass=0.9), fallback, Score(1.0)], 0.05, 1.0)
    assert h.n == 2 and h.spread == 8.0 and h.tie_rate == 0.0 and h.mode_share == 0.5
    assert h.signal
    assert h.digit_mass == pytest.approx(0.5)  # 0.9 and the flagged 0.1; None ignored
    # one real score and a fallback: not two unflagged scores, so no signal
    h = agent_health([Score(9.0), Score(5.0, flagged=True, flag_reason="unavailable")], 0.0, 1.0)
    assert h.n == 1 and not h.signal


def test_digit_mass_is_none_when_no_score_knows_it() -> None:
    assert agent_health(scores(3.0, 7.0), 0.05, 1.0).digit_mass is None
    assert agent_health([], 0.05, 1.0).digit_mass is None
    h = agent_health([Score(3.0, digit_mass=0.8), Score(7.0)], 0.05, 1.0)
    assert h.digit_mass == pytest.approx(0.8)


def action(agent: str, score: Score | None) -> Action:
    return Action("e", agent, 0, [1], [2], [-0.1], "p", "c", False, coach=score)


def test_coach_health_per_agent_in_order_and_its_metric_keys() -> None:
    episodes = [
        Episode(
            "e0",
            "t",
            "task",
            "1",
            actions=[action("solver", Score(3.0, digit_mass=0.6)), action("verifier", Score(7.0))],
        ),
        Episode(
            "e1",
            "t",
            "task",
            "1",
            actions=[action("solver", Score(8.0, digit_mass=1.0)), action("verifier", Score(7.0))],
        ),
        Episode("e2", "t", "task", "1", actions=[action("idle", None)]),
    ]
    health = coach_health(episodes, ["solver", "idle", "verifier"], 0.05, 1.0)
    assert list(health) == ["solver", "verifier"]  # idle has no scored action
    m = health_metrics(health)
    assert m["coach_health/solver/spread"] == 5.0 and m["coach_health/solver/signal"] == 1
    assert m["coach_health/verifier/spread"] == 0.0 and m["coach_health/verifier/signal"] == 0
    assert m["coach_health/verifier/tie_rate"] == 1.0
    assert m["coach_health/verifier/mode_share"] == 1.0
    assert m["coach_health/verifier/digit_mass"] is None
    assert m["coach_health/solver/digit_mass"] == pytest.approx(0.8)
    assert m["coach_health/solver/std"] == pytest.approx(2.5)
    assert m["coach_health/signal_agents"] == 1 and m["coach_health/agents"] == 2
    assert m["coach_health/digit_mass"] == pytest.approx(0.8)
    assert health_metrics({}) == {}  # no coach (outcome_only): no keys at all


FLAT = agent_health(scores(7.0, 7.0, 7.0), 0.05, 1.0)
GOOD = agent_health(scores(2.0, 9.0), 0.05, 1.0)


def test_the_warning_comes_after_k_steps_without_signal_and_every_k_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = NoSignalWatch(3, 0.05, w_process=1.0)
    seq = [
        {"a": FLAT, "b": GOOD},
        {"a": FLAT, "b": FLAT},
        {"a": GOOD, "b": FLAT},  # a's streak is broken at 2: no warning
        {"a": FLAT},  # b not scored this step: its streak stays at 2
        {"a": FLAT, "b": FLAT},  # b: 3 -> warning
        {"a": FLAT, "b": GOOD},  # a: 3 -> warning
        {"a": FLAT},
        {"a": FLAT},
        {"a": FLAT},  # a: 6 -> reminded
    ]
    streaks = []
    with caplog.at_level(logging.WARNING, logger="mappa.coach.stats"):
        for step in seq:
            out = watch.observe(step)
            streaks.append(
                (
                    out.get("coach_health/a/no_signal_streak"),
                    out.get("coach_health/b/no_signal_streak"),
                )
            )
    assert streaks == [
        (1, 0),
        (2, 1),
        (0, 2),
        (1, None),
        (2, 3),
        (3, 0),
        (4, None),
        (5, None),
        (6, None),
    ]
    assert [w.split("'")[1] for w in watch.warnings] == ["b", "a", "a"]
    assert [r.getMessage() for r in caplog.records] == watch.warnings
    first = watch.warnings[0]
    assert "3 consecutive steps" in first and "coach.warn_no_signal_steps=3" in first
    assert "[0, 0, 0]" in first  # b's recent spreads, points
    assert "[1.00, 1.00, 1.00]" in first  # and mode shares
    for hint in ("mappa coach-check", "stronger coach", "expected", "reference_for: all"):
        assert hint in first


def test_zero_never_warns_but_still_counts() -> None:
    watch = NoSignalWatch(0, 0.05, w_process=1.0)
    for _ in range(5):
        out = watch.observe({"a": FLAT})
    assert out == {"coach_health/a/no_signal_streak": 5} and watch.warnings == []
    with pytest.raises(ValueError):
        NoSignalWatch(-1, 0.05, w_process=1.0)


def test_replay_of_metrics_lines_continues_the_streak_as_if_never_stopped() -> None:
    """A resumed run replays its metrics.jsonl: same streaks, no repeated warning."""
    seq = [{"a": GOOD}, {"a": FLAT}, {"a": FLAT}, {"a": FLAT}, {"a": FLAT}]
    straight = NoSignalWatch(2, 0.05, w_process=1.0)
    rows = []
    for step, health in enumerate(seq):
        rows.append({"step": step, **health_metrics(health), **straight.observe(health)})
    resumed = NoSignalWatch(2, 0.05, w_process=1.0)
    resumed.replay(rows[:3])  # the checkpoint was after step 2 (streak 2, warned once)
    assert resumed.streaks == {"a": 2} and resumed.warnings == []
    later = [resumed.observe(h) for h in seq[3:]]
    assert later == [{"coach_health/a/no_signal_streak": 3}, {"coach_health/a/no_signal_streak": 4}]
    assert resumed.warnings == straight.warnings[1:]  # the step-4 reminder, with its spreads
    resumed.replay([{"coach_health/signal_agents": 0, "coach_health/b/signal": None}])
    assert resumed.streaks == {"a": 4}  # keys that are not an agent's signal are ignored
