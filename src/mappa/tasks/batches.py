"""The order in which training tasks are drawn, step after step, restorable from a
checkpoint."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mappa.rng import as_tuples
from mappa.tasks import Task


class TaskBatches:
    """Endless batches: ``per_step`` distinct tasks (reshuffled each epoch), each repeated
    ``samples`` times. Its position is restorable (``state_dict`` / ``load_state_dict``)."""

    def __init__(self, tasks: Sequence[Task], per_step: int, samples: int, seed: int) -> None:
        self.tasks, self.per_step, self.samples = list(tasks), per_step, samples
        self.rng = random.Random(seed)
        self.order: list[int] = []  # indices into ``tasks`` still pending this epoch

    def __iter__(self) -> Iterator[list[Task]]:
        return self

    def __next__(self) -> list[Task]:
        batch: list[Task] = []
        while len(batch) < self.per_step:
            if not self.order:
                self.order = list(range(len(self.tasks)))
                self.rng.shuffle(self.order)  # the permutation depends only on the length
            batch.append(self.tasks[self.order.pop()])
        return [t for t in batch for _ in range(self.samples)]

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "order": list(self.order)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rng.setstate(as_tuples(state["rng"]))
        self.order = [int(i) for i in state["order"]]
