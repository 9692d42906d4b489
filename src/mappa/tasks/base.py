"""The Task record and loading tasks from a config source."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Task:
    """One problem: its text and, when known, the reference answer."""

    task_id: str
    prompt: str
    answer: str | None
    task_type: str = "math"  # for per-task-type statistics and whitening scopes


def load_task_file(path: Path) -> list[Task]:
    """Read a JSON list or JSONL file of ``{prompt, answer[, id]}`` objects."""
    text = path.read_text(encoding="utf-8")
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a list of tasks")
    tasks = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "prompt" not in row:
            raise ValueError(f"{path}: task {i} has no 'prompt' field")
        answer = row.get("answer")
        tasks.append(
            Task(
                task_id=str(row.get("id", i)),
                prompt=str(row["prompt"]),
                answer=None if answer is None else _answer_text(answer),
                task_type=str(row.get("type") or row.get("task_type") or "math"),
            )
        )
    if not tasks:
        raise ValueError(f"{path}: no tasks")
    return tasks


def _answer_text(answer: object) -> str:
    """``18.0`` -> ``"18"``: integral floats in data files are integers."""
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))
    return str(answer)


def load_tasks(source: str, num_tasks: int, difficulty: int, seed: int) -> list[Task]:
    """``arithmetic`` generates tasks; anything else is a task file path."""
    if source == "arithmetic":
        from mappa.tasks.arithmetic import generate

        return generate(num_tasks, seed=seed, difficulty=difficulty)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"task file {path} not found")
    return load_task_file(path)
