"""The training order: every task once per epoch, each repeated per sample, restorable."""

from __future__ import annotations

import json
from collections import Counter

from mappa.tasks import Task
from mappa.tasks.batches import TaskBatches

TASKS = [Task(task_id=str(i), prompt=f"p{i}", answer=str(i)) for i in range(5)]


def test_every_task_once_an_epoch_each_repeated_per_sample() -> None:
    batches = TaskBatches(TASKS, 2, 3, seed=0)
    drawn = [t.task_id for _ in range(5) for t in next(batches)]  # 10 draws: 2 epochs
    assert Counter(drawn) == {str(i): 6 for i in range(5)}
    assert len(next(batches)) == 6


def test_task_batches_resume_their_order() -> None:
    whole = TaskBatches(TASKS, 2, 2, seed=7)
    first = [next(whole) for _ in range(7)]
    part = TaskBatches(TASKS, 2, 2, seed=7)
    _ = [next(part) for _ in range(3)]
    state = json.loads(json.dumps(part.state_dict()))  # lists, as after a round trip
    resumed = TaskBatches(TASKS, 2, 2, seed=7)
    resumed.load_state_dict(state)
    assert [next(resumed) for _ in range(4)] == first[3:]
