"""What runs inside the Ray actors: plain classes, made actors by ``mappa.cluster.launch``.

``PolicyWorker`` holds one base model with some agents' LoRA adapters (``AgentPolicies``) and
plays any of three roles for them: trainer (an Adam per agent; log-probs for the driver's
experience; the optimizer step), engine (samples; takes adapter weights sent by trainers),
coach (the local coach on the base with adapters off, or an HTTP client). ``CoachWorker``
is a coach alone. Every argument and result crosses a process boundary, so all are plain
picklable values and CPU tensors.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mappa.coach.context import CoachContext
from mappa.config import RLConfig, RunConfig
from mappa.models.interface import RolloutEngine, Sample, TokenLogprobs
from mappa.records import Score
from mappa.rl.experience import Experience
from mappa.rl.schedule import set_step_lr
from mappa.rl.update import UpdateStats, policy_step
from mappa.rng import set_torch_rng_state, torch_rng_state
from mappa.run import build


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """A fingerprint of adapter weights (names and exact bytes): equal digests on a trainer
    and an engine prove the engine holds the weights just trained."""
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it, however nested in dicts, lists and tuples, detached
    and copied to CPU (a 0-dim tensor, as Adam's ``step``, stays a tensor); everything else
    as it is. For results that leave a worker: the driver may have no GPU, or another."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_cpu(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_cpu(v) for v in value)
    return value


class PolicyWorker:
    """The base with the adapters of ``agents``, as trainer and/or engine and/or coach.

    Args:
        cfg: the run's config (the model, LoRA, optimizer and engine settings).
        agents: whose adapters this actor holds; each starts as in a single process
            (``AgentPolicies``' per-agent seed), so any split of agents over actors trains
            the same weights.
        trainer: keep an Adam per agent and take optimizer steps.
        sampler_seed: be an engine, with torch's RNG seeded so: the run's seed makes a lone
            engine sample exactly the tokens a single process samples.
        coach: also serve the coach (``score``).
    """

    def __init__(
        self,
        cfg: RunConfig,
        agents: Sequence[str],
        *,
        trainer: bool,
        sampler_seed: int | None,
        coach: bool,
    ) -> None:
        self.policies = build.load_policies(cfg, agents=agents)
        self.params, self.optimizers = (
            build.make_optimizers(cfg, self.policies) if trainer else ({}, {})
        )
        self.engine: RolloutEngine | None = None
        if sampler_seed is not None:
            self.engine = build.make_engine(cfg, self.policies)
        self.coach = build.coach_backend(cfg, self.policies, self.engine) if coach else None
        if sampler_seed is not None:  # last: nothing above may shift the sampling stream
            torch.manual_seed(sampler_seed)

    # ------------------------------------------------------------------ identity
    def where(self) -> dict[str, Any]:
        """This actor's node and process (placement checks, and killing it in tests)."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def tokenizer(self) -> Any:
        return self.policies.tokenizer

    # ------------------------------------------------------------------ engine
    def generate(
        self,
        agent: str | None,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float,
        batch_size: int,
        greedy: bool,
    ) -> list[Sample]:
        if self.engine is None:
            raise RuntimeError("this actor is not an engine")
        return self.engine.generate(agent, prompts, max_new_tokens, temperature, batch_size, greedy)

    def engine_logprobs_of(
        self,
        agent: str | None,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
    ) -> list[list[float]]:
        """The engine's own log-probs of given tokens (the driver's sync probe)."""
        if self.engine is None:
            raise RuntimeError("this actor is not an engine")
        return self.engine.logprobs_of(agent, prompt_ids, completion_ids)

    def publish(self, step: int) -> None:
        """Serve the adapters now held (an in-actor vLLM engine reloads them; hf samples
        from them already)."""
        if self.engine is not None:
            self.engine.sync(self.policies, step)

    def release(self) -> None:
        if self.engine is not None:
            self.engine.release()

    def rng_state(self) -> dict[str, Any]:
        return torch_rng_state()

    def set_rng_state(self, state: dict[str, Any]) -> None:
        set_torch_rng_state(state)

    # ------------------------------------------------------------------ adapters
    def adapter_state(self, agent: str) -> dict[str, torch.Tensor]:
        return self.policies.adapter_state(agent)

    def adapter_digest(self, agent: str) -> str:
        return state_digest(self.policies.adapter_state(agent))

    def load_adapter_state(self, agent: str, weights: dict[str, torch.Tensor]) -> str:
        """Take ``agent``'s weights (sent by its trainer, or from a checkpoint); returns their
        digest as now held."""
        self.policies.load_adapter_state(agent, weights)
        return self.adapter_digest(agent)

    def adapter_files(self, agent: str) -> dict[str, bytes]:
        """``agent``'s adapter as saved (standard PEFT files, by name), for the driver to
        write into the run dir: the run dir need not be on this node's disk."""
        with tempfile.TemporaryDirectory(prefix="mappa-adapter-") as tmp:
            out = Path(tmp) / agent
            self.policies.save(Path(tmp))
            return {f.name: f.read_bytes() for f in sorted(out.iterdir()) if f.is_file()}

    # ------------------------------------------------------------------ trainer
    def completion_logprobs(
        self,
        agent: str | None,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        temperature: float,
        with_entropy: bool,
    ) -> TokenLogprobs:
        """No-grad log-probs for the driver's experience (old and reference passes)."""
        with torch.no_grad():
            out = self.policies.completion_logprobs(
                agent, prompt_ids, completion_ids, temperature, with_entropy
            )
        entropy = None if out.entropy is None else out.entropy.cpu()
        return TokenLogprobs(out.logprobs.cpu(), entropy)

    def policy_step(
        self,
        agent: str,
        exp: Experience,
        rl: RLConfig,
        beta: float,
        temperature: float,
        step: int,
        total_steps: int,
    ) -> UpdateStats:
        """``agent``'s optimizer step on the driver's experience, at the schedule's lr."""
        optimizer = self.optimizers[agent]
        set_step_lr([optimizer], rl, step, total_steps)
        return policy_step(
            self.policies, agent, exp, optimizer, self.params[agent], rl, beta, temperature
        )

    def optimizer_state(self, agent: str) -> dict[str, Any]:
        """``agent``'s Adam state for the driver's checkpoint, all on CPU (``to_cpu``): Adam's
        moments live on this trainer's device, which the driver may lack."""
        state: dict[str, Any] = to_cpu(self.optimizers[agent].state_dict())
        return state

    def load_optimizer_state(self, agent: str, state: dict[str, Any]) -> None:
        """Restore ``optimizer_state``'s CPU state. torch's ``Optimizer.load_state_dict``
        moves each moment to its parameter's device and dtype (and ``step`` too where Adam
        keeps it there: fused or capturable), so the state lands on this trainer's device."""
        self.optimizers[agent].load_state_dict(state)

    # ------------------------------------------------------------------ coach
    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        if self.coach is None:
            raise RuntimeError("this actor serves no coach")
        return self.coach.score(contexts)

    def coach_name(self) -> str:
        return "" if self.coach is None else self.coach.name

    def close(self) -> None:
        """End what the engine started (a vLLM engine's process); the actor is killed next."""
        if self.engine is not None:
            self.engine.close()


class CoachWorker:
    """A coach of its own (``cluster.coach_actors``): the configured HTTP client, or a local
    coach model; the default local coach (the policy base with adapters off) is the base
    model itself here, loaded without adapters."""

    def __init__(self, cfg: RunConfig) -> None:
        local = cfg.coach.local
        if cfg.coach.backend == "local" and local.model_path is None:
            cfg = cfg.model_copy(deep=True)
            cfg.coach.local.model_path = cfg.model.path
        self.coach = build.coach_backend(cfg, None, None)

    def where(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        return self.coach.score(contexts)

    def coach_name(self) -> str:
        return self.coach.name
