"""Episode and Action records: what was sampled, what ran, how the coach scored it.

These are plain dataclasses with no torch inside, so the coach, the JSONL writer and the
report can use them without a model. ``prompt_ids + completion_ids`` is exactly the token
sequence the policy sampled: the trainer trains on these ids and never re-tokenizes text.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from mappa.jsonl import append_jsonl, read_jsonl


@dataclass
class Score:
    """The coach's verdict on one action.

    ``flagged`` marks a fallback value (coach unreachable or unparseable): it is recorded but
    left out of training by default, so a coach outage never pretends to be feedback.
    ``flag_reason`` says why (``unavailable``, ``unparseable``, ``out_of_range``,
    ``low_score_mass``). ``digit_mass`` is the probability the coach put on any score 0-10
    where its score was read (None where the backend does not know it): a low mass means
    the read position is not where the model writes a score, and the value is noise.
    """

    value: float
    rationale: str = ""
    answer_correct: bool | None = None
    flagged: bool = False
    backend: str = ""
    latency_s: float = 0.0
    tokens: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0
    cached: bool = False
    flag_reason: str = ""
    digit_mass: float | None = None


ToolStatus = Literal["ok", "error", "timeout", "limit"]
"""How an action's code run ended, from the sandbox's result (never parsed from text):
``ok`` every block exited 0; otherwise the first failing block's ``timeout`` (wall time),
``limit`` (memory, CPU, output, file size, processes) or ``error`` (an exception, a
non-zero exit, a crash)."""


@dataclass
class Action:
    """One generation of one agent (plus the tool run it triggered, if any).

    ``prompt_text`` is what the coach and the report read of the agent's input: every
    message it saw (role, task, earlier turns) as plain text under ``[role]`` headers
    (``chat.plain_transcript``), free of the policy's chat control tokens. The exact
    tokens are ``prompt_ids``. Episodes written before held the decoded prompt ids here.
    """

    episode_id: str
    agent: str
    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    sample_logprobs: list[float]
    prompt_text: str
    completion_text: str
    truncated: bool
    tool_observation: str | None = None
    tool_status: ToolStatus | None = None  # None: the action ran no code
    tool_stdout: str | None = None
    """What the action's programs printed on stdout alone (every block's, in order): the
    result a rule reads, where ``tool_observation`` mixes in stderr and sandbox messages."""
    workspace_files: str | None = None  # the shared workspace after this action, with provenance
    coach_reference: str | None = None  # the outcome as of this action (DSBench final agent)
    coach: Score | None = None
    oracle: bool | None = None
    """Whether the action's result equals the reference answer, as the answer oracle reads
    it (``mappa.workflow.oracle``), recorded for every run whatever its coach; None where
    the task has no reference answer."""

    @property
    def reward(self) -> float:
        """The action's scalar reward: coach score / 10 (docs/design.md §1)."""
        if self.coach is None:
            raise ValueError(f"action {self.episode_id}/{self.agent}/{self.turn} has no score")
        return self.coach.value / 10.0


@dataclass
class Episode:
    """One task run through the whole pipeline."""

    episode_id: str
    task_id: str
    task: str
    answer: str | None
    step: int = 0
    task_type: str = "default"
    actions: list[Action] = field(default_factory=list)
    workspace: str | None = None
    final_answer: str | None = None
    correct: bool | None = None
    grader_timed_out: bool = False  # the comparison gave no verdict in time: correct is False
    metrics: dict[str, float] = field(default_factory=dict)  # outcome metrics (DSBench)
    coach_reference: str | None = None  # what the coach may see when judging the final agent
    missing_artifacts: dict[str, list[str]] = field(default_factory=dict)  # agent -> files it owed
    error: str | None = None
    """The traceback of a workflow function that raised in this episode (it is graded on
    what it left); None where the episode ran to its end."""

    def agent_actions(self, agent: str) -> list[Action]:
        return [a for a in self.actions if a.agent == agent]

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Episode:
        actions = []
        for a in data.get("actions", []):
            coach = Score(**a["coach"]) if a.get("coach") else None
            actions.append(Action(**{**a, "coach": coach}))
        return Episode(**{**data, "actions": actions})


def append_episodes(path: Path, episodes: list[Episode]) -> None:
    """Append episodes to a JSONL file durably (before they are trained on)."""
    append_jsonl(path, (e.to_json() for e in episodes))


def read_episodes(path: Path) -> list[Episode]:
    return [Episode.from_dict(row) for row in read_jsonl(path)]
