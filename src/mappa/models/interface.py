"""The whole rollout <-> trainer contract with the models, free of torch imports.

The workflow runner needs only ``SamplingPolicy``; the RL update needs only
``TrainablePolicy``; ``mappa.models.policies.AgentPolicies`` implements both. A
``RolloutEngine`` is the sampler the trainer hands the runner: the trained model itself
(``rollout.engine: hf``) or a separate engine (vLLM) that ``sync`` gives the new adapters
after every update. Tests above these interfaces may use fakes; everything else uses the
real thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    import torch


@dataclass
class Sample:
    """One sampled completion: token-in, token-out.

    ``prompt_ids + completion_ids`` is exactly the sequence the policy saw and produced;
    ``logprobs[k]`` is the log-probability of ``completion_ids[k]`` under the distribution it
    was sampled from. A completion that hit the length limit has ``truncated=True``.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    truncated: bool


class SamplingPolicy(Protocol):
    """Batched sampling for one agent (``None``: the frozen reference)."""

    def generate(
        self,
        agent: str | None,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        batch_size: int = 8,
        greedy: bool = False,
    ) -> list[Sample]: ...


class TokenLogprobs(NamedTuple):
    """Per completion token, right-padded to ``(B, T)``: log-prob of the token, and the
    entropy of the distribution it was drawn from (``None`` unless asked for)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None


class TrainablePolicy(Protocol):
    """Log-probs of given completion tokens, differentiable w.r.t. the agent's adapter."""

    def completion_logprobs(
        self,
        agent: str | None,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> TokenLogprobs: ...


@dataclass(frozen=True)
class LogprobRequest:
    """One no-grad log-prob pass: ``agent``'s adapter (None: the reference, adapters off)
    over rows that belong to ``owner``, so a policy whose adapters live apart (one Ray
    trainer per agent) can run it where ``owner``'s adapter is."""

    agent: str | None
    owner: str
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]


class ConcurrentLogprobs(Protocol):
    """A policy that runs many no-grad log-prob passes at once (Ray trainers in parallel);
    a policy without it runs them one by one through ``completion_logprobs``."""

    def completion_logprobs_many(
        self, requests: Sequence[LogprobRequest], temperature: float
    ) -> list[TokenLogprobs]: ...


class AdapterSource(Protocol):
    """Where an engine gets the agents' current weights: the trainer's policies."""

    def save(self, directory: Path) -> dict[str, Path]:
        """Write each agent's adapter (standard PEFT layout) under ``directory/<agent>``."""
        ...


class RolloutEngine(SamplingPolicy, Protocol):
    """The sampler of the rollout. ``sync`` is called after every update (and once before the
    first rollout) so that the next ``generate`` samples from the weights just trained; an
    engine that samples from the trained modules themselves has nothing to do there. After
    each sync the run checks the engine's ``logprobs_of`` against the trainer's
    (``mappa.models.sync_probe``)."""

    name: str
    shares_trainer: bool
    """Whether ``generate`` runs on the very modules the update trains (the hf engine in the
    trainer's process), rather than on a copy synced from them. Either way the sampling
    log-probs never stand in for the old policy's (docs/algorithm.md §2)."""

    def sync(self, source: AdapterSource, step: int) -> None: ...

    def logprobs_of(
        self,
        agent: str | None,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
    ) -> list[list[float]]:
        """The temperature-1 log-prob of each given completion token under the very weights
        ``generate`` samples ``agent`` from: what the sync probe compares with the trainer's
        (``mappa.models.sync_probe``), so it must not take another path to the weights."""
        ...

    def describe(self, agent: str) -> str:
        """Which engine serves ``agent``, as an error message names it (``hf engine``)."""
        ...

    def release(self) -> None:
        """The update is about to run: free what the engine holds that the trainer could
        use, until the next ``sync`` (an engine on its own memory has nothing to do)."""
        ...

    def close(self) -> None: ...
