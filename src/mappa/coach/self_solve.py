"""A coach that works each problem once, and judges actions against its own answer.

Without a reference, a small coach judges an upstream agent's reasoning poorly: it cannot
tell a right number from a wrong one it did not compute. Solving the task itself is cheap
when it is done once per task (the cost is shared by every action of every sample of that
task), and then an action is checked against a number, as it is with a reference. The
coach's answer is no label: it is shown as the coach's own work, and it can be wrong.

``SelfSolvingCoach`` wraps any coach backend: it fills ``CoachContext.worked_answer`` where
the view shows no reference, and with ``agreement_weight`` blends a deterministic check of
the action's result (the answer oracle's reading) against that answer into the score.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Protocol

from mappa.coach.base import CoachBackend
from mappa.coach.context import CoachContext
from mappa.coach.rules import context_result
from mappa.records import Score
from mappa.tasks.math import answers_equal
from mappa.workflow.oracle import stated_result

SOLVE_SYSTEM = (
    "Solve the math problem. Be brief: write one short line per step, then the final "
    "answer as \\boxed{number}."
)
"""The coach's instruction when it solves a task: brief, so its answer fits the budget."""

RIGHT, WRONG = 10.0, 0.0


class Writer(Protocol):
    """Writes the assistant's reply to each conversation (greedy, ``max_tokens`` at most)."""

    def write(
        self, conversations: Sequence[list[dict[str, str]]], max_tokens: int
    ) -> list[str]: ...


class WorkedAnswers:
    """The coach's own answer per task text, written once and remembered for the run."""

    def __init__(self, writer: Writer, max_tokens: int) -> None:
        self.writer = writer
        self.max_tokens = max_tokens
        self.solutions: dict[str, str] = {}
        """Each task's written solution (kept for inspection)."""

    def solve(self, tasks: Iterable[str]) -> None:
        """Write the solutions of the ``tasks`` not yet solved, in one call to the writer (a
        batching writer solves them together)."""
        todo = [t for t in dict.fromkeys(tasks) if t not in self.solutions]
        if not todo:
            return
        conversations = [
            [{"role": "system", "content": SOLVE_SYSTEM}, {"role": "user", "content": task}]
            for task in todo
        ]
        texts = self.writer.write(conversations, self.max_tokens)
        self.solutions.update(zip(todo, texts, strict=True))

    def answer(self, task: str) -> str | None:
        """The result the coach's solution of ``task`` states (its boxed answer, else its
        ``Answer:`` line, else its last number: a brief solution often ends on ``= 26``
        without a box); None when it states none."""
        self.solve([task])
        return stated_result(self.solutions[task])


def agrees(ctx: CoachContext, answer: str) -> bool:
    """Whether the action's result (``mappa.workflow.oracle.action_result``: a program's
    printed number, nothing for a failed one; the final agent's graded answer; else the
    result its reply states) equals ``answer``; an action with no result does not."""
    result, _ = context_result(ctx)
    return result is not None and answers_equal(result, answer)


def blend(score: Score, agree: bool, weight: float) -> Score:
    """``score`` moved toward 10 (``agree``) or 0 by ``weight``; a flagged fallback is left
    as it is (it is no judgement to move).

    >>> blend(Score(6.0), True, 0.5).value, blend(Score(6.0), False, 0.5).value
    (8.0, 3.0)
    """
    if score.flagged or weight == 0.0:
        return score
    check = RIGHT if agree else WRONG
    word = "equals" if agree else "does not equal"
    return dataclasses.replace(
        score,
        value=(1.0 - weight) * score.value + weight * check,
        rationale=f"{score.rationale}; its result {word} the coach's worked answer",
    )


class SelfSolvingCoach:
    """``inner`` shown the coach's own worked answer wherever it is shown no reference."""

    def __init__(
        self, inner: CoachBackend, answers: WorkedAnswers, agreement_weight: float = 0.0
    ) -> None:
        self.inner = inner
        self.answers = answers
        self.agreement_weight = agreement_weight
        self.name = inner.name

    def worked(self, ctx: CoachContext) -> CoachContext:
        """``ctx`` with the coach's answer to its task, where it shows no reference."""
        if ctx.ground_truth is not None:
            return ctx
        return dataclasses.replace(ctx, worked_answer=self.answers.answer(ctx.task))

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        self.answers.solve(c.task for c in contexts if c.ground_truth is None)
        shown = [self.worked(c) for c in contexts]
        scores = self.inner.score(shown)
        return [
            blend(s, agrees(c, c.worked_answer), self.agreement_weight)
            if c.worked_answer is not None
            else s
            for s, c in zip(scores, shown, strict=True)
        ]
