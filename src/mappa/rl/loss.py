"""The PPO-clip policy loss (the style of OpenRLHF's ``loss.py``): pure tensor math."""

from __future__ import annotations

import torch


def policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean PPO-clip loss and its statistics.

    loss = sum_t mask_t * max(-A_t * rho_t, -A_t * clip(rho_t, 1-eps, 1+eps)) / N with
    rho_t = exp(logp_t - logp_old_t). ``normalizer`` N defaults to ``mask.sum()``; pass the
    token count of the whole batch when accumulating micro-batches so the sum of their
    losses is the token mean over the batch.
    """
    ratio = torch.exp(logp - logp_old)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = torch.maximum(unclipped, clipped)
    n = float(mask.sum()) if normalizer is None else normalizer
    loss = (per_token * mask).sum() / max(n, 1.0)
    with torch.no_grad():
        count = mask.sum().clamp(min=1)
        stats = {
            "clip_frac": float(((clipped > unclipped).float() * mask).sum() / count),
            "approx_kl": float((0.5 * (logp - logp_old) ** 2 * mask).sum() / count),
        }
    return loss, stats
