"""Advantage estimators, registered by name (the style of verl's ``register_adv_est``).

An estimator is a pure function ``(token_rewards, mask, groups, cfg) -> Estimate``.
``token_rewards`` already holds the per-token KL penalty and each action's scalar reward on
its last token; ``groups`` says which rows share a task (for group baselines), which rows
are whitened together (the normalization scope), and each row's scalar reward and episode
outcome. Besides advantages and returns an estimator says which rows carry reward signal
(the update skips an agent none of whose rows does: docs/algorithm.md §4) and counts what
it left degenerate, for the log.

One rule for the KL coefficient in every estimator (docs/algorithm.md §3a): beta is in the
reward's own units, so whatever number an estimator divides the reward by (a scope's std,
a group's std) divides the KL penalty too, and a scope or group it does not divide keeps
both as they are. Multiplying every reward and beta (and the reward-unit thresholds
``min_spread`` and ``eps``) by one c > 0 then multiplies every advantage by one positive
number: the KL's weight against the reward does not depend on the estimator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from mappa.rl.core import group_spread, grouped_whiten, last_token_index, returns_to_go
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
    eps: float = 1e-4  # rl.whiten_eps: floor of every std divided by
    min_spread: float = 0.05  # rl.min_reward_spread: smallest reward spread that is signal


class Estimate(NamedTuple):
    """What an estimator returns.

    Attributes:
        advantages: ``(B, T)``, 0 on masked tokens.
        returns: ``(B, T)`` returns-to-go of the (shaped) token rewards.
        signal: ``(B,)`` bool: the scalar rewards the row is compared with (its whitening
            scope, or its task group) spread by at least ``min_spread``, and the row is
            trained.
        counts: degenerate cases, logged as ``rl/<key>`` (e.g. ``unwhitened_scopes``).
    """

    advantages: torch.Tensor
    returns: torch.Tensor
    signal: torch.Tensor
    counts: dict[str, int]


Estimator = Callable[[torch.Tensor, torch.Tensor, Groups, EstimatorConfig], Estimate]
ADVANTAGE_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")
register_estimator = ADVANTAGE_ESTIMATORS.register
get_estimator = ADVANTAGE_ESTIMATORS.lookup


def _live(mask: torch.Tensor) -> torch.Tensor:
    """Rows with at least one token in the loss."""
    return mask.sum(-1) > 0


def _swap_scalar(
    token_rewards: torch.Tensor, mask: torch.Tensor, old: torch.Tensor, new: torch.Tensor
) -> torch.Tensor:
    """Token rewards with each row's scalar ``old`` on its last token replaced by ``new``."""
    last = last_token_index(mask)[:, None]
    return token_rewards.scatter_add(1, last, (new - old)[:, None].to(token_rewards.dtype))


def _whitened(
    returns: torch.Tensor,
    mask: torch.Tensor,
    scope: torch.Tensor,
    scalars: torch.Tensor,
    cfg: EstimatorConfig,
) -> Estimate:
    """Whiten ``returns`` per scope; a scope whose ``scalars`` spread less than
    ``cfg.min_spread`` (all equal, at 0) is only centered."""
    live = _live(mask)
    signal = group_spread(scope, scalars, live, cfg.min_spread)
    flat = {int(g) for g in torch.unique(scope[live])} - {int(g) for g in scope[signal]}
    adv = grouped_whiten(returns, mask, scope, cfg.eps, divide=signal)
    return Estimate(adv, returns, signal, {"unwhitened_scopes": len(flat)})


@register_estimator("reinforce_pp")
def reinforce_pp(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Groups, cfg: EstimatorConfig
) -> Estimate:
    """REINFORCE++: return-to-go, then whitened over every unmasked token of each scope.

    MAPPA whitens per agent over that agent's whole batch, not per prompt group (there is
    no group: downstream agents' inputs differ from episode to episode). A scope whose
    scalar rewards spread less than ``cfg.min_spread`` (all equal, at 0) carries no signal
    and is only centered: dividing by its std would blow the KL term's noise, or a near-tie
    of expected coach scores, up to unit-size advantages. The whitened return holds the KL
    penalty, so reward and KL are divided by the same std (beta in reward units).
    """
    returns = returns_to_go(token_rewards, mask, cfg.gamma)
    return _whitened(returns, mask, groups.scope, groups.rewards, cfg)


@register_estimator("outcome_only")
def outcome_only(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Groups, cfg: EstimatorConfig
) -> Estimate:
    """The sparse baseline: each action's reward replaced by its episode's outcome.

    Every action of every agent gets the final agent's correctness (the KL part of the token
    rewards stays), then REINFORCE++ returns and whitening as usual; a scope whose outcomes
    are all equal (every episode wrong, say) carries no signal.
    """
    swapped = _swap_scalar(token_rewards, mask, groups.rewards, groups.outcomes)
    returns = returns_to_go(swapped, mask, cfg.gamma)
    return _whitened(returns, mask, groups.scope, groups.outcomes, cfg)


def _group_baselined(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    groups: Groups,
    cfg: EstimatorConfig,
    adjust: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
) -> Estimate:
    """OpenRLHF's shape for group baselines: the baseline-adjusted scalar replaces R on the
    last token, then return-to-go with gamma; no whitening. The per-token KL penalty stays
    and is divided by the same number as the reward (docs/algorithm.md §3a: beta is in
    reward units in every estimator).

    ``adjust`` maps a group's scalar rewards (two or more, spread by at least
    ``cfg.min_spread``) to (adjusted scalars, divisor): ``(R - baseline) / divisor`` and
    the divisor itself (1 for a plain baseline). A group of one, or one whose rewards
    spread less (all equal, at 0), gets exactly 0 and divisor 1, and carries no signal:
    GRPO would divide a near-tie by its tiny std. Every row of a group, trained or masked
    out, counts toward its baseline.
    """
    rewards = groups.rewards.to(token_rewards.dtype)
    everyone = torch.ones_like(rewards, dtype=torch.bool)
    signal = group_spread(groups.prompt, rewards, everyone, cfg.min_spread)
    adjusted = torch.zeros_like(rewards)
    divisor = torch.ones_like(rewards)
    singletons = flat = 0
    for g in torch.unique(groups.prompt):
        rows = groups.prompt == g
        r = rewards[rows]
        if r.numel() < 2:
            singletons += 1
        elif not bool(signal[rows].any()):
            flat += 1
        else:
            adjusted[rows], divisor[rows] = adjust(r)
    shaped = _swap_scalar(token_rewards, mask, rewards, adjusted)
    # The KL penalty (the token rewards less R) divided by the divisor too. Added as
    # penalty * (1/d - 1) so that without KL, or with d = 1 (rloo, flat and singleton
    # groups), the token rewards are bit for bit those before the rule.
    penalty = _swap_scalar(token_rewards, mask, rewards, torch.zeros_like(rewards))
    shaped = shaped + penalty * (1.0 / divisor - 1.0)[:, None]
    returns = returns_to_go(shaped, mask, cfg.gamma)
    counts = {"flat_groups": flat, "singleton_groups": singletons}
    return Estimate(returns, returns, signal & _live(mask), counts)


@register_estimator("grpo")
def grpo(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Groups, cfg: EstimatorConfig
) -> Estimate:
    """GRPO: (R - group mean) / max(group std, eps) on the last token, plus the KL penalty
    divided by the same max(group std, eps), so beta stays in reward units.

    Groups are rows of the same task, agent and turn. Kept to reproduce the comparison
    MAPPA argues against.
    """

    def adjust(r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        std = torch.clamp(r.std(), min=cfg.eps)
        return (r - r.mean()) / std, std.expand_as(r)

    return _group_baselined(token_rewards, mask, groups, cfg, adjust)


@register_estimator("rloo")
def rloo(
    token_rewards: torch.Tensor, mask: torch.Tensor, groups: Groups, cfg: EstimatorConfig
) -> Estimate:
    """REINFORCE leave-one-out: R_i minus the mean reward of the other rows of its group,
    on the last token, plus the KL penalty (nothing is divided: beta in reward units)."""

    def adjust(r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return r - (r.sum() - r) / (r.numel() - 1), torch.ones_like(r)

    return _group_baselined(token_rewards, mask, groups, cfg, adjust)
