"""The DSBench task record and the on-disk layout every task source writes.

A task folder holds ``train.csv`` and ``test.csv`` (given to the agents), the held-out
answers (never shown to them) and ``task.json`` with the metadata below. The task type
comes from this metadata, never from guessing at the values.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

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


def load_task_dir(folder: Path) -> DSBenchTask:
    """Read a task folder written by ``synthetic`` or ``sklearn_data``."""
    data = json.loads((folder / "task.json").read_text())
    if data.get("task_type") not in ("classification", "regression"):
        raise ValueError(f"{folder}/task.json: task_type must be classification or regression")
    return DSBenchTask(**data)
