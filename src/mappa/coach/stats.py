"""Coach accounting (cost, latency, failures), bias and health statistics, as metrics dicts.

The paper's agents exploited a coach that rated regression tasks higher than
classification; these numbers make such a bias visible while a run is going. The health
numbers (``coach_health``) say whether a step's scores can teach each agent anything, and
``NoSignalWatch`` warns when they have not for several steps in a row.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import mean, pstdev
from typing import Any

from mappa.records import Episode, Score

log = logging.getLogger(__name__)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 100]); None for no values.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([1.0, 2.0, 3.0, 4.0], 95)
    (2.0, 4.0)
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def accounting(
    scores: Sequence[Score], price_prompt: float = 0.0, price_completion: float = 0.0
) -> dict[str, float | int | None]:
    """Calls, cache hits, retries, failures, flagged, latency p50/p95, tokens, cost (USD).

    Prices are per million tokens. Cached scores cost nothing and are not calls.
    """
    live = [s for s in scores if not s.cached]
    latencies = [s.latency_s for s in live]
    prompt = sum(s.prompt_tokens for s in live)
    completion = sum(s.completion_tokens for s in live)
    return {
        "coach/calls": len(live),
        "coach/cache_hits": len(scores) - len(live),
        "coach/retries": sum(s.retries for s in live),
        "coach/failures": sum(s.flag_reason == "unavailable" for s in scores),
        "coach/flagged": sum(s.flagged for s in scores),
        "coach/latency_p50_s": percentile(latencies, 50),
        "coach/latency_p95_s": percentile(latencies, 95),
        "coach/prompt_tokens": prompt,
        "coach/completion_tokens": completion,
        "coach/cost_usd": (prompt * price_prompt + completion * price_completion) / 1e6,
    }


def point_biserial(scores: Sequence[float], outcomes: Sequence[bool]) -> float | None:
    """Pearson correlation of a score with a 0/1 outcome; None if either is constant.

    >>> round(point_biserial([9.0, 8.0, 2.0, 1.0], [True, True, False, False]), 4)
    0.9899
    """
    if len(scores) < 2 or len(set(outcomes)) < 2 or len(set(scores)) < 2:
        return None
    ys = [float(o) for o in outcomes]
    mx, my = mean(scores), mean(ys)
    cov = sum((x - mx) * (y - my) for x, y in zip(scores, ys, strict=True))
    return cov / math.sqrt(sum((x - mx) ** 2 for x in scores) * sum((y - my) ** 2 for y in ys))


def bias(episodes: Sequence[Episode], final_agent: str) -> dict[str, float | None]:
    """Score mean/std by agent, by task type and by both; final-agent score vs true outcome."""
    by: dict[str, list[float]] = defaultdict(list)
    final_scores, outcomes = [], []
    for ep in episodes:
        for a in ep.actions:
            if a.coach is None or a.coach.flagged:
                continue
            by[f"agent/{a.agent}"].append(a.coach.value)
            by[f"task_type/{ep.task_type}"].append(a.coach.value)
            by[f"agent/{a.agent}/task_type/{ep.task_type}"].append(a.coach.value)
        last = ep.agent_actions(final_agent)
        if ep.correct is not None and last and last[-1].coach and not last[-1].coach.flagged:
            final_scores.append(last[-1].coach.value)
            outcomes.append(ep.correct)
    out: dict[str, float | None] = {}
    for key, values in sorted(by.items()):
        out[f"coach_bias/{key}/mean"] = mean(values)
        out[f"coach_bias/{key}/std"] = pstdev(values)
    out["coach_bias/final_vs_outcome_r"] = point_biserial(final_scores, outcomes)
    return out


# ------------------------------------------------------------------------ coach health
TIE_EPS = 1e-9
"""Two scores closer than this are a tie."""


@dataclass(frozen=True)
class AgentHealth:
    """How much a step's coach scores of one agent can teach it (``agent_health``).

    ``n``: its unflagged scores; ``spread`` (max - min) and ``std`` in coach points (0-10);
    ``tie_rate``: share of pairs of its scores within ``TIE_EPS`` of each other;
    ``mode_share``: share of the most common score rounded to 0.1; ``digit_mass``: mean
    probability the coach put on any score where it read one (None where unknown);
    ``signal``: at least two unflagged scores whose spread, as rewards, reaches
    ``rl.min_reward_spread`` (``min_score_spread``). Statistics of no scores are None.
    """

    n: int
    spread: float | None
    std: float | None
    tie_rate: float | None
    mode_share: float | None
    digit_mass: float | None
    signal: bool


def min_score_spread(min_reward_spread: float, w_process: float) -> float:
    """The spread of coach scores, in points (0-10), that ``rl.min_reward_spread`` asks of
    the rewards: a score enters the reward as ``w_process * score / 10`` (docs/algorithm.md),
    so a weight of 0.5 needs twice the points and a weight of 2 half. Infinite at weight 0:
    scores then carry nothing into the reward.

    >>> min_score_spread(0.05, 1.0), min_score_spread(0.05, 0.5), min_score_spread(0.05, 2.0)
    (0.5, 1.0, 0.25)
    """
    if w_process == 0.0:
        return math.inf
    return 10.0 * min_reward_spread / abs(w_process)


def agent_health(
    scores: Sequence[Score], min_reward_spread: float, w_process: float
) -> AgentHealth:
    """One agent's health from its scores of one step. Flagged fallbacks are left out of
    the spread, ties, mode and signal (they are not the coach's judgement, and training
    leaves them out); their ``digit_mass`` counts where known, since a score flagged for a
    low mass is exactly what that number is there to show. ``min_reward_spread`` and
    ``w_process``: the run's ``rl`` keys of those names (``min_score_spread``).

    >>> mixed = [Score(7.0, digit_mass=0.9), Score(7.0), Score(4.0, digit_mass=0.5)]
    >>> h = agent_health(mixed, 0.05, 1.0)
    >>> h.n, h.spread, round(h.std, 3), round(h.tie_rate, 3), round(h.mode_share, 3), h.signal
    (3, 3.0, 1.414, 0.333, 0.667, True)
    >>> round(h.digit_mass, 3)
    0.7
    >>> agent_health([Score(6.0), Score(6.2)], 0.05, 1.0).signal
    False
    >>> h = agent_health([Score(5.0, flagged=True, flag_reason="unavailable")], 0.05, 1.0)
    >>> h.n, h.spread, h.tie_rate, h.mode_share, h.digit_mass, h.signal
    (0, None, None, None, None, False)
    """
    values = [s.value for s in scores if not s.flagged]
    masses = [s.digit_mass for s in scores if s.digit_mass is not None]
    n = len(values)
    digit_mass = mean(masses) if masses else None
    if not n:
        return AgentHealth(0, None, None, None, None, digit_mass, False)
    spread = max(values) - min(values)
    pairs = n * (n - 1) // 2
    ties = sum(abs(values[i] - values[j]) <= TIE_EPS for i in range(n) for j in range(i + 1, n))
    modes = Counter(round(v, 1) for v in values)
    min_spread = min_score_spread(min_reward_spread, w_process)
    signal = n >= 2 and spread > TIE_EPS and spread >= min_spread - 1e-9
    return AgentHealth(
        n=n,
        spread=spread,
        std=pstdev(values),
        tie_rate=ties / pairs if pairs else None,
        mode_share=max(modes.values()) / n,
        digit_mass=digit_mass,
        signal=signal,
    )


def coach_health(
    episodes: Sequence[Episode],
    agents: Sequence[str],
    min_reward_spread: float,
    w_process: float,
) -> dict[str, AgentHealth]:
    """``agent_health`` of every agent with a scored action in ``episodes`` (one step),
    in ``agents``' order. Per agent whatever ``rl.norm_scope`` pools: an agent whose own
    scores all tie learns nothing from them even when pooling gives it an advantage.
    ``min_reward_spread`` and ``w_process``: the run's ``rl`` keys of those names."""
    scores: dict[str, list[Score]] = defaultdict(list)
    for ep in episodes:
        for a in ep.actions:
            if a.coach is not None:
                scores[a.agent].append(a.coach)
    return {
        name: agent_health(scores[name], min_reward_spread, w_process)
        for name in agents
        if name in scores
    }


def health_metrics(health: Mapping[str, AgentHealth]) -> dict[str, float | int | None]:
    """The step's ``coach_health/...`` keys: per agent ``spread``, ``std``, ``tie_rate``,
    ``mode_share``, ``digit_mass``, ``signal`` (1/0); over the agents ``signal_agents``
    (agents with signal), ``agents`` (agents scored) and ``digit_mass`` (their mean).

    >>> m = health_metrics({"v": agent_health([Score(3.0), Score(8.0)], 0.05, 1.0)})
    >>> m["coach_health/v/spread"], m["coach_health/v/signal"], m["coach_health/signal_agents"]
    (5.0, 1, 1)
    """
    out: dict[str, float | int | None] = {}
    for name, h in health.items():
        p = f"coach_health/{name}"
        out.update(
            {
                f"{p}/spread": h.spread,
                f"{p}/std": h.std,
                f"{p}/tie_rate": h.tie_rate,
                f"{p}/mode_share": h.mode_share,
                f"{p}/digit_mass": h.digit_mass,
                f"{p}/signal": int(h.signal),
            }
        )
    if health:
        masses = [h.digit_mass for h in health.values() if h.digit_mass is not None]
        out["coach_health/signal_agents"] = sum(h.signal for h in health.values())
        out["coach_health/agents"] = len(health)
        out["coach_health/digit_mass"] = mean(masses) if masses else None
    return out


class NoSignalWatch:
    """Warns when an agent's coach scores have carried no usable signal for ``k``
    consecutive steps (``coach.warn_no_signal_steps``; 0 never warns).

    ``min_reward_spread`` and ``w_process`` are the run's ``rl`` keys (the warning says
    what spread of scores they ask for). ``observe`` takes a step's ``coach_health`` and
    returns the step's
    ``coach_health/<agent>/no_signal_streak`` keys, logging a warning when a streak
    reaches ``k`` and again every ``k`` steps it goes on. An agent not scored this step
    keeps its streak. ``replay`` rebuilds the streaks from the ``metrics.jsonl`` lines of
    a resumed run, so a resume neither forgets nor repeats a warning.

    >>> watch = NoSignalWatch(2, 0.05, w_process=1.0)
    >>> flat = {"verifier": agent_health([Score(7.0), Score(7.0)], 0.05, 1.0)}
    >>> watch.observe(flat)
    {'coach_health/verifier/no_signal_streak': 1}
    >>> watch.observe(flat)["coach_health/verifier/no_signal_streak"], watch.warnings[0][:40]
    (2, "coach: agent 'verifier' has had no usabl")
    """

    def __init__(self, k: int, min_reward_spread: float, *, w_process: float) -> None:
        if k < 0:
            raise ValueError(f"NoSignalWatch needs k >= 0, got {k}")
        self.k, self.min_reward_spread, self.w_process = k, min_reward_spread, w_process
        self.streaks: dict[str, int] = {}
        self.recent: dict[str, deque[tuple[float | None, float | None]]] = {}
        self.warnings: list[str] = []  # every warning given, in order

    def _note(self, name: str, signal: bool, spread: float | None, mode: float | None) -> int:
        self.streaks[name] = 0 if signal else self.streaks.get(name, 0) + 1
        recent = self.recent.setdefault(name, deque(maxlen=max(self.k, 1)))
        recent.append((spread, mode))
        return self.streaks[name]

    def observe(self, health: Mapping[str, AgentHealth]) -> dict[str, int]:
        out = {}
        for name, h in health.items():
            streak = self._note(name, h.signal, h.spread, h.mode_share)
            out[f"coach_health/{name}/no_signal_streak"] = streak
            if self.k and streak and streak % self.k == 0:
                message = self.message(name)
                self.warnings.append(message)
                log.warning(message)
        return out

    def message(self, name: str) -> str:
        """What the warning for ``name`` says: its streak, its recent spread and mode share
        (oldest first), and what to do."""
        recent = self.recent.get(name, ())
        spreads = ", ".join("-" if s is None else f"{s:.2g}" for s, _ in recent)
        modes = ", ".join("-" if m is None else f"{m:.2f}" for _, m in recent)
        return (
            f"coach: agent {name!r} has had no usable signal for {self.streaks[name]} "
            f"consecutive steps (coach.warn_no_signal_steps={self.k}): its score spread over "
            f"the last steps was [{spreads}] points (signal needs two unflagged scores >= "
            f"{min_score_spread(self.min_reward_spread, self.w_process):.2g} points apart: "
            f"rl.min_reward_spread={self.min_reward_spread:g} in reward units at "
            f"rl.w_process={self.w_process:g})"
            f" and the most common score took [{modes}] of its actions, so its updates learn "
            "next to nothing from the coach. Check the coach with `mappa coach-check`; try a "
            "stronger coach, expected scores (coach.http.score_mode: expected, or the local "
            "coach), or coach.reference_for: all so it judges every agent against the answer."
        )

    def replay(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Rebuild the streaks from earlier steps' metrics lines (no warning is logged)."""
        for row in rows:
            for key, value in row.items():
                if not (key.startswith("coach_health/") and key.endswith("/signal")):
                    continue
                name = key[len("coach_health/") : -len("/signal")]
                if not name or value is None:
                    continue
                self._note(
                    name,
                    bool(value),
                    row.get(f"coach_health/{name}/spread"),
                    row.get(f"coach_health/{name}/mode_share"),
                )
