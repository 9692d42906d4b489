"""The DSBench evaluation report: success, fair and successful-only metrics by task type,
and who broke each failed run. Per-agent behaviour (actions, tool calls, execution errors)
is reported beside it with the common keys of ``mappa.run.metrics``.

A failed run is blamed on the first agent (in pipeline order) that did not leave a file it
owed (``produces`` in its config); if every file is there, the final agent's submission was
at fault. This is the evidence-based blame the coach is asked to apply, computed exactly.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from statistics import mean
from typing import Any

from mappa.config import AgentConfig
from mappa.records import Episode


def culprit(episode: Episode, agents: Sequence[AgentConfig]) -> str | None:
    """The agent that broke a failed run (None for a successful one)."""
    if episode.correct:
        return None
    for agent in agents:
        if episode.missing_artifacts.get(agent.name):
            return agent.name
    return agents[-1].name


def dsbench_report(episodes: Sequence[Episode], agents: Sequence[AgentConfig]) -> dict[str, Any]:
    """Success and metrics by task type, and blame; per-agent behaviour (actions, execution
    errors) is in the same run's ``agent_metrics`` keys (``mappa.run.metrics``)."""
    out: dict[str, Any] = {"runs": len(episodes)}
    out["success_rate"] = mean(float(bool(e.correct)) for e in episodes) if episodes else None
    by_type: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        by_type[e.task_type].append(e)
    for task_type, eps in sorted(by_type.items()):
        out[f"{task_type}/runs"] = len(eps)
        out[f"{task_type}/success_rate"] = mean(float(bool(e.correct)) for e in eps)
        fair_keys = sorted({k for e in eps for k in e.metrics if k.startswith("fair_")})
        for key in fair_keys:
            out[f"{task_type}/{key}"] = mean(e.metrics[key] for e in eps if key in e.metrics)
        ok = [e for e in eps if e.correct]
        for key in sorted(
            {k for e in ok for k in e.metrics if not k.startswith("fair_") and k != "success"}
        ):
            out[f"{task_type}/successful/{key}"] = mean(
                e.metrics[key] for e in ok if key in e.metrics
            )
    blame = Counter(c for e in episodes if (c := culprit(e, agents)) is not None)
    out["failed_runs_broken_by"] = dict(blame)
    out["failures"] = [
        {
            "episode": e.episode_id,
            "task": e.task_id,
            "broken_by": culprit(e, agents),
            "missing": e.missing_artifacts,
            "reason": e.coach_reference,
        }
        for e in episodes
        if not e.correct
    ]
    return out
