"""The ``hf`` rollout engine (``rollout.engine: hf``): the trained model samples itself.

A peer of the vLLM engine (``vllm_engine.py``) behind ``RolloutEngine``, over the very
modules the update trains (``AgentPolicies``): nothing is published on ``sync`` and
nothing freed on ``release``; the "sync" that can go wrong here is the switch to the
agent's adapter before each batch, which the sync probe checks through ``logprobs_of``.
Generation is ``mappa.models.decoding.decode_batch``: the log-probability of every sampled
token is exactly that of the distribution it was drawn from.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from mappa.models.batching import token_batches
from mappa.models.decoding import decode_batch
from mappa.models.interface import Sample
from mappa.models.policies import AgentPolicies
from mappa.models.tensors import left_pad


class HfEngine:
    """Samples from ``policies``' own modules, with the adapter of the agent asked for."""

    name = "hf"
    shares_trainer = True
    """The rollout samples from the very modules the update trains: nothing to sync (a Ray
    engine actor says the same only for ``cluster.engines: trainer``)."""

    def __init__(self, policies: AgentPolicies) -> None:
        self.policies = policies

    def sync(self, source: object, step: int) -> None:
        """Nothing to publish: generation runs on the very modules the update trained."""
        if source is not self.policies:
            raise ValueError(
                "the hf engine samples from its trainer's own adapters; sync it with them"
            )

    def release(self) -> None:
        """Nothing to free: the engine is the trainer's own model."""

    def describe(self, agent: str) -> str:
        return "hf engine"

    @contextmanager
    def _weights(self, agent: str | None) -> Iterator[None]:
        """The weights ``generate`` samples ``agent`` from, active meanwhile: the trainer's
        modules with the agent's adapter switched on. ``logprobs_of`` takes the same path,
        so the sync probe sees what the rollout samples (a wrong or stale adapter here)."""
        with self.policies.use(agent):
            yield

    def close(self) -> None:
        """Nothing to release: the model belongs to the trainer."""

    @torch.no_grad()
    def logprobs_of(
        self,
        agent: str | None,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
    ) -> list[list[float]]:
        """The sampler's temperature-1 log-prob of each given completion token, through the
        very forward ``generate`` samples with (the sync probe compares it with the
        trainer's: ``mappa.models.sync_probe``)."""
        seqs = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
        ids, mask, positions = left_pad(
            seqs, self.policies.tokenizer.pad_token_id, self.policies.device
        )
        with self._weights(agent):
            logits = self.policies.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            ).logits
        logp = F.log_softmax(logits.float(), dim=-1)
        width = ids.shape[1]
        out = []
        for row, c in enumerate(completion_ids):
            # column j predicts column j + 1; the completion fills the last len(c) columns
            cols = torch.arange(width - len(c) - 1, width - 1, device=logp.device)
            targets = ids[row, width - len(c) :]
            out.append(logp[row, cols].gather(-1, targets[:, None]).squeeze(-1).tolist())
        return out

    @torch.no_grad()
    def generate(
        self,
        agent: str | None,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        batch_size: int = 8,
        greedy: bool = False,
    ) -> list[Sample]:
        """Sample one completion per prompt; returns the ids and their sampling log-probs.

        Prompts are batched by length (longest first), so a batch pads little; the samples
        come back in the order of ``prompts``.
        """
        out: dict[int, Sample] = {}
        with self._weights(agent):
            for rows in token_batches([len(p) for p in prompts], batch_size):
                batch = [prompts[r] for r in rows]
                samples = self._generate_batch(batch, max_new_tokens, temperature, greedy)
                out.update(zip(rows, samples, strict=True))
        return [out[i] for i in range(len(prompts))]

    def _generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float,
        greedy: bool,
    ) -> list[Sample]:
        """Sample a batch (``mappa.models.decoding.decode_batch``)."""
        tokens, logps = decode_batch(
            self.policies.model,
            prompts,
            self.policies.tokenizer.pad_token_id,
            self.policies.stop_ids,
            max_new_tokens,
            temperature,
            greedy,
        )
        return [
            Sample(list(p), seq, lp, truncated=not seq or seq[-1] not in self.policies.stop_ids)
            for p, seq, lp in zip(prompts, tokens, logps, strict=True)
        ]
