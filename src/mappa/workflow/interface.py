"""The rollout <-> trainer contract: typed input and output, nothing else.

In the spirit of SkyRL's ``GeneratorInterface``: the trainer hands a ``RolloutInput`` to
whatever implements ``Rollout`` and gets episodes back. The phase (``train`` or ``eval``)
replaces sampling flags: the rollout maps it to its own sampling settings (training
temperature, or the evaluation protocol's temperature and greedy decoding). The in-process
``FunctionRunner`` is one implementation; another engine (vLLM, Ray actors) plugs in here
without the trainer changing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from mappa.records import Episode
from mappa.tasks import Task

Phase = Literal["train", "eval"]
"""``train``: sample from the training distribution (records feed the update).
``eval``: the evaluation protocol's sampling (``eval.temperature``; 0 is greedy)."""


@dataclass(frozen=True)
class SamplingParams:
    """How one phase samples; the log-probs recorded are those of ``temperature``."""

    temperature: float
    greedy: bool
    max_new_tokens: int
    batch_size: int


@dataclass(frozen=True)
class RolloutInput:
    """One batch of tasks to run through the pipeline (a task repeated k times is k episodes)."""

    tasks: Sequence[Task]
    step: int = 0
    phase: Phase = "train"


@dataclass
class RolloutOutput:
    """The episodes, in the order of ``RolloutInput.tasks``, graded by the deterministic
    outcome judge (not yet scored by the coach), and what producing them cost."""

    episodes: list[Episode]
    generated_tokens: int
    wall_s: float


class Rollout(Protocol):
    """Runs tasks through the multi-agent pipeline. Owns its sandboxes: ``close()`` ends them."""

    def run(self, batch: RolloutInput) -> RolloutOutput: ...

    def close(self) -> None: ...
