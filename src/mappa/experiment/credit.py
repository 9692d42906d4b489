"""Credit assignment read from a run's recorded training actions (``records.action_rows``):
does the coach score the actions the answer oracle finds right above the ones it finds
wrong, in a failed episode does it score lowest the agent that went wrong first, and what
does it give a tool-using agent's reply by how its code run ended (or that it ran none)?

The oracle's per-action verdict (its result equals the reference) is recorded for every run
whatever its reward, so the coach's scores can be checked against it after the run; the
episode's outcome cannot assign credit upstream, which is what a per-action coach is for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any, get_args

from mappa.coach.check import pair_accuracy
from mappa.records import ToolStatus

Row = Mapping[str, Any]


@dataclass(frozen=True)
class AgentAuc:
    """One agent's scores against the oracle: the AUC (None without both kinds of action)
    and how many scored actions the oracle found right and wrong."""

    agent: str
    auc: float | None
    right: int
    wrong: int


def _usable(rows: Iterable[Row]) -> list[Row]:
    """Actions with a score that is not a flagged fallback."""
    return [r for r in rows if r.get("score") is not None and not r.get("flagged")]


def _scored(rows: Iterable[Row]) -> list[Row]:
    """Actions with a usable score and an oracle verdict."""
    return [r for r in _usable(rows) if r.get("oracle") is not None]


def oracle_auc(rows: Iterable[Row], agents: Sequence[str]) -> list[AgentAuc]:
    """Per agent (in ``agents``' order), the AUC of its scores against the oracle's
    verdicts: the chance that a right action scores above a wrong one, ties half (the
    ``pair_accuracy`` that ``mappa coach-check --episodes`` reports).

    >>> pairs = [(9, True), (2, False), (5, False)]
    >>> rows = [{"agent": "s", "score": s, "oracle": o} for s, o in pairs]
    >>> [(a.agent, a.auc, a.right, a.wrong) for a in oracle_auc(rows, ["s", "v"])]
    [('s', 1.0, 1, 2), ('v', None, 0, 0)]
    """
    scored = _scored(rows)
    out = []
    for agent in agents:
        mine = [r for r in scored if r["agent"] == agent]
        right = [float(r["score"]) for r in mine if r["oracle"]]
        wrong = [float(r["score"]) for r in mine if not r["oracle"]]
        out.append(AgentAuc(agent, pair_accuracy(right, wrong), len(right), len(wrong)))
    return out


@dataclass(frozen=True)
class Blame:
    """Failed episodes where the coach's lowest score fell on the agent that went wrong
    first (``hits``), of those where both are known (``episodes``)."""

    hits: int
    episodes: int


def first_wrong_blame(rows: Iterable[Row], agents: Sequence[str]) -> Blame:
    """In each failed episode (``correct`` false) whose actions all carry a usable score and
    a verdict: is the agent whose action scored lowest the first one, in pipeline order
    (``agents``, then turn), that the oracle found wrong? An episode with no wrong action
    or a tie for the lowest score counts in neither.

    >>> row = lambda ag, s, o: {"episode_id": "e", "agent": ag, "turn": 0, "score": s,
    ...                         "oracle": o, "correct": False}
    >>> first_wrong_blame([row("s", 8, True), row("c", 1, False), row("v", 3, False)], "scv")
    Blame(hits=1, episodes=1)
    """
    order = {a: i for i, a in enumerate(agents)}
    ordered = sorted(
        (r for r in rows if r.get("correct") is False),
        key=lambda r: (str(r["episode_id"]), order.get(r["agent"], len(order)), r["turn"]),
    )
    hits = episodes = 0
    for _, group in groupby(ordered, key=lambda r: str(r["episode_id"])):
        actions = list(group)
        if len(_scored(actions)) < len(actions):
            continue
        wrong = [r for r in actions if not r["oracle"]]
        lowest = min(float(r["score"]) for r in actions)
        low = [r for r in actions if float(r["score"]) == lowest]
        if not wrong or len(low) > 1:
            continue
        episodes += 1
        hits += low[0]["agent"] == wrong[0]["agent"]
    return Blame(hits, episodes)


NO_CODE = "no code"
"""The tool outcome of a tool-using agent's reply that ran no program."""


@dataclass(frozen=True)
class ToolOutcome:
    """A tool-using agent's training actions that ended one way (``status``: a
    ``records.ToolStatus`` or ``NO_CODE``): how many, their mean usable score (None
    without one) and the share the oracle found right (None without a verdict)."""

    agent: str
    status: str
    actions: int
    mean_score: float | None
    oracle_right: float | None


def by_tool_outcome(rows: Iterable[Row], agents: Sequence[str]) -> list[ToolOutcome]:
    """Per agent that ran code at least once (in ``agents``' order), its actions grouped by
    how the code run ended, replies that ran none included. A reward that pays a reply for
    stating a result whether or not a program produced it shows here as a high mean score
    on ``no code``.

    >>> rows = [{"agent": "c", "tool_status": t, "score": s, "oracle": o, "flagged": False}
    ...         for t, s, o in [("ok", 6, True), (None, 10, False), (None, 8, False)]]
    >>> [(t.status, t.actions, t.mean_score, t.oracle_right) for t in by_tool_outcome(rows, "sc")]
    [('ok', 1, 6.0, 1.0), ('no code', 2, 9.0, 0.0)]
    """
    rows = list(rows)
    out = []
    for agent in agents:
        mine = [r for r in rows if r["agent"] == agent]
        if all(r.get("tool_status") is None for r in mine):
            continue
        for name in sorted({_outcome(r) for r in mine}, key=_status_order):
            group = [r for r in mine if _outcome(r) == name]
            scores = [float(r["score"]) for r in _usable(group)]
            verdicts = [bool(r["oracle"]) for r in group if r.get("oracle") is not None]
            out.append(
                ToolOutcome(
                    agent,
                    name,
                    len(group),
                    sum(scores) / len(scores) if scores else None,
                    sum(verdicts) / len(verdicts) if verdicts else None,
                )
            )
    return out


def _outcome(row: Row) -> str:
    return str(row.get("tool_status") or NO_CODE)


def _status_order(status: str) -> int:
    order = [*get_args(ToolStatus), NO_CODE]
    return order.index(status) if status in order else len(order)
