"""The coach interface and the glue that scores every action of a batch of episodes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

from mappa.coach.context import CoachContext
from mappa.sandbox.execute import cut_middle
from mappa.workflow.records import Action, Episode, Score

ReferenceFor = Literal["none", "final", "all"]
"""Whose actions the coach judges with the reference in view (``CoachConfig.reference_scope``)."""


class CoachFatalError(RuntimeError):
    """The coach cannot work as configured (a malformed URL; HTTP 400/401/403/404: a wrong
    path, model or key), or has given nothing but fallbacks for too long. Retrying cannot
    help, so this is the one coach error that stops a run; the message says what to fix."""


class CoachFallbackError(CoachFatalError):
    """``coach.max_fallback_steps`` consecutive steps in which every score was a fallback."""


class FallbackGuard:
    """Stops a run whose coach has become useless instead of training on nothing for hours.

    Call ``observe(scores)`` once per step with that step's scores; on the ``k``-th
    consecutive step in which every score is flagged (a fallback: coach unreachable,
    unparseable, out of range) it raises ``CoachFallbackError``. A step with one real score
    resets the count; a step with no scores leaves it as it is. ``k = 0`` never raises.

    >>> from mappa.workflow.records import Score
    >>> guard = FallbackGuard(2)
    >>> guard.observe([Score(5.0, flagged=True, flag_reason="unavailable")])
    >>> guard.observe([Score(7.0)])  # a real score: the count starts again
    >>> guard.observe([Score(5.0, flagged=True, flag_reason="unavailable")])
    >>> guard.observe([Score(5.0, flagged=True, flag_reason="unavailable")])
    Traceback (most recent call last):
    ...
    mappa.coach.base.CoachFallbackError: coach: every score was a flagged fallback for 2 ...
    """

    def __init__(self, k: int) -> None:
        if k < 0:
            raise ValueError(f"FallbackGuard needs k >= 0, got {k}")
        self.k = k
        self.streak = 0

    def observe(self, scores: Sequence[Score]) -> None:
        if not scores:
            return
        if not all(s.flagged for s in scores):
            self.streak = 0
            return
        self.streak += 1
        if self.k and self.streak >= self.k:
            reasons = Counter(s.flag_reason or "flagged" for s in scores)
            example = scores[0].rationale.replace("\n", " ")[:300]
            raise CoachFallbackError(
                f"coach: every score was a flagged fallback for {self.streak} consecutive "
                f"steps (coach.max_fallback_steps={self.k}); last step: {len(scores)} scores, "
                f"reasons {dict(reasons)}, e.g. {example!r}. The coach is down or its replies "
                "are unusable: check the server and `mappa coach-check`, or raise "
                "coach.max_fallback_steps (0 never aborts)."
            )


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
    reference_for: ReferenceFor = "final",
    output_limit: int | None = None,
) -> CoachContext:
    """The coach's view of one action. The reference (the answer for MathChat; for DSBench
    the outcome as it stood right after this action) is shown for the final agent
    (``reference_for="final"``, the paper), for every agent (``"all"``), or never
    (``"none"``)."""
    is_final = action.agent == final_agent
    obs = action.tool_observation
    shown = reference_for == "all" or (reference_for == "final" and is_final)
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
        if shown
        else None,
        files=action.workspace_files,
    )


def score_episodes(
    backend: CoachBackend,
    episodes: Sequence[Episode],
    roles: Mapping[str, str],
    final_agent: str,
    observation_chars: int = 2000,
    reference_for: ReferenceFor = "final",
    output_limit: int | None = None,
) -> list[Score]:
    """Score every action of every episode in place (one batched backend call)."""
    pairs = [(ep, a) for ep in episodes for a in ep.actions]
    contexts = [
        build_context(ep, a, roles, final_agent, observation_chars, reference_for, output_limit)
        for ep, a in pairs
    ]
    scores = backend.score(contexts)
    for (_, action), score in zip(pairs, scores, strict=True):
        action.coach = score
    return scores
