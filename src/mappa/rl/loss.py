"""The PPO-clip policy loss (the style of OpenRLHF's ``loss.py``): pure tensor math."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mappa.rl.kl import DEFAULT_KL_ESTIMATOR, kl_estimate


@dataclass(frozen=True)
class LossConfig:
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    agg: str = "token_mean"  # or "seq_mean"
    kl_beta_in_loss: float = 0.0  # > 0 only when the KL penalty lives in the loss
    kl_estimator: str = DEFAULT_KL_ESTIMATOR  # "k1", the paper's


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, agg: str, normalizer: float | None
) -> torch.Tensor:
    """Token mean: sum / N_tokens. Sequence mean: mean of each row's token mean, / N_rows.

    ``normalizer`` overrides N (tokens or rows of the *whole* batch) so micro-batch losses add
    up to the batch loss.
    """
    if agg == "token_mean":
        n = float(mask.sum()) if normalizer is None else normalizer
        return (per_token * mask).sum() / max(n, 1.0)
    if agg == "seq_mean":
        rows = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        n = float((mask.sum(-1) > 0).sum()) if normalizer is None else normalizer
        return rows.sum() / max(n, 1.0)
    raise ValueError(f"unknown loss aggregation {agg!r}")


def policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig = LossConfig(),
    normalizer: float | None = None,
    logp_ref: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss and its statistics.

    per-token loss = w_t * max(-A_t * rho_t, -A_t * clip(rho_t, 1-eps_low, 1+eps_high))
    (+ beta * k(logp, logp_ref) when the KL lives in the loss), rho_t = exp(logp_t - logp_old_t),
    aggregated by ``cfg.agg`` over unmasked tokens. ``w_t`` are the truncated importance
    weights (``is_weights``, constants; 1 when ``None``); as in verl and OpenRLHF they scale
    the clipped policy term only, not the KL term.
    """
    ratio = torch.exp(logp - logp_old)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
    per_token = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    kl_term = None
    if cfg.kl_beta_in_loss > 0:
        if logp_ref is None:
            raise ValueError("KL in the loss needs the reference log-probs")
        kl_term = kl_estimate(logp, logp_ref, cfg.kl_estimator)
        per_token = per_token + cfg.kl_beta_in_loss * kl_term
    loss = aggregate(per_token, mask, cfg.agg, normalizer)
    with torch.no_grad():
        count = mask.sum().clamp(min=1)
        stats = {
            "clip_frac": float(((clipped > unclipped).float() * mask).sum() / count),
            "approx_kl": float((kl_estimate(logp, logp_old, "k2") * mask).sum() / count),
        }
        if kl_term is not None:
            stats["kl_in_loss"] = float((kl_term * mask).sum() / count)
        if entropy is not None:
            stats["entropy"] = float((entropy * mask).sum() / count)
    return loss, stats
