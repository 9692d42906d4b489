"""What the coach is shown about one action."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class CoachContext:
    """Everything the coach may see when judging one action (docs/design.md §1).

    ``ground_truth`` holds the reference answer (MathChat) or the computed metrics
    (DSBench), for the agents ``coach.reference_for`` names. ``files`` is the
    workspace listing with provenance (DSBench), ``task_type`` feeds the bias statistics.
    ``answer_check`` is the grader's verdict on the final answer, in words
    (``coach.answer_check``).
    """

    task: str
    agent: str
    role: str
    turn: int
    agent_input: str
    output: str
    observation: str | None
    is_final: bool
    ground_truth: str | None
    truncated: bool = False
    output_limit: int | None = None
    files: str | None = None
    task_type: str = "default"
    answer_check: str | None = None

    def digest(self) -> str:
        """A stable hash of everything the coach sees (the cache key's context part)."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()
