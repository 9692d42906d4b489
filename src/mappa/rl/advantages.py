"""Advantage estimators, registered by name (the style of verl's ``register_adv_est``).

An estimator is a pure function ``(token_rewards, mask, groups, cfg) -> (advantages,
returns)``. ``token_rewards`` already holds the per-token KL penalty and each action's
reward on its last token; ``groups`` says which rows share a task (for group baselines),
which rows are whitened together (the normalization scope), and each row's scalar reward
and episode outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mappa.rl.core import grouped_whiten, last_token_index, returns_to_go
from mappa.rl.registry import Registry


@dataclass(frozen=True)
class Groups:
    """Per-row (per-action) side information, all shaped ``(B,)``.

    Attributes:
        prompt: id of the row's group for group baselines (same task, agent and turn).
        scope: id of the row's whitening scope (agent / global / agent x task type).
        rewards: the scalar reward already placed on the row's last token.
        outcomes: the row's episode outcome (1 correct, 0 not) for ``outcome_only``.
    """

    prompt: torch.Tensor
    scope: torch.Tensor
    rewards: torch.Tensor
    outcomes: torch.Tensor


@dataclass(frozen=True)
class EstimatorConfig:
    gamma: float = 1.0
    eps: float = 1e-6


Estimator = Callable[
    [torch.Tensor, torch.Tensor, Groups, EstimatorConfig], tuple[torch.Tensor, torch.Tensor]
]
ADVANTAGE_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")
register_estimator = ADVANTAGE_ESTIMATORS.register
get_estimator = ADVANTAGE_ESTIMATORS.lookup


@register_estimator("reinforce_pp")
def reinforce_pp(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Groups, cfg: EstimatorConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: return-to-go, then whitened over every unmasked token of each scope.

    MAPPA whitens per agent over that agent's whole batch, not per prompt group (there is
    no group: downstream agents' inputs differ from episode to episode).
    """
    returns = returns_to_go(token_rewards, mask, cfg.gamma)
    return grouped_whiten(returns, mask, groups.scope), returns


@register_estimator("outcome_only")
def outcome_only(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Groups, cfg: EstimatorConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sparse baseline: each action's reward replaced by its episode's outcome.

    Every action of every agent gets the final agent's correctness (the KL part of the token
    rewards stays), then REINFORCE++ returns and whitening as usual.
    """
    last = last_token_index(mask)[:, None]
    swap = (groups.outcomes - groups.rewards)[:, None].to(token_rewards.dtype)
    return reinforce_pp(token_rewards.scatter_add(1, last, swap), mask, groups, cfg)


def _broadcast(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values[:, None].to(mask.dtype) * mask


@register_estimator("grpo")
def grpo(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Groups, cfg: EstimatorConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: (R - group mean) / (group std + eps) on every token; KL not in the reward.

    Groups are rows of the same task, agent and turn. A group of one has std 0 and gets
    advantage 0. Kept to reproduce the comparison MAPPA argues against.
    """
    adv = torch.zeros_like(groups.rewards, dtype=token_rewards.dtype)
    for g in torch.unique(groups.prompt):
        rows = groups.prompt == g
        r = groups.rewards[rows].to(adv.dtype)
        std = r.std() if r.numel() > 1 else torch.zeros((), dtype=adv.dtype)
        adv[rows] = (r - r.mean()) / (std + cfg.eps)
    return _broadcast(adv, mask), _broadcast(groups.rewards, mask)


@register_estimator("rloo")
def rloo(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Groups, cfg: EstimatorConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out: R_i minus the mean reward of the other rows of its group."""
    adv = torch.zeros_like(groups.rewards, dtype=token_rewards.dtype)
    for g in torch.unique(groups.prompt):
        rows = groups.prompt == g
        r = groups.rewards[rows].to(adv.dtype)
        k = r.numel()
        adv[rows] = (r - (r.sum() - r) / (k - 1)) if k > 1 else torch.zeros_like(r)
    return _broadcast(adv, mask), _broadcast(groups.rewards, mask)
