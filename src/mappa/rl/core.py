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


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """(x - mean) / max(std, eps) over unmasked entries (unbiased std); masked entries are 0.

    ``eps`` is the floor of the divisor (``rl.whiten_eps``): a spread below it is scaled by
    1/eps, never blown up to unit size. With fewer than two tokens there is no spread to
    measure: the result is only centered (0 for one token).

    >>> masked_whiten(torch.tensor([[1.0, 3.0]]), torch.ones(1, 2)).tolist()  # std sqrt(2)
    [[-0.7071067690849304, 0.7071067690849304]]
    >>> masked_whiten(torch.tensor([[1.0, 1.00001]]), torch.ones(1, 2), eps=1e-4).abs().max() < 0.1
    tensor(True)
    """
    n = mask.sum()
    mean = masked_mean(x, mask)
    centered = (x - mean) * mask
    if n < 2:
        return centered
    std = ((centered**2).sum() / (n - 1)).sqrt()
    return centered / torch.clamp(std, min=eps)


SPREAD_TOLERANCE = 1e-6
"""Slack on ``min_spread``: rewards are float32, whose rounding (e.g. 0.35 - 0.3 stored as
0.0499999...) must not decide whether a half-point difference of scores counts."""


def group_spread(
    ids: torch.Tensor, values: torch.Tensor, live: torch.Tensor, min_spread: float = 0.0
) -> torch.Tensor:
    """Per row (``(B,)`` bool): do the row's group's ``values`` spread (max - min) by at
    least ``min_spread`` (``rl.min_reward_spread``; 0: any two different values)?

    Only ``live`` rows count (rows with at least one token in the loss); a row that is not
    live is never marked. ``ids`` are the rows' group ids, ``values`` their scalars.

    >>> ids, live = torch.tensor([0, 0, 1, 1]), torch.ones(4, dtype=torch.bool)
    >>> group_spread(ids, torch.tensor([0.5, 0.5, 0.2, 0.9]), live).tolist()
    [False, False, True, True]
    >>> group_spread(ids, torch.tensor([0.5, 0.501, 0.2, 0.9]), live, 0.05).tolist()
    [False, False, True, True]
    """
    out = torch.zeros_like(live, dtype=torch.bool)
    for g in torch.unique(ids):
        rows = (ids == g) & live
        vals = values[rows]
        if vals.numel() < 2:
            continue
        spread = float(vals.max() - vals.min())
        if spread > 0 and spread >= min_spread - SPREAD_TOLERANCE:
            out[rows] = True
    return out


def grouped_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    groups: torch.Tensor,
    eps: float = 1e-4,
    divide: torch.Tensor | None = None,
) -> torch.Tensor:
    """``masked_whiten`` separately within each group of rows (``groups``: (B,) ids).

    ``divide`` ((B,) bool): a group none of whose rows is marked is only centered, not
    divided by its std (a scope without reward signal, ``group_spread``; docs/algorithm.md
    §4).
    """
    out = torch.zeros_like(x)
    for g in torch.unique(groups):
        rows = groups == g
        if divide is None or bool(divide[rows].any()):
            out[rows] = masked_whiten(x[rows], mask[rows], eps)
        else:
            out[rows] = (x[rows] - masked_mean(x[rows], mask[rows])) * mask[rows]
    return out
