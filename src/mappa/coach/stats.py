"""Coach accounting (cost, latency, failures) and bias statistics, as metrics dicts.

The paper's agents exploited a coach that rated regression tasks higher than
classification; these numbers make such a bias visible while a run is going.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from statistics import mean, pstdev

from mappa.workflow.records import Episode, Score


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
