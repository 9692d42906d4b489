"""Token-level reward shaping, returns and masked statistics. Pure tensor math, no I/O.

Shapes: ``(B, T)`` with ``B`` actions and ``T`` the longest completion; ``mask`` is 1 on
completion tokens that count and 0 on padding (and on masked-out truncated completions).
"""

from __future__ import annotations

import torch


def kl_estimate(logp: torch.Tensor, logp_ref: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled token's log-probs.

    With d = log pi - log pi_ref (Schulman's estimators):
    k1 = d (unbiased, can be negative; MAPPA's reference code), k2 = d^2 / 2 (biased, low
    variance), k3 = exp(-d) - 1 + d (unbiased and non-negative).
    """
    d = logp - logp_ref
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d**2
    if estimator == "k3":
        return torch.expm1(-d) + d
    raise ValueError(f"unknown KL estimator {estimator!r}; have k1, k2, k3")


class KLController:
    """The KL coefficient beta: fixed, or adapted toward a target KL (Ziegler et al. 2019).

    Adaptive update after each step: beta *= 1 + clip((kl - target) / target, -0.2, 0.2) * n / horizon,
    with ``n`` the tokens of the step, so beta grows when the policy drifts too far.
    """

    def __init__(self, beta: float, target: float | None = None, horizon: int = 10_000) -> None:
        self.beta = beta
        self.target = target
        self.horizon = horizon

    def update(self, observed_kl: float, n_tokens: int) -> float:
        if self.target is not None:
            error = max(-0.2, min(0.2, (observed_kl - self.target) / self.target))
            self.beta *= 1.0 + error * n_tokens / self.horizon
        return self.beta


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last unmasked token of each row (0 for an all-masked row)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return (positions * (mask > 0)).max(dim=1).values


def token_rewards(
    rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """r_t = -beta * kl_t on every token, plus the action's reward R on its last token.

    ``mask`` here marks all real completion tokens (not padding) so that R lands on the
    true last token even for completions later masked out of the loss.
    """
    r = -beta * kl * mask
    last = last_token_index(mask)
    return r.scatter_add(1, last[:, None], rewards[:, None].to(r.dtype))


def returns_to_go(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """G_t = sum_{s >= t} gamma^(s-t) r_s within each row (padding contributes nothing)."""
    r = token_rewards * mask
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        running = r[:, t] + gamma * running
        out[:, t] = running
    return out * mask


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over entries where ``mask`` is 1 (0 for an empty mask)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over unmasked entries (unbiased std); masked entries become 0.

    With fewer than two tokens, or all values equal, there is no scale to divide by: the
    result is only centered (finite, and zero where all values are equal). Any two distinct
    values are whitened, however close: the std is computed on values rescaled by their
    largest deviation so it never underflows to 0 (mean 0 and std 1 hold exactly then).
    """
    n = mask.sum()
    mean = masked_mean(x, mask)
    centered = (x - mean) * mask
    scale = centered.abs().max()
    if n < 2 or scale == 0:
        return centered
    std = scale * (((centered / scale) ** 2).sum() / (n - 1)).sqrt()
    return centered / std


def grouped_whiten(x: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``masked_whiten`` separately within each group of rows (``groups``: (B,) ids)."""
    out = torch.zeros_like(x)
    for g in torch.unique(groups):
        rows = groups == g
        out[rows] = masked_whiten(x[rows], mask[rows])
    return out
