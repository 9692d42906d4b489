"""Whole-run coach statistics for the report: how the scores are spread per agent and task
type, what the coach cost and how often it failed, and whether the final agent's score
tells right answers from wrong ones.

The per-step versions of these numbers are in ``metrics.jsonl`` (``mappa.coach.stats``);
here they are taken over every scored action of the run, which is what a person judging
the coach wants: a step holds too few episodes to trust one step's correlation.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import mean, pstdev
from typing import Any

from mappa.coach.stats import point_biserial
from mappa.report.rundata import ScoreRecord

GOOD_SCORE = 5.0
"""A final-agent score at or above this counts as "the coach says right" in the confusion
view (the scale's midpoint: the coach prompt's neutral score)."""

MIN_R = 0.3
"""Below this correlation of the final score with the outcome the coach barely separates
right from wrong: the report warns (point-biserial r; 0.3 is a weak effect)."""

MIN_GAP = 1.0
"""... or when the mean final score of right and of wrong answers lie less than this many
points (of 10) apart."""

ACCOUNTING_KEYS = (
    "coach/calls",
    "coach/cache_hits",
    "coach/retries",
    "coach/failures",
    "coach/flagged",
    "coach/prompt_tokens",
    "coach/completion_tokens",
    "coach/cost_usd",
)
"""Per-step counters of ``mappa.coach.stats.accounting`` that add up over a run."""


@dataclass
class Spread:
    """Scores of one group: count, mean, standard deviation, histogram over 0-10."""

    n: int
    mean: float
    std: float
    histogram: list[int]  # 11 bins: [0,1), [1,2), ..., [9,10), 10


def spread(values: Sequence[float]) -> Spread:
    """The group's numbers; bin ``k`` counts scores in [k, k+1), the last bin exactly 10.

    >>> spread([0.0, 2.5, 2.9, 10.0]).histogram
    [1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1]
    """
    hist = [0] * 11
    for v in values:
        hist[min(10, max(0, int(v)))] += 1
    return Spread(len(values), mean(values), pstdev(values), hist)


@dataclass
class Separation:
    """The final agent's score against the true outcome (unflagged, graded episodes)."""

    n_correct: int
    n_wrong: int
    r: float | None  # point-biserial correlation
    mean_correct: float | None
    mean_wrong: float | None
    confusion: dict[str, int]  # "<truth>/<coach says>": count, truth right|wrong, coach good|bad
    verdict_confusion: dict[str, int]  # the same with the coach's ANSWER_CORRECT verdict
    warning: str | None


@dataclass
class CoachSummary:
    """Everything the report's coach section shows for one run."""

    by_agent: dict[str, Spread]
    by_agent_type: dict[tuple[str, str], Spread]
    flagged_by_reason: dict[str, int]
    scored: int
    totals: dict[str, float]
    latency_p50_s: float | None
    latency_p95_s: float | None
    separation: Separation
    task_types: list[str] = field(default_factory=list)
    health: dict[str, AgentHealthSummary] = field(default_factory=dict)  # by agent, in order
    health_warnings: list[str] = field(default_factory=list)


HEALTH_STATS = ("spread", "tie_rate", "mode_share", "digit_mass")
"""The per-step ``coach_health/<agent>/...`` numbers the report shows, latest and mean."""


@dataclass
class AgentHealthSummary:
    """One agent's ``coach_health`` metrics over a run (``mappa.coach.stats.coach_health``):
    each of ``HEALTH_STATS`` at the latest step that has it and its mean over the steps,
    the steps whose scores carried signal of those scored, and the longest no-signal
    streak (``coach_health/<agent>/no_signal_streak``)."""

    latest: dict[str, float | None]
    mean: dict[str, float | None]
    signal_steps: int
    steps: int
    longest_streak: int


def coach_health_summary(
    metrics: Sequence[dict[str, Any]], agents: Sequence[str], warn_steps: int
) -> tuple[dict[str, AgentHealthSummary], list[str]]:
    """Per agent with ``coach_health`` metrics, its summary; and a warning for each agent
    whose no-signal streak reached ``warn_steps`` (``coach.warn_no_signal_steps``, 0: none).

    >>> rows = [{"coach_health/v/signal": s, "coach_health/v/spread": x,
    ...          "coach_health/v/no_signal_streak": k} for s, x, k in [(1, 4.0, 0), (0, 0.0, 1)]]
    >>> health, warnings = coach_health_summary(rows, ["v"], 1)
    >>> health["v"].signal_steps, health["v"].steps, health["v"].mean["spread"], len(warnings)
    (1, 2, 2.0, 1)
    """
    out: dict[str, AgentHealthSummary] = {}
    warnings = []
    for agent in agents:
        p = f"coach_health/{agent}"
        rows = [row for row in metrics if row.get(f"{p}/signal") is not None]
        if not rows:
            continue
        latest: dict[str, float | None] = {}
        means: dict[str, float | None] = {}
        for stat in HEALTH_STATS:
            values = [row[f"{p}/{stat}"] for row in rows if row.get(f"{p}/{stat}") is not None]
            latest[stat] = float(values[-1]) if values else None
            means[stat] = mean(values) if values else None
        longest = max(int(row.get(f"{p}/no_signal_streak") or 0) for row in rows)
        summary = AgentHealthSummary(
            latest, means, sum(bool(row[f"{p}/signal"]) for row in rows), len(rows), longest
        )
        out[agent] = summary
        if warn_steps and longest >= warn_steps:
            warnings.append(
                f"{agent}: its coach scores carried no usable signal for {longest} consecutive "
                f"steps (coach.warn_no_signal_steps = {warn_steps}; signal in "
                f"{summary.signal_steps} of {summary.steps} steps, mean spread "
                f"{_num(means['spread'])} points, mode share {_num(means['mode_share'])}): it "
                "learned next to nothing from the coach then. Check the coach (`mappa "
                "coach-check`), try a stronger coach, expected scores, or "
                "coach.reference_for: all"
            )
    return out, warnings


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _confusion(pairs: Sequence[tuple[bool, bool]]) -> dict[str, int]:
    counts = Counter(
        f"{'right' if truth else 'wrong'}/{'good' if says else 'bad'}" for truth, says in pairs
    )
    return {k: counts.get(k, 0) for k in ("right/good", "right/bad", "wrong/good", "wrong/bad")}


def separation(scores: Sequence[ScoreRecord]) -> Separation:
    """Does the final agent's score separate right from wrong answers? Warns when not, or
    when the run cannot tell (every graded answer right, or every one wrong).

    >>> from mappa.report.rundata import ScoreRecord as S
    >>> recs = [S(0, "v", "t", x, False, "", False, True, ok, None)
    ...         for x, ok in [(9, True), (8, True), (7, False), (6, False)]]
    >>> sep = separation(recs)
    >>> round(sep.r, 2), sep.confusion["wrong/good"], sep.warning is None
    (0.89, 2, True)
    """
    final = [s for s in scores if s.final and not s.flagged and s.correct is not None]
    right = [s.value for s in final if s.correct]
    wrong = [s.value for s in final if not s.correct]
    r = point_biserial([s.value for s in final], [bool(s.correct) for s in final])
    mean_right = mean(right) if right else None
    mean_wrong = mean(wrong) if wrong else None
    warning = None
    if not final:
        warning = "no graded episode with an unflagged final-agent score: nothing to compare"
    elif not right or not wrong:
        kind = "right" if right else "wrong"
        warning = (
            f"every graded answer was {kind}: the run cannot show whether the coach separates "
            "right from wrong"
        )
    elif r is None or r < MIN_R or (mean_right or 0.0) - (mean_wrong or 0.0) < MIN_GAP:
        warning = (
            f"the coach barely separates right from wrong answers (r = "
            f"{'n/a' if r is None else f'{r:.2f}'}, mean score {mean_right:.2f} right vs "
            f"{mean_wrong:.2f} wrong): its scores may reward the wrong behaviour"
        )
    verdicts = [
        (bool(s.correct), bool(s.answer_correct)) for s in final if s.answer_correct is not None
    ]
    return Separation(
        len(right),
        len(wrong),
        r,
        mean_right,
        mean_wrong,
        _confusion([(bool(s.correct), s.value >= GOOD_SCORE) for s in final]),
        _confusion(verdicts) if verdicts else {},
        warning,
    )


def coach_summary(
    scores: Sequence[ScoreRecord],
    metrics: Sequence[dict[str, Any]],
    agents: Sequence[str] = (),
    warn_no_signal_steps: int = 0,
) -> CoachSummary:
    """The run's coach statistics from its score records and its step metrics (the coach
    health of ``agents``, warning at ``warn_no_signal_steps``)."""
    usable = [s for s in scores if not s.flagged]
    by_agent: dict[str, list[float]] = defaultdict(list)
    by_agent_type: dict[tuple[str, str], list[float]] = defaultdict(list)
    for s in usable:
        by_agent[s.agent].append(s.value)
        by_agent_type[(s.agent, s.task_type)].append(s.value)
    totals = {
        key.removeprefix("coach/"): float(sum(row.get(key) or 0 for row in metrics))
        for key in ACCOUNTING_KEYS
    }
    p50 = [row["coach/latency_p50_s"] for row in metrics if row.get("coach/latency_p50_s")]
    p95 = [row["coach/latency_p95_s"] for row in metrics if row.get("coach/latency_p95_s")]
    health, health_warnings = coach_health_summary(metrics, agents, warn_no_signal_steps)
    return CoachSummary(
        by_agent={a: spread(v) for a, v in by_agent.items()},
        by_agent_type={k: spread(v) for k, v in sorted(by_agent_type.items())},
        flagged_by_reason=dict(Counter(s.flag_reason or "flagged" for s in scores if s.flagged)),
        scored=len(scores),
        totals=totals,
        latency_p50_s=mean(p50) if p50 else None,
        latency_p95_s=max(p95) if p95 else None,
        separation=separation(scores),
        task_types=sorted({s.task_type for s in scores}),
        health=health,
        health_warnings=health_warnings,
    )
