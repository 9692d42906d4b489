"""A training step's update with the trainers on Ray: ``mappa.rl.update.update_agents``
with each agent's optimizer step run on its trainer actor, all agents at once.

The experience is made here, in the driver, by the same ``make_experience`` over the whole
batch (the old and reference log-probs come from the trainers through ``RemotePolicies``),
so advantages are whitened over exactly the scope a single process whitens over; the
metrics are ``update_agents``' keys, computed the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from mappa.cluster.remote import RemotePolicies
from mappa.config import RunConfig
from mappa.rl.experience import check_group_sizes, make_experience, scored_actions
from mappa.rl.kl import KLController
from mappa.rl.schedule import set_step_lr
from mappa.workflow.records import Episode


def remote_update(
    trainers: RemotePolicies,
    cfg: RunConfig,
    episodes: Sequence[Episode],
    step: int,
    kl_ctl: KLController,
    recompute_old: bool,
) -> dict[str, Any]:
    """The update of training step ``step``: ``lr`` and ``update_agents``' metrics."""
    rl = cfg.rl
    out: dict[str, Any] = {"lr": set_step_lr([], rl, step, cfg.train.steps)}
    check_group_sizes(episodes, rl.advantage)
    items = scored_actions(episodes, cfg.coach.exclude_flagged, needs_score=rl.needs_coach)
    out.update(kl_beta=kl_ctl.beta, trained_actions=len(items))
    if not items:
        out["mean_kl"] = None
        return out
    temperature = cfg.rollout.temperature
    exp = make_experience(trainers, items, rl, kl_ctl.beta, temperature, recompute_old)
    stats = trainers.policy_steps(exp, rl, kl_ctl.beta, temperature, step, cfg.train.steps)
    for name in (a.name for a in cfg.agents):
        out.update({f"rl/{name}/{k}": v for k, v in asdict(stats[name]).items()})
    out["mean_kl"] = exp.mean_kl()
    if recompute_old:
        out["rl/logprob_gap_max"], out["rl/logprob_gap_mean"] = exp.logprob_gap()
    if exp.is_weights is not None:
        out["rl/tis_capped_frac"] = exp.tis_capped_frac()
    out.update({f"rl/{k}": v for k, v in exp.counts.items()})
    if out["mean_kl"] is not None:
        kl_ctl.update(out["mean_kl"], int(exp.valid.sum()))
    return out
