"""The DSBench task record and the on-disk layout every task source writes.

A task folder holds ``train.csv`` and ``test.csv`` (given to the agents), the held-out
answers (never shown to them) and ``task.json`` with the metadata below. The task type
comes from this metadata, never from guessing at the values.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import pandas as pd

TaskType = Literal["classification", "regression"]


@dataclass(frozen=True)
class DSBenchTask:
    task_id: str
    task_type: TaskType
    description: str  # Kaggle-style text the agents see
    train_csv: str
    test_csv: str
    answers_csv: str  # held out: id + target for every test row
    id_column: str = "id"
    target_column: str = "target"

    def agent_files(self) -> dict[str, Path]:
        """The files copied into an episode's workspace (the answers are not among them)."""
        return {"train.csv": Path(self.train_csv), "test.csv": Path(self.test_csv)}


def write_task_json(task: DSBenchTask, folder: Path) -> None:
    (folder / "task.json").write_text(json.dumps(asdict(task), indent=1))


def write_task(
    folder: Path,
    task_id: str,
    task_type: TaskType,
    description: str,
    train: pd.DataFrame,
    test: pd.DataFrame,
) -> DSBenchTask:
    """Write a task folder from ``id``/``target`` frames: ``train.csv``, ``test.csv`` without
    the target, the answers (``id``, ``target``) and ``task.json``; returns its record."""
    folder.mkdir(parents=True, exist_ok=True)
    train.to_csv(folder / "train.csv", index=False)
    test.drop(columns=["target"]).to_csv(folder / "test.csv", index=False)
    test[["id", "target"]].to_csv(folder / "test_answer.csv", index=False)
    (folder / "test_answer.csv").chmod(0o600)  # the sandbox's unprivileged uid cannot peek
    task = DSBenchTask(
        task_id=task_id,
        task_type=task_type,
        description=description,
        train_csv=str(folder / "train.csv"),
        test_csv=str(folder / "test.csv"),
        answers_csv=str(folder / "test_answer.csv"),
    )
    write_task_json(task, folder)
    return task


def load_task_dir(folder: Path) -> DSBenchTask:
    """Read a task folder written by ``synthetic`` or ``sklearn_data``."""
    data = json.loads((folder / "task.json").read_text())
    if data.get("task_type") not in ("classification", "regression"):
        raise ValueError(f"{folder}/task.json: task_type must be classification or regression")
    return DSBenchTask(**data)
