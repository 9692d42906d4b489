"""REINFORCE++ as used by MAPPA: pure tensor functions plus the per-agent update step.

``kl`` (KL estimators, controller), ``core`` (token rewards, returns, whitening),
``advantages`` (estimators by name), ``loss`` (PPO-clip, truncated importance weights),
``rewards`` (action reward), ``experience`` (episodes -> padded batch with recomputed old
and reference log-probs, KL, advantages) and ``update`` (one optimizer step per agent, none
for an agent without reward signal; ``update_agents`` for a whole training step).
"""

from mappa.rl.advantages import ADVANTAGE_ESTIMATORS, get_estimator, register_estimator
from mappa.rl.core import masked_mean, masked_whiten, returns_to_go, token_rewards
from mappa.rl.experience import Experience, RolloutBatch, make_experience
from mappa.rl.kl import (
    DEFAULT_KL_ESTIMATOR,
    KL_ESTIMATORS,
    KLController,
    get_kl_estimator,
    kl_estimate,
    register_kl_estimator,
)
from mappa.rl.loss import policy_loss
from mappa.rl.update import UpdateStats, policy_step, update_agents

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DEFAULT_KL_ESTIMATOR",
    "KL_ESTIMATORS",
    "Experience",
    "KLController",
    "RolloutBatch",
    "UpdateStats",
    "get_estimator",
    "get_kl_estimator",
    "kl_estimate",
    "make_experience",
    "masked_mean",
    "masked_whiten",
    "policy_loss",
    "policy_step",
    "register_estimator",
    "register_kl_estimator",
    "returns_to_go",
    "token_rewards",
    "update_agents",
]
