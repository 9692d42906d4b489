"""The coach interface and the glue that scores every action of a batch of episodes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from mappa.coach.context import CoachContext
from mappa.config import AnswerFormat, RunConfig
from mappa.records import Action, Episode, Score
from mappa.tasks.math import answers_equal, extract_answer
from mappa.text import cut_middle
from mappa.workflow.oracle import recorded_result

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

    >>> from mappa.records import Score
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


@dataclass(frozen=True)
class CoachView:
    """How the coach is shown an action, the same in training and in ``mappa coach-check``:
    the tool output cut to ``observation_chars``, the reference for ``reference_for``'s
    agents, the agents' ``output_limit`` (so a cut-off reply reads as one), with
    ``answer_check`` the grader's verdict on the final answer beside the reference, and the
    ``answer_format`` the grader reads the final answer in."""

    observation_chars: int = 2000
    reference_for: ReferenceFor = "final"
    output_limit: int | None = None
    answer_check: bool = False
    answer_format: AnswerFormat = "boxed"
    hindsight: bool = False
    """Show what the episode's code runs showed about the action (``hindsight``)."""

    @classmethod
    def of(cls, cfg: RunConfig) -> CoachView:
        return cls(
            observation_chars=cfg.coach.observation_chars,
            reference_for=cfg.coach.reference_scope,
            output_limit=cfg.rollout.max_new_tokens,
            answer_check=cfg.coach.answer_check,
            answer_format=cfg.tasks.answer_format,
            hindsight=cfg.coach.hindsight,
        )


def _result(action: Action, is_final: bool, answer_format: AnswerFormat) -> str | None:
    return recorded_result(action, is_final=is_final, answer_format=answer_format)[0]


def hindsight(
    episode: Episode, action: Action, final_agent: str, answer_format: AnswerFormat = "boxed"
) -> str | None:
    """What the episode's code runs showed about ``action``, in words, with no label: for an
    action that ran no code and is not the final agent's (a proposed solution), what the
    next program run after it printed, and whether the action's stated result is that
    number; for the final agent's action, whether its answer is what the last program run
    before it printed. None where no program ran on the relevant side, or for a code action
    (its own output is in view already). Results are read as the answer oracle reads them.
    """
    if action.tool_observation is not None or action.tool_status is not None:
        return None
    is_final = action.agent == final_agent
    at = next(i for i, a in enumerate(episode.actions) if a is action)
    side = reversed(episode.actions[:at]) if is_final else iter(episode.actions[at + 1 :])
    run = next((a for a in side if a.tool_status is not None or a.tool_observation), None)
    if run is None:
        return None
    mine = _result(action, is_final, answer_format)
    printed = _result(run, False, answer_format)
    when = "before" if is_final else "after"
    what = "answer" if is_final else "stated result"
    head = f"The {run.agent.replace('_', ' ')}'s program, run {when} this action"
    if printed is None:
        return f"{head}, gave no result ({run.tool_status or 'nothing printed'})."
    if mine is None:
        return f"{head}, printed {printed}; this action states no result."
    same = answers_equal(mine, printed)
    verdict = "equals" if same else "does NOT equal"
    return f"{head}, printed {printed}; this action's {what} {mine} {verdict} it."


def answer_verdict(
    final_answer: str | None, correct: bool, reference: str, timed_out: bool = False
) -> str:
    """The grader's verdict on an episode's final answer, in words for the coach. A
    comparison that gave no verdict in time is said to be unchecked, not wrong: the coach
    must not learn that an answer the grader could not compare is a wrong one.

    >>> answer_verdict("13", False, "11")
    'The final answer in this reply is 13: it does NOT equal the reference answer 11.'
    >>> answer_verdict(None, False, "11")
    'This reply gives no final answer in the required format.'
    >>> unchecked = answer_verdict("10^{10^{10}}", False, "11", timed_out=True)
    >>> "could not check it" in unchecked, "does NOT equal" in unchecked
    (True, False)
    """
    if final_answer is None:
        return "This reply gives no final answer in the required format."
    if timed_out:
        return (
            f"The final answer in this reply is {final_answer}: the grader could not check it "
            f"against the reference answer {reference} (the comparison timed out); compare "
            "them yourself."
        )
    if correct:
        return f"The final answer in this reply is {final_answer}: it equals the reference answer."
    return (
        f"The final answer in this reply is {final_answer}: it does NOT equal the reference "
        f"answer {reference}."
    )


def build_context(
    episode: Episode,
    action: Action,
    roles: Mapping[str, str],
    final_agent: str,
    view: CoachView = CoachView(),
) -> CoachContext:
    """The coach's view of one action. The reference (the answer for MathChat; for DSBench
    the outcome as it stood right after this action) is shown for the final agent
    (``reference_for="final"``, the paper), for every agent (``"all"``), or never
    (``"none"``). On a modeling task only the final agent's actions have an outcome as of
    the action (the submission is its), so ``"all"`` shows upstream agents nothing: the
    episode's final outcome came after their action and after every later agent's, so it is
    not evidence of what they did. The answer check goes with the final agent's last action, the one
    the grader graded, on answer tasks (a modeling task's reference is its graded outcome
    already); where the verdict is not shown, the final agent's answer as the grader reads
    it goes beside the reference (a fact, not the verdict). The action's tool status and
    stdout travel with it to every coach."""
    is_final = action.agent == final_agent
    obs = action.tool_observation
    shown = view.reference_for == "all" or (view.reference_for == "final" and is_final)
    if not shown:
        reference = None
    elif episode.metrics:  # a modeling task: the outcome as of this action, if it has one
        reference = action.coach_reference
    else:
        reference = episode.coach_reference or episode.answer
    graded = (
        view.answer_check
        and reference is not None
        and is_final
        and episode.correct is not None
        and not episode.metrics
        and action is episode.agent_actions(final_agent)[-1]
    )
    read = None
    if reference is not None and is_final and not graded and not episode.metrics:
        answer = extract_answer(action.completion_text, view.answer_format)
        read = answer if answer is not None else f"none (no {view.answer_format} answer)"
    return CoachContext(
        truncated=action.truncated,
        output_limit=view.output_limit,
        task_type=episode.task_type,
        task=episode.task,
        agent=action.agent,
        role=roles[action.agent],
        turn=action.turn,
        agent_input=action.prompt_text,
        output=action.completion_text,
        observation=None if obs is None else cut_middle(obs, view.observation_chars),
        is_final=is_final,
        ground_truth=reference,
        files=action.workspace_files,
        answer_check=answer_verdict(
            episode.final_answer, bool(episode.correct), str(reference), episode.grader_timed_out
        )
        if graded
        else None,
        tool_status=action.tool_status,
        stdout=action.tool_stdout,
        answer_format=view.answer_format,
        final_answer=read,
        hindsight=hindsight(episode, action, final_agent, view.answer_format)
        if view.hindsight and not episode.metrics
        else None,
    )


def episode_contexts(
    episodes: Sequence[Episode],
    roles: Mapping[str, str],
    final_agent: str,
    view: CoachView = CoachView(),
) -> list[CoachContext]:
    """The coach's view of every action of ``episodes``, in order."""
    return [build_context(ep, a, roles, final_agent, view) for ep in episodes for a in ep.actions]


def score_episodes(
    backend: CoachBackend,
    episodes: Sequence[Episode],
    roles: Mapping[str, str],
    final_agent: str,
    view: CoachView = CoachView(),
) -> list[Score]:
    """Score every action of every episode in place (one batched backend call)."""
    scores = backend.score(episode_contexts(episodes, roles, final_agent, view))
    actions = [a for ep in episodes for a in ep.actions]
    for action, score in zip(actions, scores, strict=True):
        action.coach = score
    return scores
