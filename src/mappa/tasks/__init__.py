"""Task sources (built-in arithmetic, JSON files) and the deterministic answer grader."""

from mappa.tasks.base import Task
from mappa.tasks.sources import load_tasks

__all__ = ["Task", "load_tasks"]
