"""`mappa coach-check`: can this coach tell good actions from bad ones?

A small built-in set of clearly good and clearly bad MathChat actions per role is scored by
the configured coach; the table shows mean scores and the fraction of (good, bad) pairs the
coach ranks correctly (an AUC: 1.0 perfect, 0.5 chance). Run it before a long training run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mappa.coach.base import CoachBackend
from mappa.coach.context import CoachContext

_TASK = (
    "Ava has 12 apples. Then she buys 3 boxes with 4 apples in each box. "
    "How many apples does Ava have now?"
)
_TASK2 = (
    "Ben has 40 marbles. He gives away 15 marbles, then gets 8 more. "
    "How many marbles does Ben have now?"
)

ROLES = {
    "problem_solver": "Reasons step by step about the problem and proposes a solution.",
    "code_executor": "Writes Python that computes the answer and reports the printed result.",
    "verifier": "Checks the team's work and gives the final answer as \\boxed{answer}.",
}


@dataclass(frozen=True)
class CheckCase:
    agent: str
    good: bool
    task: str
    answer: str
    output: str
    observation: str | None = None


CASES: tuple[CheckCase, ...] = (
    CheckCase(
        "problem_solver",
        True,
        _TASK,
        "24",
        "3 boxes x 4 apples = 12 apples bought. 12 + 12 = 24. Ava has 24 apples.",
    ),
    CheckCase(
        "problem_solver",
        True,
        _TASK2,
        "33",
        "40 - 15 = 25 marbles left, then 25 + 8 = 33. Ben has 33 marbles.",
    ),
    CheckCase(
        "problem_solver",
        False,
        _TASK,
        "24",
        "Ava has 12 apples and 3 boxes, so 12 + 3 + 4 = 19 apples.",
    ),
    CheckCase(
        "problem_solver",
        False,
        _TASK2,
        "33",
        "I like marbles. Marbles are small glass balls used in games.",
    ),
    CheckCase(
        "code_executor",
        True,
        _TASK,
        "24",
        "```python\napples = 12 + 3 * 4\nprint(apples)\n```",
        "24",
    ),
    CheckCase("code_executor", True, _TASK2, "33", "```python\nprint(40 - 15 + 8)\n```", "33"),
    CheckCase("code_executor", False, _TASK, "24", "```python\nprint(12 + 3 + 4)\n```", "19"),
    CheckCase(
        "code_executor",
        False,
        _TASK2,
        "33",
        "```python\nprint(marbles)\n```",
        "NameError: name 'marbles' is not defined",
    ),
    CheckCase(
        "verifier",
        True,
        _TASK,
        "24",
        "The code printed 24, which matches 12 + 3*4. \\boxed{24}",
        "24",
    ),
    CheckCase(
        "verifier", True, _TASK2, "33", "40 - 15 + 8 = 33, confirmed by the code. \\boxed{33}", "33"
    ),
    CheckCase("verifier", False, _TASK, "24", "The answer is probably 19. \\boxed{19}", "24"),
    CheckCase("verifier", False, _TASK2, "33", "I am not sure what the answer is.", "33"),
)


def contexts(roles: Mapping[str, str], final_agent: str = "verifier") -> list[CoachContext]:
    return [
        CoachContext(
            task=c.task,
            agent=c.agent,
            role=roles.get(c.agent, ROLES[c.agent]),
            turn=0,
            agent_input=f"Problem: {c.task}",
            output=c.output,
            observation=c.observation,
            is_final=c.agent == final_agent,
            ground_truth=c.answer if c.agent == final_agent else None,
        )
        for c in CASES
    ]


@dataclass(frozen=True)
class RoleCheck:
    """One role's row of the table: mean score of its good and bad cases, and the fraction
    of (good, bad) pairs the coach ranks right (an AUC)."""

    role: str
    good: float
    bad: float
    pairs_right: float


def discrimination(values: Sequence[float], cases: Sequence[CheckCase] = CASES) -> list[RoleCheck]:
    """Per role: mean good, mean bad, and the fraction of (good, bad) pairs ranked right."""
    rows = []
    for agent in ROLES:
        good = [v for v, c in zip(values, cases, strict=True) if c.agent == agent and c.good]
        bad = [v for v, c in zip(values, cases, strict=True) if c.agent == agent and not c.good]
        pairs = [(g > b) + 0.5 * (g == b) for g in good for b in bad]
        rows.append(
            RoleCheck(agent, sum(good) / len(good), sum(bad) / len(bad), sum(pairs) / len(pairs))
        )
    return rows


def run_check(coach: CoachBackend, roles: Mapping[str, str]) -> tuple[str, float]:
    """Score the built-in set; return the printed table and the overall pair accuracy."""
    scores = coach.score(contexts(roles))
    rows = discrimination([s.value for s in scores])
    flagged = sum(s.flagged for s in scores)
    lines = [f"{'role':<16}{'good':>8}{'bad':>8}{'gap':>8}{'pairs right':>14}"]
    for r in rows:
        lines.append(
            f"{r.role:<16}{r.good:>8.2f}{r.bad:>8.2f}{r.good - r.bad:>8.2f}{r.pairs_right:>14.0%}"
        )
    overall = sum(r.pairs_right for r in rows) / len(rows)
    verdict = "usable" if overall >= 0.75 and not flagged else "NOT reliable: use a stronger coach"
    lines.append(
        f"overall pairs right: {overall:.0%}; flagged replies: {flagged}/{len(scores)} -> {verdict}"
    )
    return "\n".join(lines), overall
