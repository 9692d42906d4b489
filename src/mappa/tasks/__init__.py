"""Task sources (built-in arithmetic, JSON files) and the deterministic answer grader."""

from mappa.tasks.base import Columns, Task
from mappa.tasks.sources import load_tasks

__all__ = ["Columns", "Task", "load_tasks"]
