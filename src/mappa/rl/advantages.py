"""Advantage estimators, registered by name (the style of verl's ``register_adv_est``).

An estimator is a pure function ``(token_rewards, mask, gamma) -> (advantages, returns)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mappa.rl.core import masked_whiten, returns_to_go

Estimator = Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    def deco(fn: Estimator) -> Estimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"estimator {name!r} registered twice")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return deco


def get_estimator(name: str) -> Estimator:
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; have {sorted(ADVANTAGE_ESTIMATORS)}") from None


@register_estimator("reinforce_pp")
def reinforce_pp(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: return-to-go, then whitened over every unmasked token of the batch.

    The batch is whatever the caller passes: MAPPA whitens per agent over that agent's
    whole batch, not per prompt group (there is no group: downstream inputs differ).
    """
    returns = returns_to_go(token_rewards, mask, gamma)
    return masked_whiten(returns, mask), returns
