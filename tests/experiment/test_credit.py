"""Credit assignment from recorded actions: the coach's scores against the oracle's
per-action verdicts (pure logic over rows as ``records.action_rows`` writes them)."""

from __future__ import annotations

from typing import Any

from mappa.experiment.credit import (
    AgentAuc,
    Blame,
    ToolOutcome,
    by_tool_outcome,
    first_wrong_blame,
    oracle_auc,
)

AGENTS = ["problem_solver", "code_executor", "verifier"]


def _row(episode: str, agent: str, score: float | None, oracle: bool | None, **kw: Any) -> dict:
    return {"episode_id": episode, "agent": agent, "turn": 0, "score": score,
            "oracle": oracle, "correct": False, "flagged": False, **kw}  # fmt: skip


def test_auc_counts_ties_as_half_and_skips_what_it_cannot_judge() -> None:
    rows = [
        _row("a", "problem_solver", 7.0, True),
        _row("b", "problem_solver", 7.0, False),  # a tie with the right one: half a pair
        _row("c", "problem_solver", 1.0, False),
        _row("d", "problem_solver", 0.0, True, flagged=True),  # a fallback, not a judgement
        _row("e", "problem_solver", None, True),  # no coach (an outcome arm)
        _row("f", "code_executor", 5.0, None),  # no verdict recorded
        _row("g", "verifier", 3.0, False),  # only wrong ones: no AUC
    ]
    assert oracle_auc(rows, AGENTS) == [
        AgentAuc("problem_solver", 0.75, 1, 2),
        AgentAuc("code_executor", None, 0, 0),
        AgentAuc("verifier", None, 0, 1),
    ]


def test_blame_falls_on_the_first_agent_that_went_wrong() -> None:
    rows = [
        # the solver erred, the coach scored it lowest: a hit
        _row("1", "problem_solver", 1.0, False), _row("1", "code_executor", 4.0, False),
        _row("1", "verifier", 2.0, False),
        # the solver erred, the coach blamed the verifier: a miss
        _row("2", "problem_solver", 6.0, False), _row("2", "code_executor", 5.0, False),
        _row("2", "verifier", 1.0, False),
        # nobody wrong by the oracle: not counted
        _row("3", "problem_solver", 6.0, True), _row("3", "verifier", 1.0, True),
        # a tie for the lowest: not counted
        _row("4", "problem_solver", 1.0, False), _row("4", "verifier", 1.0, False),
        # a won episode: not counted
        _row("5", "problem_solver", 1.0, False, correct=True),
        # an action without a score: not counted
        _row("6", "problem_solver", None, False), _row("6", "verifier", 1.0, False),
    ]  # fmt: skip
    assert first_wrong_blame(rows, AGENTS) == Blame(hits=1, episodes=2)
    assert first_wrong_blame([], AGENTS) == Blame(0, 0)


def test_tool_outcomes_show_what_a_reply_that_ran_no_code_was_paid() -> None:
    rows = [
        _row("a", "code_executor", 10.0, False),  # stated a number, ran nothing
        _row("b", "code_executor", 9.0, True, tool_status=None),
        _row("c", "code_executor", 4.0, True, tool_status="ok"),
        _row("d", "code_executor", 0.0, False, tool_status="error", flagged=True),  # fallback
        _row("e", "code_executor", 2.0, None, tool_status="timeout"),  # no verdict recorded
        _row("f", "problem_solver", 7.0, True),  # no tool: not grouped
        _row("g", "verifier", None, False, tool_status="ok"),  # an outcome arm: no score
    ]
    assert by_tool_outcome(rows, AGENTS) == [  # in pipeline order, ok first, no code last
        ToolOutcome("code_executor", "ok", 1, 4.0, 1.0),
        ToolOutcome("code_executor", "error", 1, None, 0.0),
        ToolOutcome("code_executor", "timeout", 1, 2.0, None),
        ToolOutcome("code_executor", "no code", 2, 9.5, 0.5),
        ToolOutcome("verifier", "ok", 1, None, 0.0),
    ]
    assert by_tool_outcome([], AGENTS) == []
