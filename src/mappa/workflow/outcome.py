"""An episode's outcome, judged deterministically (never by the coach).

MathChat: the final agent's answer (its last ``\\boxed{}``, or its ``Answer:`` line, as
``tasks.answer_format`` says) against the reference answer. DSBench: the
``submission.csv`` the team left in its workspace, scored against held-out answers by id.
The outcome feeds accuracy/success metrics, the outcome-only baseline, and (for the final
agent only) the coach's reference section. Training and evaluation both grade here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mappa.config import AnswerFormat
from mappa.tasks import Task


@dataclass
class Outcome:
    correct: bool | None
    final_answer: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    reference: str | None = None  # shown to the coach when it judges the final agent
    grader_timed_out: bool = False  # no verdict in time: ``correct`` is False, unchecked


def judge(
    task: Task,
    final_text: str,
    workspace: Path,
    answer_format: AnswerFormat = "boxed",
    timeout_s: float = 5.0,
) -> Outcome:
    """The outcome of one episode of ``task``."""
    if task.dsbench is not None:
        from mappa.tasks.dsbench.metrics import score_submission

        score = score_submission(workspace / "submission.csv", task.dsbench)
        metrics = {
            **score.metrics,
            **{f"fair_{k}": v for k, v in score.fair().items()},
            "success": float(score.success),
        }
        return Outcome(score.success, None, metrics, f"{task.dsbench.task_type}: {score.summary()}")
    if task.answer is None:
        return Outcome(None)
    from mappa.tasks.math import grade_answer

    extracted, correct = grade_answer(final_text, task.answer, answer_format, timeout_s)
    return Outcome(correct is True, extracted, {}, task.answer, grader_timed_out=correct is None)
