"""DSBench-style modeling tasks: a folder with train.csv, test.csv and held-out answers.

``spec`` defines the task record and its folder layout; ``synthetic`` generates seeded
tasks and ``sklearn_data`` turns the real datasets scikit-learn ships into tasks; ``loader``
reads real DSBench folders; ``metrics`` scores a submission against the answers by id.
"""

from mappa.tasks.dsbench.spec import DSBenchTask, load_task_dir

__all__ = ["DSBenchTask", "load_task_dir"]
