"""The token layout and forward-pass helpers every local model path shares (the trainer's
log-probs, the hf engine's sampling, the local coach's scorer): left padding with position
ids, the KV cache argument of a transformers forward, and log-probs projected onto the
vocabulary a chunk at a time.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def left_pad(
    seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad token lists: (ids, attention mask, position ids), rows ending at the last column.

    Generation, training log-probs and the local coach all use this one layout, so a token's
    position ids (and hence its log-prob) are the same wherever it is computed.
    """
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        if s:
            ids[row, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[row, width - len(s) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device)


LOGPROB_CHUNK_TOKENS = 512
"""Completion tokens projected onto the vocabulary at once in ``completion_logprobs``: peak
memory holds a few ``chunk x V`` float32 tensors (about 0.3 GB each for a 152k vocabulary)
instead of ``B x T_c x V``."""


def _chunk_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    softcap: float | None,
    entropy_out: list[torch.Tensor] | None,
) -> torch.Tensor:
    """Log-prob of ``targets`` (N,) given final hidden states (N, H); the entropy of each
    distribution goes to ``entropy_out`` (no grad: it is only a statistic). Under a
    checkpoint this runs again in the backward pass, which must not append a second entropy.
    """
    logits = head(hidden)
    if softcap is not None:  # Gemma-2 style final-logit soft-capping, as the model's forward
        logits = torch.tanh(logits / softcap) * softcap
    dist = F.log_softmax(logits.float() / temperature, dim=-1)
    if entropy_out is not None and not entropy_out:
        with torch.no_grad():
            entropy_out.append(-(dist.exp() * dist).sum(-1))
    return dist.gather(-1, targets[:, None]).squeeze(-1)


def token_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = LOGPROB_CHUNK_TOKENS,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (N,) and entropies of ``head(hidden)``, ``chunk_tokens`` rows at a time.

    The vocabulary-sized tensors exist for one chunk only: with grad enabled each chunk is
    checkpointed, so the backward pass recomputes that chunk's logits instead of keeping
    them, and the log-probs stay differentiable w.r.t. ``hidden`` (and the head's weights).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    grad = torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in head.parameters())
    )
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, t = hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens]
        out: list[torch.Tensor] | None = [] if with_entropy else None
        args = (head, h, t, temperature, softcap, out)
        lp = (
            checkpoint(_chunk_logprobs, *args, use_reentrant=False)
            if grad
            else _chunk_logprobs(*args)
        )
        logps.append(lp)
        if out:
            entropies.append(out[0])
    empty = hidden.new_zeros(0, dtype=torch.float32)
    logp = torch.cat(logps) if logps else empty
    entropy = (torch.cat(entropies) if entropies else empty) if with_entropy else None
    return logp, entropy


@functools.cache
def _cache_name() -> str:
    """The KV cache's name in a forward's arguments and outputs: ``cache`` in newer
    transformers (5.24), ``past_key_values`` in older ones (5.19, which the vllm extra pins)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    fields = CausalLMOutputWithPast.__dataclass_fields__
    return "cache" if "cache" in fields else "past_key_values"


def kv_cache(out: Any) -> Any:
    """The KV cache a forward with ``use_cache=True`` returned (any transformers 5)."""
    return getattr(out, _cache_name())


def with_cache(cache: Any) -> dict[str, Any]:
    """``cache`` as a forward's keyword argument: ``model(..., **with_cache(cache))``."""
    return {_cache_name(): cache}
