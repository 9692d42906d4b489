"""The Task record and parsing task rows (``{prompt, answer[, id, type]}``) into Tasks.

The task sources (``mappa.tasks.sources``) sit above this module and the generators it
dispatches to (``arithmetic``, ``hf``) import from it, so imports run one way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mappa.tasks.dsbench.spec import DSBenchTask
from mappa.tasks.math import reference_text

PROMPT_FIELDS = ("prompt", "problem", "question")
ANSWER_FIELDS = ("answer", "final_answer")
ID_FIELDS = ("id", "unique_id", "problem_id")
"""Column names accepted for each part of a task, first match wins: our files use
``prompt``/``answer``/``id``; common Hugging Face math sets use ``problem``/``unique_id``."""


@dataclass(frozen=True)
class Task:
    """One problem: its text and, when known, the reference answer."""

    task_id: str
    prompt: str
    answer: str | None
    task_type: str = "math"  # for per-task-type statistics and whitening scopes
    dsbench: DSBenchTask | None = None  # a modeling task: files to share, answers to score

    @staticmethod
    def from_dsbench(spec: DSBenchTask) -> Task:
        """A DSBench task: the agents see the description; the outcome is its submission."""
        return Task(spec.task_id, spec.description, None, spec.task_type, spec)


def _first(row: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    return next((row[n] for n in names if row.get(n) is not None), None)


def tasks_from_rows(rows: Iterable[Any], origin: str) -> list[Task]:
    """Tasks from ``{prompt, answer[, id, type]}`` mappings; a row's index is its default id."""
    tasks = []
    for i, row in enumerate(rows):
        prompt = _first(row, PROMPT_FIELDS) if isinstance(row, Mapping) else None
        if prompt is None:
            raise ValueError(f"{origin}: task {i} has no 'prompt' field (or {PROMPT_FIELDS[1:]})")
        answer, task_id = _first(row, ANSWER_FIELDS), _first(row, ID_FIELDS)
        tasks.append(
            Task(
                task_id=str(i if task_id is None else task_id),
                prompt=str(prompt),
                answer=None if answer is None else reference_text(answer),
                task_type=str(row.get("type") or row.get("task_type") or "math"),
            )
        )
    if not tasks:
        raise ValueError(f"{origin}: no tasks")
    return tasks
