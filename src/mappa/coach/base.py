"""The coach interface and the glue that scores every action of a batch of episodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from mappa.coach.context import CoachContext
from mappa.sandbox.execute import cut_middle
from mappa.workflow.records import Action, Episode, Score


class CoachBackend(Protocol):
    """Scores contexts; one ``Score`` per context, in order. Never raises for a bad reply:
    failures come back as ``Score(5.0, flagged=True)``."""

    name: str

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]: ...


def build_context(
    episode: Episode,
    action: Action,
    roles: Mapping[str, str],
    final_agent: str,
    observation_chars: int = 2000,
    show_ground_truth: bool = True,
    output_limit: int | None = None,
) -> CoachContext:
    """The coach's view of one action; the reference only for the final agent: the answer
    (MathChat), or the outcome as it stood right after this action (DSBench)."""
    is_final = action.agent == final_agent
    obs = action.tool_observation
    return CoachContext(
        truncated=action.truncated,
        output_limit=output_limit,
        task_type=episode.task_type,
        task=episode.task,
        agent=action.agent,
        role=roles[action.agent],
        turn=action.turn,
        agent_input=action.prompt_text,
        output=action.completion_text,
        observation=None if obs is None else cut_middle(obs, observation_chars),
        is_final=is_final,
        ground_truth=(action.coach_reference or episode.coach_reference or episode.answer)
        if (is_final and show_ground_truth)
        else None,
        files=action.workspace_files,
    )


def score_episodes(
    backend: CoachBackend,
    episodes: Sequence[Episode],
    roles: Mapping[str, str],
    final_agent: str,
    observation_chars: int = 2000,
    show_ground_truth: bool = True,
    output_limit: int | None = None,
) -> list[Score]:
    """Score every action of every episode in place (one batched backend call)."""
    pairs = [(ep, a) for ep in episodes for a in ep.actions]
    contexts = [
        build_context(ep, a, roles, final_agent, observation_chars, show_ground_truth, output_limit)
        for ep, a in pairs
    ]
    scores = backend.score(contexts)
    for (_, action), score in zip(pairs, scores, strict=True):
        action.coach = score
    return scores
