"""REINFORCE++ as used by MAPPA: pure tensor functions plus the per-agent update step."""

from mappa.rl.advantages import ADVANTAGE_ESTIMATORS, get_estimator, register_estimator
from mappa.rl.core import masked_mean, masked_whiten, returns_to_go, token_rewards
from mappa.rl.kl import (
    DEFAULT_KL_ESTIMATOR,
    KL_ESTIMATORS,
    KLController,
    get_kl_estimator,
    kl_estimate,
    register_kl_estimator,
)
from mappa.rl.loss import policy_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DEFAULT_KL_ESTIMATOR",
    "KL_ESTIMATORS",
    "KLController",
    "get_estimator",
    "get_kl_estimator",
    "kl_estimate",
    "masked_mean",
    "masked_whiten",
    "policy_loss",
    "register_estimator",
    "register_kl_estimator",
    "returns_to_go",
    "token_rewards",
]
