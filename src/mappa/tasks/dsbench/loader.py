"""Real DSBench modeling tasks from its task list (JSON lines of prompt + metadata).

Each line's metadata names ``task_id``, ``data_type`` (classification | regression) and the
``train_file``, ``test_file`` and ``answer_dir`` paths, relative to wherever the user keeps
DSBench; ``root`` replaces the ``./data/DSBench`` prefix. Tasks whose files are missing are
reported, never dropped silently.
"""

from __future__ import annotations

import json
from pathlib import Path

from mappa.tasks.dsbench.spec import DSBenchTask

_PREFIX = "./data/DSBench/"


def _resolve(path: str, root: Path) -> Path:
    return root / path[len(_PREFIX) :] if path.startswith(_PREFIX) else root / path


def _answers_file(answer_dir: Path) -> Path:
    preferred = answer_dir / "test_answer.csv"
    if preferred.is_file():
        return preferred
    csvs = sorted(answer_dir.glob("*.csv"))
    if len(csvs) != 1:
        raise FileNotFoundError(f"{answer_dir}: expected test_answer.csv or exactly one CSV")
    return csvs[0]


def load_task_list(
    path: Path, root: Path, id_column: str = "id"
) -> tuple[list[DSBenchTask], list[str]]:
    """(tasks whose files exist, ``"task_id: reason"`` for each one that could not load)."""
    tasks, problems = [], []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        meta = row.get("metadata") or {}
        task_id = meta.get("task_id", f"line {line_no}")
        try:
            if meta.get("data_type") not in ("classification", "regression"):
                raise ValueError(f"data_type {meta.get('data_type')!r} is not supported")
            train, test = _resolve(meta["train_file"], root), _resolve(meta["test_file"], root)
            for f in (train, test):
                if not f.is_file():
                    raise FileNotFoundError(f"{f} not found")
            answers = _answers_file(_resolve(meta["answer_dir"], root))
        except (KeyError, ValueError, FileNotFoundError) as err:
            problems.append(f"{task_id}: {err}")
            continue
        tasks.append(
            DSBenchTask(
                task_id=task_id,
                task_type=meta["data_type"],
                description=row["prompt"],
                train_csv=str(train),
                test_csv=str(test),
                answers_csv=str(answers),
                id_column=id_column,
            )
        )
    return tasks, problems
