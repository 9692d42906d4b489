"""One vocabulary for the numbers training, evaluation and the DSBench report log.

Every per-agent key is ``<name>/<agent>`` and means the same wherever it appears
(``metrics.jsonl`` step lines, their ``eval/`` copies, ``eval.json``); rates are fractions
in [0, 1]. The README's metrics table lists them.

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

from mappa.config import AgentConfig, AnswerFormat
from mappa.records import Episode
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
