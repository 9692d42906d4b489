"""What the coach is shown about one action."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CoachContext:
    """Everything the coach may see when judging one action (DESIGN.md §1)."""

    task: str
    agent: str
    role: str
    turn: int
    agent_input: str
    output: str
    observation: str | None
    is_final: bool
    ground_truth: str | None
