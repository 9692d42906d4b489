"""The ports of a run: what the loop samples, scores, trains and saves with (``RunModels``),
and the one failure of a remote implementation it handles (``WorkerLost``). ``build`` fills
them in this process; ``mappa.cluster.launch`` fills them with Ray actors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mappa.models.interface import AdapterSource, RolloutEngine, TrainablePolicy

if TYPE_CHECKING:
    from mappa.coach import CoachBackend
    from mappa.records import Episode
    from mappa.rl.kl import KLController


class AdapterStore(AdapterSource, TrainablePolicy, Protocol):
    """The agents' adapters, saved and loaded as files (``AgentPolicies``, or the trainer
    actors of a Ray run behind ``mappa.cluster``), and their log-probs (the reference the
    sync probe holds the engine to)."""

    def load(self, directory: Path) -> None: ...


class Stateful(Protocol):
    """State that round-trips through a checkpoint: an optimizer (in this process or on a
    trainer actor), the task order, or the random state of engine actors."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


UpdateFn = Callable[["Sequence[Episode]", int, "KLController", bool], dict[str, Any]]
"""``(episodes, step, kl_ctl, recompute_old) -> metrics``: the update of one training step
(``lr`` and ``mappa.rl.update.update_agents``' keys)."""


@dataclass
class RunModels:
    """What the training loop samples, scores and trains with, wherever it lives: in this
    process (``local_models``) or in Ray actors (``mappa.cluster.launch``). The loop sees only
    these interfaces, so it is one loop for both."""

    policies: AdapterStore
    """The adapters the engine is synced from and a checkpoint saves."""
    optimizers: Mapping[str, Stateful]
    engine: RolloutEngine
    coach: CoachBackend | None
    tokenizer: Any
    update: UpdateFn
    close: Callable[[], None]
    samplers: Stateful | None = None
    """The sampler's random state when it is not this process's (``TrainState.samplers``)."""


class WorkerLost(RuntimeError):
    """A Ray actor of the run (trainer, engine or coach) died or its node went away.

    The run cannot go on without the weights or optimizer state that actor held, so it
    stops; the loop adds where the newest checkpoint is (``checkpoint.resume_hint``).
    """
