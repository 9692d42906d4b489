"""A training step's update with the trainers on Ray: ``mappa.rl.update.run_update`` with
each agent's optimizer step run on its trainer actor, all agents at once.

The experience is made here, in the driver, by the same ``make_experience`` over the whole
batch (the old and reference log-probs come from the trainers through ``RemotePolicies``),
so advantages are whitened over exactly the scope a single process whitens over; the
metrics are ``run_update``'s, computed the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mappa.cluster.remote import RemotePolicies
from mappa.config import RunConfig
from mappa.records import Episode
from mappa.rl.experience import shuffle_seed
from mappa.rl.kl import KLController
from mappa.rl.schedule import set_step_lr
from mappa.rl.update import run_update


def remote_update(
    trainers: RemotePolicies,
    cfg: RunConfig,
    episodes: Sequence[Episode],
    step: int,
    kl_ctl: KLController,
    recompute_old: bool,
) -> dict[str, Any]:
    """The update of training step ``step``: ``lr`` and ``run_update``'s metrics, with every
    agent's optimizer step on its trainer (``RemotePolicies.policy_steps``)."""
    rl, temperature = cfg.rl, cfg.rollout.temperature
    out: dict[str, Any] = {"lr": set_step_lr([], rl, step, cfg.train.steps)}
    out.update(
        run_update(
            trainers,
            episodes,
            rl,
            kl_ctl,
            lambda exp: trainers.policy_steps(
                exp, rl, kl_ctl.beta, temperature, step, cfg.train.steps
            ),
            exclude_flagged=cfg.coach.exclude_flagged,
            temperature=temperature,
            recompute_old=recompute_old,
            seed=shuffle_seed(cfg.seed, step),
        )
    )
    return out
