"""The Task record and parsing task rows (``{prompt, answer[, id, type]}``) into Tasks.

The task sources (``mappa.tasks.sources``) sit above this module and the generators it
dispatches to (``arithmetic``, ``hf``) import from it, so imports run one way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mappa.tasks.dsbench.spec import DSBenchTask
from mappa.tasks.math import reference_text

if TYPE_CHECKING:
    from mappa.config.schema import EvalConfig, TaskConfig

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


TASK_FILE = (
    'a task file is a JSON list of {"prompt": ..., "answer": ...} objects, or one such '
    "object per line (JSONL)"
)
"""What a task file holds, for the messages that refuse one."""

SOURCES = (
    "a JSON/JSONL task file, a dataset folder written by save_to_disk (one split), "
    "hf:<repo>[:<config>]:<split>, arithmetic, dsbench-synthetic, dsbench-sklearn or "
    "dsbench:<task list>"
)
"""What ``tasks.source`` can be, for the messages that refuse one."""


class TaskSourceError(ValueError):
    """A task source that cannot be used; the message names the file (and line, if known)."""


def _first(row: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    return next((row[n] for n in names if row.get(n) is not None), None)


def refuse_duplicate_ids(tasks: Sequence[Task], origin: str, where: Sequence[str] = ()) -> None:
    """Raise ``TaskSourceError`` naming every task id that occurs more than once (and where:
    ``where[i]`` describes task ``i``, e.g. ``line 7``)."""
    counts = Counter(t.task_id for t in tasks)
    dups = [task_id for task_id, n in counts.items() if n > 1]
    if not dups:
        return
    shown = []
    for task_id in dups[:10]:
        places = [where[i] for i, t in enumerate(tasks) if t.task_id == task_id and i < len(where)]
        shown.append(f"{task_id!r}" + (f" ({', '.join(places)})" if places else ""))
    more = f" and {len(dups) - 10} more" if len(dups) > 10 else ""
    raise TaskSourceError(
        f"{origin}: duplicate task ids {', '.join(shown)}{more}; every task needs its own id"
    )


@dataclass(frozen=True)
class Columns:
    """Which column of a task row is the prompt and which the answer (``tasks.prompt_field``,
    ``tasks.answer_field``; None: the first of ``PROMPT_FIELDS`` / ``ANSWER_FIELDS`` a row
    has), whether every row must have an answer (``tasks.require_answers``), and the marker
    after which an answer column's final answer stands (``tasks.answer_after``: GSM8K's
    ``####`` ends a worked solution). ``section`` is the config section whose keys name
    them (``tasks`` or ``eval``), for messages."""

    prompt: str | None = None
    answer: str | None = None
    require_answer: bool = True
    answer_after: str | None = None
    section: str = "tasks"

    @classmethod
    def of(cls, tasks: TaskConfig, held_out: EvalConfig | None = None) -> Columns:
        """The columns a run config's ``tasks`` section names, or, given its ``eval``
        section, the held-out set's (``eval.prompt_field`` and the rest: a held-out
        dataset's columns need not be the training set's)."""
        if held_out is None:
            return cls(
                tasks.prompt_field, tasks.answer_field, tasks.require_answers, tasks.answer_after
            )
        return cls(
            held_out.prompt_field,
            held_out.answer_field,
            tasks.require_answers,
            held_out.answer_after,
            "eval",
        )


DEFAULT_COLUMNS = Columns()
"""The usual column names, every row with an answer."""


def _missing(origin: str, at: str, row: Mapping[str, Any], what: str, fix: str) -> str:
    found = ", ".join(map(str, row)) or "none"
    return f"{origin}: {at} has no {what}; its columns: {found}. {fix}"


def _after(answer: str, marker: str, where: str, key: str = "tasks.answer_after") -> str:
    """What follows the last ``marker`` in ``answer`` (a worked solution's final answer).

    >>> _after("48/2 = 24\\n48+24 = 72\\n#### 72", "####", "line 1")
    '72'
    """
    if marker not in answer:
        raise TaskSourceError(
            f"{where}'s answer has no {marker!r} ({key}) to take the final "
            f"answer after: {answer[-80:]!r}"
        )
    return answer.rsplit(marker, 1)[1].strip()


def tasks_from_rows(
    rows: Iterable[Any], origin: str, where: Sequence[str] = (), columns: Columns = DEFAULT_COLUMNS
) -> list[Task]:
    """Tasks from ``{prompt, answer[, id, type]}`` mappings (other column names by
    ``columns``); a row's index is its default id.

    ``where[i]`` names row ``i`` in messages (``line 7`` of a JSONL file; default ``task i``).
    A row without a prompt, a row without an answer (unless ``columns.require_answer`` is
    off) and an id used twice are ``TaskSourceError``s naming the row and the columns it has:
    a file whose answers sit in a ``solution`` column never starts a run graded against
    nothing.
    """
    prompts = (columns.prompt,) if columns.prompt else PROMPT_FIELDS
    answers = (columns.answer,) if columns.answer else ANSWER_FIELDS
    tasks = []
    for i, row in enumerate(rows):
        at = where[i] if i < len(where) else f"task {i}"
        if not isinstance(row, Mapping):
            raise TaskSourceError(
                f"{origin}: {at} is not an object ({type(row).__name__}); each task is one, "
                'e.g. {"prompt": "1+1?", "answer": "2"}'
            )
        prompt = _first(row, prompts)
        if prompt is None:
            what = " or ".join(repr(p) for p in prompts) + " prompt"
            fix = f"Name the prompt's column with {columns.section}.prompt_field."
            raise TaskSourceError(_missing(origin, at, row, what, fix))
        answer, task_id = _first(row, answers), _first(row, ID_FIELDS)
        if answer is None and columns.require_answer:
            what = " or ".join(repr(a) for a in answers) + " answer"
            kept = "graded wrong" if columns.section == "tasks" else "left out of the accuracy"
            fix = (
                f"Name the answer's column with {columns.section}.answer_field, or set "
                f"tasks.require_answers: false for tasks without one ({kept})."
            )
            raise TaskSourceError(_missing(origin, at, row, what, fix))
        reference = None if answer is None else reference_text(answer)
        if reference is not None and columns.answer_after is not None:
            key = f"{columns.section}.answer_after"
            reference = _after(reference, columns.answer_after, f"{origin}: {at}", key)
        tasks.append(
            Task(
                task_id=str(i if task_id is None else task_id),
                prompt=str(prompt),
                answer=reference,
                task_type=str(row.get("type") or row.get("task_type") or "math"),
            )
        )
    if not tasks:
        raise TaskSourceError(f"{origin}: no tasks")
    refuse_duplicate_ids(tasks, origin, where)
    return tasks
