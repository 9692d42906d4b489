"""A step's metrics, and one vocabulary for the numbers training, evaluation and the
DSBench report log.

``rollout_metrics`` is the one place a training step's rollout metrics are assembled: the
outcome accuracy, the per-agent keys below, and the coach's statistics (``coach_cost/``,
``bias/``, ``coach_health/``: ``mappa.coach.stats``); the update, timings and held-out
evaluation add theirs in the loop. ``step_line`` is the line the loop prints per step.

Every per-agent key is ``<name>/<agent>`` and means the same wherever it appears
(``metrics.jsonl`` step lines, their ``eval/`` copies, ``eval.json``); rates are fractions
in [0, 1]. docs/outputs.md's metrics table lists them.

============================  ==============================================================
key                           meaning
============================  ==============================================================
``actions/<a>``               actions agent ``a`` took (count)
``coach/<a>``                 mean coach score 0-10 of its actions (flagged fallbacks left
                              out; only for scored episodes)
``response_tokens/<a>``       mean completion tokens per action
``truncation_rate/<a>``       share of its actions cut at ``rollout.max_new_tokens``
``format_rate/<a>``           share of episodes whose last message of ``a`` holds an answer
                              in ``tasks.answer_format``
``tool_call_rate/<a>``        share of episodes in which ``a`` ran code (code agents only)
``exec_error_rate/<a>``       share of its code runs that did not end ``ok`` (code agents)
============================  ==============================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean
from typing import Any

from mappa.coach.stats import NoSignalWatch, accounting, bias, coach_health, health_metrics
from mappa.config import AgentConfig, AnswerFormat, RunConfig
from mappa.records import Episode, Score
from mappa.tasks.math import extract_answer


def rate(values: Sequence[float]) -> float | None:
    """Mean of 0/1 (or any) values; None when there are none.

    >>> rate([True, False, True, True]), rate([])
    (0.75, None)
    """
    return mean(map(float, values)) if values else None


def agent_metrics(
    episodes: Sequence[Episode], agents: Sequence[AgentConfig], answer_format: AnswerFormat
) -> dict[str, float | int | None]:
    """The per-agent keys of the table above, for one batch of episodes."""
    out: dict[str, float | int | None] = {}
    for agent in agents:
        per_episode = [e.agent_actions(agent.name) for e in episodes]
        acts = [a for actions in per_episode for a in actions]
        out[f"actions/{agent.name}"] = len(acts)
        if any(a.coach is not None for a in acts):
            scores = [a.coach.value for a in acts if a.coach is not None and not a.coach.flagged]
            out[f"coach/{agent.name}"] = rate(scores)
        out[f"response_tokens/{agent.name}"] = rate([len(a.completion_ids) for a in acts])
        out[f"truncation_rate/{agent.name}"] = rate([a.truncated for a in acts])
        out[f"format_rate/{agent.name}"] = rate(
            [
                extract_answer(actions[-1].completion_text, answer_format) is not None
                for actions in per_episode
                if actions
            ]
        )
        if agent.run_code:
            out[f"tool_call_rate/{agent.name}"] = rate(
                [any(a.tool_status is not None for a in actions) for actions in per_episode]
            )
            out[f"exec_error_rate/{agent.name}"] = rate(
                [a.tool_status != "ok" for a in acts if a.tool_status is not None]
            )
    return out


def accuracy(correct: Sequence[Sequence[bool]], k: int) -> dict[str, float | int | None]:
    """avg@k and pass@k over problems, each with its k graded samples.

    >>> accuracy([[True, False], [False, False]], 2)
    {'graded': 2, 'accuracy': 0.25, 'avg@2': 0.25, 'pass@2': 0.5}
    """
    avg = rate([rate(c) or 0.0 for c in correct])
    return {
        "graded": len(correct),
        "accuracy": avg,
        f"avg@{k}": avg,
        f"pass@{k}": rate([any(c) for c in correct]),
    }


def rollout_metrics(
    step: int,
    episodes: Sequence[Episode],
    scores: Sequence[Score],
    cfg: RunConfig,
    watch: NoSignalWatch,
) -> dict[str, Any]:
    """The metrics of one scored rollout: accuracy, the per-agent keys, the coach's cost,
    bias and health (``watch`` warns on a long run of steps without signal), and with a
    workflow function the episodes whose workflow raised (``failed_episodes``)."""
    names = [a.name for a in cfg.agents]
    graded = [e.correct for e in episodes if e.correct is not None]
    out: dict[str, Any] = {"step": step, "episodes": len(episodes)}
    out["accuracy"] = mean(graded) if graded else None
    out.update(agent_metrics(episodes, cfg.agents, cfg.tasks.answer_format))
    if cfg.workflow.function is not None:  # episodes whose workflow raised (Episode.error)
        out["failed_episodes"] = sum(e.error is not None for e in episodes)
    prices = cfg.coach.price_per_mtok
    out.update(accounting(scores, prices.prompt, prices.completion))
    out.update(bias(episodes, names[-1]))
    health = coach_health(episodes, names, cfg.rl.min_reward_spread, cfg.rl.w_process)
    out.update(health_metrics(health))
    out.update(watch.observe(health))
    return out


def _fmt(x: Any) -> str:
    return "-" if x is None else (f"{x:.3g}" if isinstance(x, float) else str(x))


def _health_txt(metrics: dict[str, Any]) -> str:
    """`` signal=2/3 mass=0.91``: agents whose scores carried signal this step, and the
    coach's mean probability on a score where known (nothing for a run without a coach)."""
    if metrics.get("coach_health/agents") is None:
        return ""
    mass = metrics.get("coach_health/digit_mass")
    return f" signal={metrics['coach_health/signal_agents']}/{metrics['coach_health/agents']}" + (
        "" if mass is None else f" mass={mass:.2f}"
    )


def step_line(step: int, metrics: dict[str, Any], agents: Sequence[str]) -> str:
    """The loop's line for one finished step: mean coach score per agent, accuracy, KL,
    rollout speed, flagged scores and the coach's health."""
    coach_txt = " ".join(f"{n}={_fmt(metrics.get(f'coach/{n}'))}" for n in agents)
    return (
        f"step {step}: coach[{coach_txt}] acc={_fmt(metrics['accuracy'])} "
        f"kl={_fmt(metrics['mean_kl'])} tok/s={metrics['rollout_tokens_per_s']:.1f} "
        f"flagged={metrics['coach/flagged']}{_health_txt(metrics)}"
    )
