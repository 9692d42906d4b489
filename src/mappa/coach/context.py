"""What the coach is shown about one action."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from mappa.config import AnswerFormat
from mappa.records import ToolStatus


@dataclass(frozen=True)
class CoachContext:
    """Everything the coach may see when judging one action (docs/design.md §1).

    ``ground_truth`` holds the reference answer (MathChat) or the computed metrics
    (DSBench), for the agents ``coach.reference_for`` names. ``files`` is the
    workspace listing with provenance (DSBench), ``task_type`` feeds the bias statistics.
    ``answer_check`` is the grader's verdict on the final answer, in words
    (``coach.answer_check``). ``tool_status`` is how the action's code run ended (None: it
    ran no code), shown to a model coach beside the observation; ``stdout`` is what that
    run printed on stdout alone (uncut: the answer oracle reads its last number), and
    ``answer_format`` how the grader reads the final agent's answer. ``worked_answer`` is
    the coach's own answer to the task (``coach.self_solve``), shown where no reference is:
    the coach's work, not a label. ``hindsight`` is what the episode's code runs showed
    about the action (``coach.hindsight``). ``final_answer`` is the final agent's answer
    as the grader reads it (``none (...)`` when there is none), shown beside the reference
    on an answer task where the grader's verdict is not: a fact, not the verdict.
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
    tool_status: ToolStatus | None = None
    stdout: str | None = None
    answer_format: AnswerFormat = "boxed"
    final_answer: str | None = None
    worked_answer: str | None = None
    hindsight: str | None = None

    @property
    def runs_code(self) -> bool:
        """Whether the action's call ran its reply's code in the episode's workspace: only
        such a call is shown the workspace listing (``files``), so one with no
        ``tool_status`` wrote no program where it was asked to run one."""
        return self.files is not None

    def digest(self) -> str:
        """A stable hash of everything the coach sees (the cache key's context part)."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()
