"""The Task record and loading tasks from a config source."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
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


def load_task_file(path: Path) -> list[Task]:
    """Read a JSON list or JSONL file of ``{prompt, answer[, id]}`` objects."""
    text = path.read_text(encoding="utf-8")
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a list of tasks")
    return tasks_from_rows(rows, str(path))


DSBENCH_PREFIX = "dsbench:"


def load_dsbench(source: str, num_tasks: int, seed: int, root: str | None = None) -> list[Task]:
    """``dsbench-synthetic`` (generated, cached by seed), ``dsbench-sklearn`` (real datasets
    shipped with scikit-learn) or ``dsbench:<task list>`` (real DSBench folders under ``root``)."""
    from mappa.paths import cache_root

    if source == "dsbench-synthetic":
        from mappa.tasks.dsbench.synthetic import generate

        per_kind = max(1, -(-num_tasks // 3))
        specs = generate(cache_root() / "dsbench" / f"synthetic-{seed}-{per_kind}", per_kind, seed)
    elif source == "dsbench-sklearn":
        from mappa.tasks.dsbench.sklearn_data import generate as sklearn_tasks

        specs = sklearn_tasks(cache_root() / "dsbench" / f"sklearn-{seed}", seed=seed)
    else:
        from mappa.tasks.dsbench.loader import load_task_list

        listing = Path(source[len(DSBENCH_PREFIX) :])
        specs, problems = load_task_list(listing, Path(root) if root else listing.parent)
        if problems:
            raise FileNotFoundError(
                f"{listing}: {len(problems)} task(s) cannot load: " + "; ".join(problems[:5])
            )
    return [Task.from_dsbench(s) for s in specs]


def load_tasks(
    source: str, num_tasks: int, difficulty: int, seed: int, dsbench_root: str | None = None
) -> list[Task]:
    """``arithmetic`` generates tasks; ``dsbench-*`` and ``dsbench:<list>`` are modeling
    tasks; a directory is a Hugging Face dataset saved to disk; anything else is a
    JSON/JSONL task file."""
    if source.startswith(("dsbench-", DSBENCH_PREFIX)):
        return load_dsbench(source, num_tasks, seed, dsbench_root)
    if source == "arithmetic":
        from mappa.tasks.arithmetic import generate

        return generate(num_tasks, seed=seed, difficulty=difficulty)
    path = Path(source)
    if path.is_dir():
        from mappa.tasks.hf import load_dataset_dir

        return load_dataset_dir(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file {path} not found")
    return load_task_file(path)
