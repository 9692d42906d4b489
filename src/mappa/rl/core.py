"""Token-level reward shaping, returns and masked statistics. Pure tensor math, no I/O.

Shapes: ``(B, T)`` with ``B`` actions and ``T`` the longest completion; ``mask`` is 1 on
completion tokens that count and 0 on padding (and on masked-out truncated completions).
The KL estimators and the KL controller live in ``mappa.rl.kl``.
"""

from __future__ import annotations

import torch


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
