"""The one cluster error the training loop handles, importable without Ray."""

from __future__ import annotations


class WorkerLost(RuntimeError):
    """A Ray actor of the run (trainer, engine or coach) died or its node went away.

    The run cannot go on without the weights or optimizer state that actor held, so it
    stops; the loop adds where the newest checkpoint is (``mappa.checkpoint.resume_hint``).
    """
