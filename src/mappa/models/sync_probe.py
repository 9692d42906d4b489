"""The sync probe: after every sync, prove the rollout engine samples the trainer's weights.

A sync that silently fails (an engine keeps serving an adapter cached for an older step, an
adapter never sent, the wrong adapter active) leaves training running on rollouts from a
stale policy, which nothing else notices: the importance weights quietly absorb the gap.
So after each sync the engine scores a short fixed probe sequence with each agent's adapter,
the trainer scores the same tokens, and a gap larger than the dtype allows stops the step
(``StaleAdapterError``) naming the agent, the engine and the fix (``rollout.sync_check``;
docs/engines.md, "The sync probe").

The probe compares the weights themselves, not a version number: a version stamp proves a
sync call ran, not that the weights it loaded are the ones just trained. It reads no random
number, so it never shifts the rollout's sampling stream.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from mappa.models.interface import RolloutEngine, TrainablePolicy

PROBE_TEXT = (
    "The team solves the task in turns. First the solver writes a plan, then the executor "
    "runs the code and reports 42, and the verifier checks the answer before it is sent."
)
"""The probe sequence: ordinary text, so every tokenizer splits it into ordinary tokens."""

PROBE_PROMPT_TOKENS = 4
"""Leading probe tokens that only condition (the rest are scored)."""

DEFAULT_TOLERANCE = {"float32": 1e-3, "float64": 1e-3, "bfloat16": 0.05, "float16": 0.05}
"""Largest max-abs log-prob gap a freshly synced engine may show, by the model's dtype
(``rollout.sync_tolerance`` overrides it). Measured on SmolLM2-135M (docs/engines.md): a fresh
sync differs from the trainer by <= 2e-6 in both dtypes, a stale adapter one Adam step
behind by >= 2.6e-3 in float32 at lr 2e-5 and >= 0.12 in bfloat16 at any lr tried."""


class StaleAdapterError(RuntimeError):
    """The engine's log-probs differ from the trainer's after a sync: it samples other weights."""


def probe_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """``PROBE_TEXT`` as (prompt ids, completion ids) in the run's tokenizer."""
    ids = list(tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
    if len(ids) <= PROBE_PROMPT_TOKENS:
        raise ValueError(f"the probe text is only {len(ids)} tokens in this tokenizer")
    return ids[:PROBE_PROMPT_TOKENS], ids[PROBE_PROMPT_TOKENS:]


def default_tolerance(dtype: torch.dtype) -> float:
    """``DEFAULT_TOLERANCE`` for the model's dtype (the widest one for an unlisted dtype)."""
    return DEFAULT_TOLERANCE.get(str(dtype).removeprefix("torch."), max(DEFAULT_TOLERANCE.values()))


class SyncProbe:
    """Checks that ``engine`` serves ``trainer``'s current adapters, agent by agent.

    Args:
        engine: the rollout engine, just synced.
        trainer: the policy the update trains (its log-probs are the reference).
        agents: whose adapters to probe.
        tokenizer: the run's tokenizer (turns ``PROBE_TEXT`` into the probe's tokens).
        tolerance: the largest max-abs log-prob gap a fresh sync may show.
        dtype: the model's dtype, named in the error (the tolerance depends on it).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        trainer: TrainablePolicy,
        agents: Sequence[str],
        tokenizer: Any,
        tolerance: float,
        dtype: str,
    ) -> None:
        self.engine, self.trainer, self.agents = engine, trainer, list(agents)
        self.prompt, self.completion = probe_tokens(tokenizer)
        self.tolerance, self.dtype = tolerance, dtype

    def gaps(self) -> dict[str, float]:
        """Per agent, the largest |engine - trainer| log-prob over the probe's tokens
        (temperature 1)."""
        out = {}
        for agent in self.agents:
            sampled = self.engine.logprobs_of(agent, [self.prompt], [self.completion])[0]
            with torch.no_grad():
                trained = self.trainer.completion_logprobs(agent, [self.prompt], [self.completion])
            want = trained.logprobs[0, : len(self.completion)].detach().cpu().double()
            out[agent] = float((torch.tensor(sampled, dtype=torch.float64) - want).abs().max())
        return out

    def check(self, step: int) -> dict[str, float]:
        """Probe every agent after the sync that serves step ``step``'s rollout; returns the
        gaps and the probe's wall time as metrics (``sync/<agent>/probe_gap``,
        ``sync/probe_s``). Raises ``StaleAdapterError`` on the first agent over the
        tolerance."""
        start = time.monotonic()
        gaps = self.gaps()
        for agent, gap in gaps.items():
            if not gap <= self.tolerance:  # NaN is stale too
                raise StaleAdapterError(
                    f"stale adapter for agent {agent!r} on the {self.engine.describe(agent)}: "
                    f"before step {step}'s rollout its log-probs of the probe text are "
                    f"{gap:.3g} apart from the trainer's (tolerance {self.tolerance:g} in "
                    f"{self.dtype}), so it does not sample the weights just trained; check "
                    f"that engine's sync (docs/engines.md, 'The sync probe'), or raise "
                    f"rollout.sync_tolerance if its kernels differ from the trainer's by more"
                )
        metrics = {f"sync/{agent}/probe_gap": gap for agent, gap in gaps.items()}
        return {**metrics, "sync/probe_s": time.monotonic() - start}
