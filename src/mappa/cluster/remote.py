"""Driver-side stand-ins for the actors, behind the interfaces the loop already uses.

``RemotePolicies`` is the trainers as a ``TrainablePolicy`` (no-grad log-probs, for the
experience the driver makes over the whole batch) and as the adapter store a checkpoint
saves; ``RemoteEngine`` is the engine actor(s) as a ``RolloutEngine`` whose ``sync`` sends
each agent's new weights from its trainer to its engine through Ray's object store;
``RemoteOptimizer`` and ``EngineRng`` are the actors' optimizer and random states as a
checkpoint sees them; ``RemoteCoach`` splits the coach's requests across coach actors.
Every wait goes through ``wait``, which turns a dead actor into ``WorkerLost``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
import torch
from ray.actor import ActorHandle
from ray.exceptions import ObjectLostError, RayActorError

from mappa.coach.context import CoachContext
from mappa.config import RLConfig
from mappa.models.interface import AdapterSource, LogprobRequest, Sample, TokenLogprobs
from mappa.records import Score
from mappa.rl.experience import Experience
from mappa.rl.update import UpdateStats
from mappa.run.models import WorkerLost


def wait(refs: Any, what: str) -> Any:
    """``ray.get(refs)``; a dead actor or lost node becomes ``WorkerLost`` saying ``what``
    the run was doing. An exception raised inside an actor method propagates as itself."""
    try:
        return ray.get(refs)
    except (RayActorError, ObjectLostError) as err:
        detail = " ".join(str(err).split())[:1200]  # Ray's text names the actor
        raise WorkerLost(
            f"{what}: a Ray actor of this run died or its node was lost, so the run stops "
            f"({type(err).__name__}: {detail})"
        ) from err


def _distinct(actors: Mapping[str, ActorHandle]) -> list[ActorHandle]:
    """Each actor once, in agent order (one handle may serve several agents)."""
    seen: dict[int, ActorHandle] = {}
    for actor in actors.values():
        seen.setdefault(id(actor), actor)
    return list(seen.values())


class RemotePolicies:
    """The trainer actors as one policy: ``trainers[agent]`` holds ``agent``'s adapter."""

    def __init__(self, trainers: Mapping[str, ActorHandle]) -> None:
        self.trainers = dict(trainers)
        self.agents = list(trainers)

    def _trainer(self, agent: str | None) -> ActorHandle:
        # The reference (adapters off) is the same base on every trainer: ask the first.
        return self.trainers[self.agents[0] if agent is None else agent]

    def completion_logprobs(
        self,
        agent: str | None,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> TokenLogprobs:
        """Log-probs computed on ``agent``'s trainer. They carry no gradient, so this serves
        the no-grad passes only; the update itself runs on the trainers (``policy_steps``)."""
        if torch.is_grad_enabled():
            raise RuntimeError(
                "remote log-probs carry no gradient: call under torch.no_grad(); the update "
                "runs on the trainer actors (mappa.cluster.update.remote_update)"
            )
        ref: Any = self._trainer(agent).completion_logprobs.remote(
            agent, [list(p) for p in prompt_ids], [list(c) for c in completion_ids],
            temperature, with_entropy,
        )  # fmt: skip
        out: TokenLogprobs = wait(ref, f"log-probs of {agent or 'the reference'}")
        return out

    def completion_logprobs_many(
        self, requests: Sequence[LogprobRequest], temperature: float
    ) -> list[TokenLogprobs]:
        """Every no-grad pass of a step's experience at once (``ConcurrentLogprobs``), each
        on the trainer of the rows' agent: the reference too (every trainer holds the same
        base), so the agents' trainers share the reference passes and all run in parallel
        instead of one micro-batch at a time."""
        refs = [
            self.trainers[r.owner].completion_logprobs.remote(
                r.agent, r.prompt_ids, r.completion_ids, temperature, False
            )
            for r in requests
        ]
        out: list[TokenLogprobs] = wait(refs, "the experience's log-prob passes")
        return out

    def policy_steps(
        self,
        exp: Experience,
        rl: RLConfig,
        beta: float,
        temperature: float,
        step: int,
        total_steps: int,
    ) -> dict[str, UpdateStats]:
        """Every agent's optimizer step on its trainer, all at once (one actor that holds
        several agents takes them in turn). ``exp`` crosses to the trainers once."""
        ref = ray.put(exp)
        pending = {
            agent: self.trainers[agent].policy_step.remote(
                agent, ref, rl, beta, temperature, step, total_steps
            )
            for agent in self.agents
        }
        done = wait(list(pending.values()), "the agents' updates")
        return dict(zip(pending, done, strict=True))

    def adapter_refs(self) -> dict[str, ray.ObjectRef]:
        """Each agent's current weights, left in the object store (not fetched here)."""
        return {a: self.trainers[a].adapter_state.remote(a) for a in self.agents}

    def adapter_digests(self) -> dict[str, str]:
        refs = [self.trainers[a].adapter_digest.remote(a) for a in self.agents]
        return dict(zip(self.agents, wait(refs, "fingerprinting the adapters"), strict=True))

    def save(self, directory: Path) -> dict[str, Path]:
        """Write each agent's adapter under ``directory/<agent>``, as ``AgentPolicies.save``
        does; the files come from the trainers, so the run dir can be the driver's disk."""
        refs = [self.trainers[a].adapter_files.remote(a) for a in self.agents]
        out = {}
        for agent, files in zip(self.agents, wait(refs, "saving the adapters"), strict=True):
            out[agent] = directory / agent
            out[agent].mkdir(parents=True, exist_ok=True)
            for name, data in files.items():
                (out[agent] / name).write_bytes(data)
        return out

    def load(self, directory: Path) -> None:
        """Load each agent's saved adapter into its trainer (resume)."""
        from safetensors.torch import load_file

        refs = [
            self.trainers[a].load_adapter_state.remote(
                a, load_file(str(directory / a / "adapter_model.safetensors"))
            )
            for a in self.agents
        ]
        wait(refs, "loading the checkpoint's adapters")


class RemoteOptimizer:
    """One agent's Adam on its trainer, as a checkpoint saves and restores it."""

    def __init__(self, trainer: ActorHandle, agent: str) -> None:
        self.trainer, self.agent = trainer, agent

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = wait(
            self.trainer.optimizer_state.remote(self.agent), f"saving {self.agent}'s optimizer"
        )
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ref: Any = self.trainer.load_optimizer_state.remote(self.agent, state_dict)
        wait(ref, f"restoring {self.agent}'s optimizer")


class RemoteEngine:
    """The engine actor(s) as the rollout's engine: ``engines[agent]`` samples for ``agent``.

    ``name`` is the engine inside the actors (``hf``, ``vllm``): how the sampling log-probs
    relate to the trainer's depends on it (``rl.recompute_old_logprobs``). ``in_trainers``:
    the engines are the trainer actors themselves (``cluster.engines: trainer``), which hold
    the trained weights already, so ``sync`` has no weights to send; only an hf engine there
    samples from the very modules they train (``shares_trainer``): a vLLM engine in the
    trainer actor samples from its own copy. ``actor_names``: the Ray name of the actor that
    samples each agent, for messages.
    """

    def __init__(
        self,
        engines: Mapping[str, ActorHandle],
        name: str,
        *,
        in_trainers: bool,
        actor_names: Mapping[str, str],
    ) -> None:
        self.engines = dict(engines)
        self.agents = list(engines)
        self.name = name
        self.in_trainers = in_trainers
        self.shares_trainer = in_trainers and name == "hf"
        self.actor_names = dict(actor_names)
        """Agent -> the Ray name of the actor that samples it (for messages)."""

    def describe(self, agent: str) -> str:
        return f"{self.name} engine on Ray actor {self.actor_names[agent]}"

    def logprobs_of(
        self,
        agent: str | None,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
    ) -> list[list[float]]:
        """The engine actor's log-probs of the given tokens (``RolloutEngine.logprobs_of``)."""
        actor = self.engines[self.agents[0] if agent is None else agent]
        ref: Any = actor.engine_logprobs_of.remote(
            agent, [list(p) for p in prompt_ids], [list(c) for c in completion_ids]
        )
        out: list[list[float]] = wait(ref, f"probing {agent or 'the reference'}'s engine")
        return out

    def generate(
        self,
        agent: str | None,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        batch_size: int = 8,
        greedy: bool = False,
    ) -> list[Sample]:
        actor = self.engines[self.agents[0] if agent is None else agent]
        ref: Any = actor.generate.remote(
            agent, [list(p) for p in prompts], max_new_tokens, temperature, batch_size, greedy
        )
        samples: list[Sample] = wait(ref, f"sampling {agent or 'the reference'}")
        return samples

    def sync(self, source: AdapterSource, step: int) -> None:
        """Send every agent's weights from its trainer to its engine through the object
        store, have the engines serve them, and check each engine now holds exactly the
        trainer's weights (equal digests), so the next rollout provably samples them."""
        if not isinstance(source, RemotePolicies):
            raise TypeError(f"a Ray engine syncs from the trainer actors, not {type(source)}")
        if not self.in_trainers:
            refs = source.adapter_refs()
            loaded = [self.engines[a].load_adapter_state.remote(a, refs[a]) for a in self.agents]
            held = dict(zip(self.agents, wait(loaded, "sending adapters"), strict=True))
            trained = source.adapter_digests()
            stale = [a for a in self.agents if held[a] != trained[a]]
            if stale:
                raise RuntimeError(f"engines hold other weights than the trainers for {stale}")
        publish = [e.publish.remote(step) for e in _distinct(self.engines)]
        wait(publish, "publishing the adapters on the engines")

    def release(self) -> None:
        wait([e.release.remote() for e in _distinct(self.engines)], "releasing the engines")

    def close(self) -> None:
        """Nothing here: the actors are ended by the run's ``close`` (``launch``)."""


class EngineRng:
    """The engine actors' random states, as one checkpoint entry (resume samples on)."""

    def __init__(self, engines: Sequence[ActorHandle]) -> None:
        self.engines = list(engines)

    def state_dict(self) -> dict[str, Any]:
        states = wait([e.rng_state.remote() for e in self.engines], "saving the engines' RNG")
        return {"engines": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict["engines"]
        if len(states) != len(self.engines):
            raise ValueError(f"{len(states)} engine RNG states for {len(self.engines)} engines")
        refs = [e.set_rng_state.remote(s) for e, s in zip(self.engines, states, strict=True)]
        wait(refs, "restoring the engines' RNG")


class RemoteCoach:
    """The coach actors as one coach: a step's contexts split into contiguous shares, one per
    actor, scored at once; the scores come back in order."""

    def __init__(self, actors: Sequence[ActorHandle], name: str) -> None:
        self.actors = list(actors)
        self.name = name

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        n = len(self.actors)
        size = -(-len(contexts) // n) if contexts else 0
        shares = [list(contexts[i * size : (i + 1) * size]) for i in range(n)]
        refs = [a.score.remote(s) for a, s in zip(self.actors, shares, strict=True) if s]
        return [score for share in wait(refs, "coach scoring") for score in share]
