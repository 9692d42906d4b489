"""`mappa coach-check`: can this coach tell good actions from bad ones?

Two checks, both scoring through ``build_context`` exactly as training does (the config's
roles, final agent, reference scope, output limit and observation budget):

- **labelled actions**: a small built-in MathChat set (``CASES``) or a JSONL file of one's
  own (``parse_cases``). Per role: the mean score of its good and bad actions and the
  fraction of (good, bad) pairs ranked right (an AUC: 1.0 perfect, 0.5 chance).
- **a run's recorded episodes**, rescored (``rescore_report``): per agent the AUC of the new
  score against the episode's graded outcome, and how much the scores spread at all (a coach
  that says 7 to everything teaches nothing, whatever its mean).

Run it before a long training run. Everything here is pure (no files, no printing): the
command line (``mappa.cli``) reads the files and writes the results.
"""

from __future__ import annotations

import json
import time
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import mean, pstdev
from typing import Any, TypeVar, get_args

from mappa.coach.base import CoachBackend, CoachView, build_context
from mappa.coach.context import CoachContext
from mappa.records import Action, Episode, Score, ToolStatus

TIE_EPS = 1e-9
"""Two scores closer than this are a tie."""

_T = TypeVar("_T")

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
    """One labelled action: ``agent`` wrote ``output`` (and saw ``observation`` from its code
    run) on ``task`` whose answer is ``answer``; ``good`` says whether it is a good action.
    ``agent_input`` is the agent's whole input (default ``Problem: {task}``).
    ``tool_status`` is how its code run ended (None: unknown, or no code ran); a case keeps
    no stdout apart, so a rule reads a run's observation as what it printed."""

    agent: str
    good: bool
    task: str
    answer: str
    output: str
    observation: str | None = None
    agent_input: str | None = None
    truncated: bool = False
    error: str | None = None
    """What kind of mistake a bad action makes (free text): the check reports pairs right
    per kind, to show which mistakes a coach misses."""
    tool_status: ToolStatus | None = None


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
        tool_status="ok",
    ),
    CheckCase(
        "code_executor",
        True,
        _TASK2,
        "33",
        "```python\nprint(40 - 15 + 8)\n```",
        "33",
        tool_status="ok",
    ),
    CheckCase(
        "code_executor",
        False,
        _TASK,
        "24",
        "```python\nprint(12 + 3 + 4)\n```",
        "19",
        tool_status="ok",
    ),
    CheckCase(
        "code_executor",
        False,
        _TASK2,
        "33",
        "```python\nprint(marbles)\n```",
        "NameError: name 'marbles' is not defined",
        tool_status="error",
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


# --------------------------------------------------------------------------- statistics
def pair_accuracy(pos: Sequence[float], neg: Sequence[float], eps: float = TIE_EPS) -> float | None:
    """The fraction of (pos, neg) pairs with pos > neg, a tie (within ``eps``) counting
    half: the AUC of the scores for telling ``pos`` from ``neg`` (1.0 perfect, 0.5 chance).
    None when either side is empty.

    >>> pair_accuracy([8.0, 6.0], [2.0, 6.0])
    0.875
    >>> pair_accuracy([5.0], [5.0 + 1e-12])
    0.5
    >>> pair_accuracy([], [1.0]) is None
    True
    """
    if not pos or not neg:
        return None
    ordered = sorted(neg)
    right = 0.0
    for p in pos:
        below = bisect_left(ordered, p - eps)
        right += below + 0.5 * (bisect_right(ordered, p + eps) - below)
    return right / (len(pos) * len(neg))


def spread(values: Sequence[float]) -> tuple[float, float] | None:
    """(max - min, standard deviation) of ``values``; None for no values.

    >>> spread([2.0, 4.0, 4.0, 6.0])
    (4.0, 1.4142135623730951)
    """
    if not values:
        return None
    return max(values) - min(values), pstdev(values)


def tie_rate(values: Sequence[float], eps: float = TIE_EPS) -> float | None:
    """The share of pairs of ``values`` that are equal (within ``eps``); None below two.

    >>> tie_rate([7.0, 3.0, 7.0, 7.0])
    0.5
    >>> tie_rate([1.0]) is None
    True
    """
    ordered = sorted(values)
    n = len(ordered)
    if n < 2:
        return None
    ties, j = 0, 0
    for i in range(n):  # j: the first value more than eps above ordered[i]
        j = max(j, i + 1)
        while j < n and ordered[j] - ordered[i] <= eps:
            j += 1
        ties += j - i - 1
    return ties / (n * (n - 1) / 2)


def mode_share(values: Sequence[float]) -> tuple[float, float] | None:
    """The most common value rounded to 0.1, and the share of ``values`` it holds; None
    for no values.

    >>> mode_share([7.04, 6.96, 7.0, 3.0])
    (7.0, 0.75)
    """
    if not values:
        return None
    value, count = Counter(round(v, 1) for v in values).most_common(1)[0]
    return value, count / len(values)


def mean_digit_mass(scores: Iterable[Score]) -> float | None:
    """The mean probability the coach put on any score 0-10 where it read one, over the
    scores that know it (flagged ones too: a low mass is what flags them); None if none.

    >>> mean_digit_mass([Score(7.0, digit_mass=0.9), Score(5.0), Score(2.0, digit_mass=0.5)])
    0.7
    """
    masses = [s.digit_mass for s in scores if s.digit_mass is not None]
    return mean(masses) if masses else None


def spaced(items: Sequence[_T], n: int | None) -> list[_T]:
    """``n`` items spread evenly over ``items``, in order (all of them when ``n`` is None or
    not smaller).

    >>> spaced(list(range(10)), 3)
    [0, 3, 6]
    """
    if n is None or n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def timed_score(coach: CoachBackend, contexts: Sequence[CoachContext]) -> tuple[list[Score], float]:
    """The coach's scores of ``contexts`` (one call, as training makes) and its wall time."""
    start = time.monotonic()
    scores = coach.score(contexts)
    return scores, time.monotonic() - start


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _line(first: str, cells: Sequence[str], widths: Sequence[int]) -> str:
    """A table line: ``first`` left-aligned, then each cell right-aligned in its width."""
    return f"{first:<16}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))


def view_summary(
    contexts: Sequence[CoachContext], self_solve: bool = False, agreement_weight: float = 0.0
) -> dict[str, Any]:
    """What the coach was shown, read from the contexts it scored: the agents that saw the
    reference and those that did not, whether any saw the grader's verdict or hindsight
    (``coach.hindsight``: none on a case, which has no later episode), and whether the
    coach's own worked answer stood in for the reference (``coach.self_solve``, blended
    with its agreement check at ``agreement_weight``).

    >>> ctxs = case_contexts(CASES, ROLES, "verifier", CoachView(reference_for="final"))
    >>> view_summary(ctxs)["reference_for"], view_summary(ctxs)["answer_check"]
    (['verifier'], False)
    """
    agents = list(dict.fromkeys(c.agent for c in contexts))
    shown = [a for a in agents if any(c.ground_truth is not None for c in contexts if c.agent == a)]
    hidden = [a for a in agents if a not in shown]
    return {
        "reference_for": shown,
        "no_reference": hidden,
        "answer_check": any(c.answer_check is not None for c in contexts),
        "hindsight": any(c.hindsight is not None for c in contexts),
        "self_solve": self_solve and bool(hidden),
        "agreement_weight": agreement_weight if self_solve and hidden else 0.0,
    }


def view_line(summary: Mapping[str, Any]) -> str:
    """``view_summary`` in one line for the text report.

    >>> view_line({"reference_for": ["verifier"], "no_reference": ["solver"],
    ...            "answer_check": False, "hindsight": False, "self_solve": True,
    ...            "agreement_weight": 0.5})
    "view: reference shown to verifier; none to solver (the coach's own worked answer \
instead, agreement weight 0.5); grader's verdict: not shown; hindsight: not shown"
    """
    shown = ", ".join(summary["reference_for"]) or "no agent"
    line = f"view: reference shown to {shown}"
    if summary["no_reference"]:
        line += "; none to " + ", ".join(summary["no_reference"])
        if summary["self_solve"]:
            line += " (the coach's own worked answer instead"
            weight = summary["agreement_weight"]
            line += f", agreement weight {weight:g})" if weight else ")"
    verdict = "shown" if summary["answer_check"] else "not shown"
    later = "shown" if summary["hindsight"] else "not shown"
    return f"{line}; grader's verdict: {verdict}; hindsight: {later}"


# --------------------------------------------------------------------- labelled actions
class CaseError(ValueError):
    """A cases file that cannot be used; the message names the file and the line."""


_KEY_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "agent": ((str,), "a string"),
    "task": ((str,), "a string"),
    "answer": ((str, int, float), "a string or a number"),
    "output": ((str,), "a string"),
    "observation": ((str, type(None)), "a string or null"),
    "good": ((bool,), "true or false"),
    "input": ((str,), "a string"),
    "truncated": ((bool,), "true or false"),
    "error": ((str, type(None)), "a string or null"),
    "tool_status": ((str, type(None)), "one of " + ", ".join(get_args(ToolStatus)) + " or null"),
}
REQUIRED_KEYS = ("agent", "task", "answer", "output", "observation", "good")
"""Keys every line of a cases file has (``input``, ``truncated``, ``error`` and
``tool_status`` are optional)."""


def parse_case(obj: object, agents: Sequence[str], where: str) -> CheckCase:
    """One line's JSON object as a case; ``CaseError`` naming ``where`` and the key for a
    missing or unknown key, a value of the wrong type, or an agent the config does not have.

    >>> line = {"agent": "verifier", "task": "1+1?", "answer": 2, "output": "\\\\boxed{2}",
    ...         "observation": None, "good": True}
    >>> parse_case(line, ["verifier"], "c.jsonl: line 1").answer
    '2'
    >>> parse_case({**line, "good": "yes"}, ["verifier"], "c.jsonl: line 2")
    Traceback (most recent call last):
    ...
    mappa.coach.check.CaseError: c.jsonl: line 2: 'good' must be true or false, not "yes"
    >>> parse_case({**line, "agent": "critic"}, ["verifier"], "c.jsonl: line 3")
    Traceback (most recent call last):
    ...
    mappa.coach.check.CaseError: c.jsonl: line 3: agent 'critic' is not one of the config's \
agents ['verifier']
    """
    if not isinstance(obj, dict):
        raise CaseError(f"{where}: not a JSON object but {type(obj).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in obj]
    if missing:
        raise CaseError(f"{where}: missing {', '.join(map(repr, missing))}")
    unknown = [k for k in obj if k not in _KEY_TYPES]
    if unknown:
        raise CaseError(
            f"{where}: unknown key {', '.join(map(repr, unknown))} (keys: {', '.join(_KEY_TYPES)})"
        )
    for key, value in obj.items():
        types, what = _KEY_TYPES[key]
        wrong_status = key == "tool_status" and value not in (None, *get_args(ToolStatus))
        if (
            not isinstance(value, types)
            or (isinstance(value, bool) and bool not in types)
            or wrong_status
        ):
            raise CaseError(f"{where}: {key!r} must be {what}, not {json.dumps(value)[:60]}")
    if obj["agent"] not in agents:
        raise CaseError(
            f"{where}: agent {obj['agent']!r} is not one of the config's agents {list(agents)}"
        )
    return CheckCase(
        agent=obj["agent"],
        good=obj["good"],
        task=obj["task"],
        answer=str(obj["answer"]),
        output=obj["output"],
        observation=obj["observation"],
        agent_input=obj.get("input"),
        truncated=obj.get("truncated", False),
        error=obj.get("error"),
        tool_status=obj.get("tool_status"),
    )


def parse_cases(lines: Iterable[str], agents: Sequence[str], source: str) -> list[CheckCase]:
    """Every non-blank line of a cases file (one JSON object a line) as a case; a
    ``CaseError`` names the file and the line of the first bad one (``parse_case``), and
    any agent with good cases but no bad one or the other way round.

    >>> good = '{"agent": "v", "task": "t", "answer": "1", "output": "1", "observation": null'
    >>> parse_cases([good + ', "good": true}', ""], ["v"], "c.jsonl")
    Traceback (most recent call last):
    ...
    mappa.coach.check.CaseError: c.jsonl: agent 'v' has 1 good and 0 bad cases; every agent \
in the file needs at least one of each
    """
    cases = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}: line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise CaseError(f"{where}: not valid JSON ({err.msg}, column {err.colno})") from None
        cases.append(parse_case(obj, agents, where))
    if not cases:
        raise CaseError(f"{source}: no cases (one JSON object a line)")
    check_labels(cases, source)
    return cases


def check_labels(cases: Sequence[CheckCase], source: str) -> None:
    """Every agent in ``cases`` has a good and a bad case (else no pair can be ranked)."""
    for agent in dict.fromkeys(c.agent for c in cases):
        n_good = sum(c.good for c in cases if c.agent == agent)
        n_bad = sum(not c.good for c in cases if c.agent == agent)
        if not n_good or not n_bad:
            raise CaseError(
                f"{source}: agent {agent!r} has {n_good} good and {n_bad} bad cases; every "
                "agent in the file needs at least one of each"
            )


def builtin_team(roles: Mapping[str, str], final_agent: str) -> tuple[dict[str, str], str]:
    """The team the built-in MathChat set is judged as: the config's roles for the agents it
    has, the built-in roles for the others; the final agent is the config's when the set
    has it, else the verifier.

    >>> roles, final = builtin_team({"verifier": "Checks."}, "verifier")
    >>> roles["verifier"], roles["problem_solver"][:7], final
    ('Checks.', 'Reasons', 'verifier')
    >>> builtin_team({"analyst": "Plots."}, "analyst")[1]
    'verifier'
    """
    return {**ROLES, **roles}, final_agent if final_agent in ROLES else "verifier"


def case_episode(case: CheckCase, index: int = 0) -> Episode:
    """A one-action episode holding ``case``: the coach sees it through ``build_context``
    exactly as it sees a rollout's action."""
    eid = f"check-{index}"
    action = Action(
        episode_id=eid,
        agent=case.agent,
        turn=0,
        prompt_ids=[],
        completion_ids=[],
        sample_logprobs=[],
        prompt_text=case.agent_input or f"Problem: {case.task}",
        completion_text=case.output,
        truncated=case.truncated,
        tool_observation=case.observation,
        tool_status=case.tool_status,
    )
    return Episode(eid, eid, case.task, case.answer, actions=[action])


Grader = Callable[[str, str], tuple[str | None, bool | None]]
"""``(reply, reference) -> (final answer extracted, correct)``: the run's answer grader
(``correct`` None: the comparison gave no verdict in time)."""


def case_contexts(
    cases: Sequence[CheckCase],
    roles: Mapping[str, str],
    final_agent: str,
    view: CoachView = CoachView(),
    grade: Grader | None = None,
) -> list[CoachContext]:
    """The coach's view of each case, built as training builds it (``build_context``): the
    reference shown per ``view.reference_for`` (``coach.reference_scope``), the observation
    cut to ``view.observation_chars``. With ``view.answer_check``, ``grade`` grades the final
    agent's cases as the run grades an episode (only then: the verdict is all it feeds).

    >>> ctxs = case_contexts(CASES, ROLES, "verifier", CoachView(reference_for="final"))
    >>> [(c.agent, c.ground_truth) for c in ctxs][8], ctxs[0].ground_truth is None
    (('verifier', '24'), True)
    >>> hidden = CoachView(reference_for="none")
    >>> {c.ground_truth for c in case_contexts(CASES, ROLES, "verifier", hidden)}
    {None}
    """
    out = []
    for i, case in enumerate(cases):
        ep = case_episode(case, i)
        if grade is not None and view.answer_check and case.agent == final_agent:
            ep.final_answer, verdict = grade(case.output, case.answer)
            ep.correct, ep.grader_timed_out = verdict is True, verdict is None
        out.append(build_context(ep, ep.actions[0], roles, final_agent, view))
    return out


@dataclass(frozen=True)
class RoleCheck:
    """One role's row: how many good and bad cases, their mean scores, the fraction of
    (good, bad) pairs ranked right (an AUC), flagged replies, mean digit mass (None where
    the backend does not know it)."""

    role: str
    n_good: int
    n_bad: int
    good: float
    bad: float
    pairs_right: float
    flagged: int
    digit_mass: float | None
    by_error: dict[str, float]
    """Per kind of bad action (the cases' ``error``): its pairs right against every good one."""

    def to_json(self) -> dict[str, Any]:
        return {
            "n_good": self.n_good,
            "n_bad": self.n_bad,
            "good": self.good,
            "bad": self.bad,
            "gap": self.good - self.bad,
            "pairs_right": self.pairs_right,
            "flagged": self.flagged,
            "digit_mass": self.digit_mass,
            "by_error": self.by_error,
        }


def discrimination(scores: Sequence[Score], cases: Sequence[CheckCase] = CASES) -> list[RoleCheck]:
    """Per role, in the order the cases name them: its ``RoleCheck``. A flagged reply
    counts with its fallback value: a failed judgement ranks nothing. Every role needs a
    good and a bad case (``check_labels``).

    >>> rows = discrimination([Score(5.0)] * len(CASES))  # a coach that says 5 to everything
    >>> [(r.role, r.pairs_right) for r in rows][0]
    ('problem_solver', 0.5)
    """
    check_labels(cases, "cases")
    rows = []
    for role in dict.fromkeys(c.agent for c in cases):
        mine = [(s, c) for s, c in zip(scores, cases, strict=True) if c.agent == role]
        good = [s.value for s, c in mine if c.good]
        bad = [s.value for s, c in mine if not c.good]
        right = pair_accuracy(good, bad)
        assert right is not None  # check_labels: both sides have a case
        kinds: dict[str, list[float]] = {}
        for score, case in mine:
            if not case.good and case.error is not None:
                kinds.setdefault(case.error, []).append(score.value)
        by_error = {k: pair_accuracy(good, v) or 0.0 for k, v in sorted(kinds.items())}
        rows.append(
            RoleCheck(
                role,
                len(good),
                len(bad),
                mean(good),
                mean(bad),
                right,
                sum(s.flagged for s, _ in mine),
                mean_digit_mass(s for s, _ in mine),
                by_error,
            )
        )
    return rows


USABLE = 0.75
"""The overall pair accuracy (and no flagged reply) at which the table calls a coach usable."""


@dataclass(frozen=True)
class CheckReport:
    """The labelled-action check: one row per role, and the scoring call as a whole."""

    rows: list[RoleCheck]
    actions: int
    seconds: float
    flagged: int
    cached: int
    digit_mass: float | None
    scores: list[float]
    """Each case's score, in the cases' order: to see which actions a coach gets wrong."""

    @property
    def overall(self) -> float:
        """The mean over roles of the fraction of pairs ranked right."""
        return mean(r.pairs_right for r in self.rows)

    @property
    def seconds_per_action(self) -> float:
        return self.seconds / max(self.actions, 1)

    @property
    def usable(self) -> bool:
        return self.overall >= USABLE and not self.flagged

    def to_json(self) -> dict[str, Any]:
        return {
            "overall": self.overall,
            "usable": self.usable,
            "roles": {r.role: r.to_json() for r in self.rows},
            "actions": self.actions,
            "seconds_per_action": self.seconds_per_action,
            "flagged": self.flagged,
            "cached": self.cached,
            "digit_mass": self.digit_mass,
            "scores": self.scores,
        }

    def table(self) -> str:
        head = ["role", "good/bad", "good", "bad", "gap", "pairs right", "flagged", "digit mass"]
        lines = [_line(head[0], head[1:], _WIDTHS)]
        for r in self.rows:
            cells = [
                f"{r.n_good}/{r.n_bad}",
                f"{r.good:.2f}",
                f"{r.bad:.2f}",
                f"{r.good - r.bad:.2f}",
                f"{r.pairs_right:.0%}",
                str(r.flagged),
                _fmt(r.digit_mass),
            ]
            lines.append(_line(r.role, cells, _WIDTHS))
        for r in self.rows:
            if r.by_error:
                kinds = ", ".join(f"{k} {v:.0%}" for k, v in r.by_error.items())
                lines.append(f"  {r.role} pairs right by bad kind: {kinds}")
        verdict = "usable" if self.usable else "NOT reliable: use a stronger coach"
        cached = f" ({self.cached} from the cache)" if self.cached else ""
        lines.append(
            f"overall pairs right: {self.overall:.0%}; flagged replies: {self.flagged}/"
            f"{self.actions}; {self.seconds_per_action:.2f} s per action{cached} -> {verdict}"
        )
        return "\n".join(lines)


_WIDTHS = (10, 8, 8, 8, 13, 9, 12)


def check_report(
    scores: Sequence[Score], cases: Sequence[CheckCase], seconds: float
) -> CheckReport:
    """The report of ``scores`` (one per case, in order) that took ``seconds`` to get."""
    return CheckReport(
        discrimination(scores, cases),
        len(scores),
        seconds,
        sum(s.flagged for s in scores),
        sum(s.cached for s in scores),
        mean_digit_mass(scores),
        [s.value for s in scores],
    )


# ------------------------------------------------------------------- recorded episodes
def unknown_agents(episodes: Sequence[Episode], agents: Sequence[str]) -> list[str]:
    """Agents that act in ``episodes`` but are not in ``agents`` (the config's)."""
    seen = dict.fromkeys(a.agent for ep in episodes for a in ep.actions)
    return [a for a in seen if a not in agents]


@dataclass(frozen=True)
class AgentRescore:
    """One agent's rescored actions.

    ``auc``: the fraction of (action of a correct episode, action of a wrong one) pairs
    the new score ranks right, ties half (None when either class is empty);
    ``oracle_auc``: the same against each action's own oracle verdict (``Action.oracle``:
    whether its result equals the reference), the per-action yardstick for upstream agents
    whose episode another agent lost; ``recorded_auc``: the same for the scores the run
    recorded; ``spread`` (max - min),
    ``std``, ``tie_rate`` (share of pairs within ``TIE_EPS``), ``mode`` (the most common
    score rounded to 0.1) and its ``mode_share``: how much the scores vary at all. All of
    these leave flagged fallbacks out (training does too); ``digit_mass`` counts them.
    """

    agent: str
    actions: int
    graded: int
    auc: float | None
    oracle_auc: float | None
    recorded_auc: float | None
    mean: float | None
    spread: float | None
    std: float | None
    tie_rate: float | None
    mode: float | None
    mode_share: float | None
    digit_mass: float | None
    flagged: int

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "agent"}


def agent_rescore(agent: str, rows: Sequence[tuple[Episode, Action, Score]]) -> AgentRescore:
    """``AgentRescore`` of one agent's (episode, action, new score) rows.

    >>> def row(value, correct):
    ...     ep = Episode("e", "t", "task", "1", correct=correct)
    ...     return ep, case_episode(CASES[0]).actions[0], Score(value)
    >>> r = agent_rescore("a", [row(8.0, True), row(3.0, False), row(3.0, None), row(5.0, False)])
    >>> r.auc, r.graded, r.spread, r.mode, r.mode_share, r.recorded_auc, r.oracle_auc
    (1.0, 3, 5.0, 3.0, 0.5, None, None)
    """
    kept = [(ep, a, s) for ep, a, s in rows if not s.flagged]
    values = [s.value for _, _, s in kept]
    graded = [(ep, a, s) for ep, a, s in kept if ep.correct is not None]
    recorded = [(ep, a.coach) for ep, a, _ in rows if ep.correct is not None and a.coach]
    recorded = [(ep, s) for ep, s in recorded if not s.flagged]
    spread_std = spread(values)
    mode = mode_share(values)
    return AgentRescore(
        agent=agent,
        actions=len(rows),
        graded=len(graded),
        auc=pair_accuracy(
            [s.value for ep, _, s in graded if ep.correct],
            [s.value for ep, _, s in graded if not ep.correct],
        ),
        oracle_auc=pair_accuracy(
            [s.value for _, a, s in kept if a.oracle is True],
            [s.value for _, a, s in kept if a.oracle is False],
        ),
        recorded_auc=pair_accuracy(
            [s.value for ep, s in recorded if ep.correct],
            [s.value for ep, s in recorded if not ep.correct],
        ),
        mean=mean(values) if values else None,
        spread=None if spread_std is None else spread_std[0],
        std=None if spread_std is None else spread_std[1],
        tie_rate=tie_rate(values),
        mode=None if mode is None else mode[0],
        mode_share=None if mode is None else mode[1],
        digit_mass=mean_digit_mass(s for _, _, s in rows),
        flagged=len(rows) - len(kept),
    )


@dataclass(frozen=True)
class RescoreReport:
    """A run's episodes rescored: one row per agent, and the scoring call as a whole."""

    rows: list[AgentRescore]
    episodes: int
    graded: int
    actions: int
    seconds: float
    flagged: int
    cached: int
    digit_mass: float | None

    @property
    def overall(self) -> float | None:
        """The mean AUC over the agents that have one."""
        aucs = [r.auc for r in self.rows if r.auc is not None]
        return mean(aucs) if aucs else None

    @property
    def seconds_per_action(self) -> float:
        return self.seconds / max(self.actions, 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "overall": self.overall,
            "agents": {r.agent: r.to_json() for r in self.rows},
            "episodes": self.episodes,
            "graded_episodes": self.graded,
            "actions": self.actions,
            "seconds_per_action": self.seconds_per_action,
            "flagged": self.flagged,
            "cached": self.cached,
            "digit_mass": self.digit_mass,
        }

    def table(self) -> str:
        head = ["actions", "AUC", "oracle", "recorded", "mean", "spread", "std", "ties", "mode"]
        head += ["share", "digit mass", "flagged"]
        widths = (8, 7, 7, 9, 7, 7, 6, 7, 6, 7, 11, 8)
        lines = [_line("agent", head, widths)]
        for r in self.rows:
            cells = [
                str(r.actions),
                _fmt(r.auc),
                _fmt(r.oracle_auc),
                _fmt(r.recorded_auc),
                _fmt(r.mean),
                _fmt(r.spread),
                _fmt(r.std),
                _fmt(r.tie_rate, ".0%"),
                _fmt(r.mode, ".1f"),
                _fmt(r.mode_share, ".0%"),
                _fmt(r.digit_mass),
                str(r.flagged),
            ]
            lines.append(_line(r.agent, cells, widths))
        cached = f" ({self.cached} from the cache)" if self.cached else ""
        lines.append(
            f"{self.episodes} episodes ({self.graded} graded), {self.actions} actions; mean AUC "
            f"against the outcome: {_fmt(self.overall)}; flagged: {self.flagged}; "
            f"{self.seconds_per_action:.2f} s per action{cached}"
        )
        lines.append(
            "AUC: actions of correct episodes ranked above those of wrong ones (0.5 = chance); "
            "oracle: actions whose own result is right above those whose result is wrong "
            "(Action.oracle); recorded: the run's own coach"
        )
        return "\n".join(lines)


def rescore_report(
    episodes: Sequence[Episode],
    scores: Sequence[Score],
    seconds: float,
    agents: Sequence[str],
) -> RescoreReport:
    """The report of the new ``scores`` (one per action of ``episodes``, in order), per
    agent in ``agents``' order."""
    rows = [(ep, a) for ep in episodes for a in ep.actions]
    triples = [(ep, a, s) for (ep, a), s in zip(rows, scores, strict=True)]
    return RescoreReport(
        [
            agent_rescore(name, [t for t in triples if t[1].agent == name])
            for name in agents
            if any(a.agent == name for _, a in rows)
        ],
        len(episodes),
        sum(ep.correct is not None for ep in episodes),
        len(scores),
        seconds,
        sum(s.flagged for s in scores),
        sum(s.cached for s in scores),
        mean_digit_mass(scores),
    )
