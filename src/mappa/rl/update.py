"""An agent's optimizer steps on a rollout batch, and the whole update of a training step.

``update_agents`` is what the training loop calls after the coach scored a step's episodes:
it makes the experience (``mappa.rl.experience``: padded batch, each agent's mini-batches,
old log-probs from a pass before any step where they are needed, reference log-probs, KL,
advantages over the whole batch), runs ``policy_step`` for each agent on its rows (one
optimizer step per mini-batch, ``rl.mini_batch_size``), and adapts the KL coefficient. The
model is reached only through ``TrainablePolicy``.

An agent none of whose actions carries reward signal (every scalar reward it is compared
with is equal, or every completion is masked out) takes no optimizer step at all: Adam
normalizes the step, so a gradient of 1e-9 (the KL term's noise) would move the weights as
far as a gradient of 1. The skip is logged as ``rl/<agent>/skipped``.

Numerical guard: an agent whose loss or gradient is not finite (NaN/inf) takes no optimizer
step either (its gradients are dropped, Adam's moments are untouched), with ``skipped`` =
``NON_FINITE``; the run goes on. ``NonFiniteGuard`` stops it after ``K`` such steps in a row
for one agent (``train.max_nonfinite_steps``): by then the adapter itself is usually broken.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from mappa.config import RLConfig
from mappa.models.interface import TrainablePolicy
from mappa.models.memory import release_cuda_cache, trim_heap
from mappa.records import Episode
from mappa.rl.experience import (
    Experience,
    SamplerGap,
    action_logprobs,
    check_group_sizes,
    fit_width,
    make_experience,
    scored_actions,
    tis_weights,
)
from mappa.rl.kl import KLController
from mappa.rl.loss import LossConfig, policy_loss

NON_FINITE = "non-finite loss/grad"
"""``rl/<agent>/skipped`` of a step whose loss or gradient norm was NaN or inf."""


class NonFiniteError(RuntimeError):
    """Too many non-finite updates in a row for one agent: the run stops."""


class NonFiniteGuard:
    """Counts each agent's non-finite updates in a row; raises ``NonFiniteError`` at ``limit``.

    ``counts`` is part of a checkpoint, so a resumed run keeps counting where it stopped.
    """

    def __init__(self, agents: Sequence[str], limit: int) -> None:
        self.limit = limit
        self.counts = dict.fromkeys(agents, 0)

    def check(self, step: int, metrics: Mapping[str, Any]) -> None:
        for agent in self.counts:
            bad = metrics.get(f"rl/{agent}/skipped") == NON_FINITE
            self.counts[agent] = self.counts[agent] + 1 if bad else 0
            if self.counts[agent] >= self.limit:
                raise NonFiniteError(
                    f"agent {agent!r}: non-finite loss or gradient in {self.counts[agent]} "
                    f"steps in a row (up to step {step}); stopping. Lower rl.lr, check "
                    "rl.grad_clip and the model dtype (model.dtype=float32 or bfloat16, not "
                    "float16), or raise train.max_nonfinite_steps."
                )


@dataclass
class StepStats:
    """One optimizer step (one mini-batch) of an agent's update."""

    tokens: int
    loss: float
    clip_frac: float
    approx_kl: float
    grad_norm: float
    finite: bool


@dataclass
class UpdateStats:
    """What one agent's update did (logged per step as ``rl/<agent>/<field>``): ``steps``
    optimizer steps taken; ``loss`` and ``grad_norm`` averaged over its mini-batches;
    ``clip_frac``, ``approx_kl`` and ``entropy`` token-weighted over all of them."""

    actions: int
    tokens: int
    loss: float = 0.0
    mean_reward: float = 0.0
    mean_kl: float | None = None  # None: the run applies no KL, so none was measured
    clip_frac: float = 0.0
    approx_kl: float = 0.0
    entropy: float = 0.0
    grad_norm: float = 0.0
    steps: int = 0
    skipped: str = ""
    # not logged per agent: measured in the update's own forward where the old log-probs
    # come from it, merged into the step's rl/logprob_gap_* keys; and each step's numbers
    gap: SamplerGap = field(default_factory=SamplerGap)
    per_step: list[StepStats] = field(default_factory=list)

    def logged(self) -> dict[str, Any]:
        """The ``rl/<agent>/<field>`` values."""
        hidden = ("gap", "per_step")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in hidden}


def policy_step(
    policy: TrainablePolicy,
    agent: str,
    exp: Experience,
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.nn.Parameter],
    cfg: RLConfig,
    beta: float,
    temperature: float = 1.0,
) -> UpdateStats:
    """``agent``'s optimizer steps over its rows of ``exp``: one per mini-batch of its
    layout (``exp.layout[agent]``), gradients accumulated over the mini-batch's
    micro-batches.

    PPO-clip loss on a mini-batch's unmasked tokens (aggregated over the whole mini-batch, so
    micro-batches add up to one loss), ratio against the old log-probs: the pass's from
    before the first step, or where ``exp.old`` is ``None`` (a single step) this forward's
    own, detached: the weights have not moved yet, so the ratio is 1 and the gradient the
    policy gradient. ``Experience.check_own_forward`` refuses any further step on own-forward
    old log-probs (``StaleOldLogprobsError``). Truncated importance weights, grad-norm
    clipping. No step at all (``skipped`` says why) when the agent has no action, every
    completion is masked out, or no action carries reward signal; a mini-batch without a
    trained token or a signal takes no step either, and one whose loss or gradient is not
    finite drops its step (``skipped`` = ``NON_FINITE``). ``mean_kl`` is read from
    ``exp.kl``, computed once. After the steps the C heap is trimmed and torch's CUDA cache
    emptied (``mappa.models.memory``), so a run's peak memory does not grow with its agents
    and an engine that wakes next finds the card's free memory.
    """
    rows = exp.rows(agent)
    if not rows:
        return UpdateStats(0, 0, skipped="no actions")
    n_tokens = int(exp.loss_mask[rows].sum())
    base = UpdateStats(
        len(rows), n_tokens, mean_reward=float(exp.groups.rewards[rows].mean()),
        mean_kl=exp.mean_kl(rows),
    )  # fmt: skip
    if n_tokens == 0:
        base.skipped = "every completion truncated (masked)"
        return base
    if not bool(exp.signal[rows].any()):
        base.skipped = (
            "no reward signal (the rewards it is compared with spread less than "
            "rl.min_reward_spread)"
        )
        return base
    loss_cfg = LossConfig(
        cfg.clip_eps_low,
        cfg.clip_eps_high,
        cfg.loss_agg,
        kl_beta_in_loss=beta if cfg.kl_in_loss else 0.0,
        kl_estimator=cfg.kl_estimator,
    )
    entropy = 0.0
    for mini in exp.layout[agent]:
        flat = [i for micro in mini for i in micro]
        if exp.loss_mask[flat].sum() == 0 or not bool(exp.signal[flat].any()):
            continue  # nothing to train on, or only noise (Adam would scale it up)
        exp.check_own_forward(agent)
        stats, ent = _mini_batch_step(
            policy, agent, exp, mini, optimizer, params, cfg, loss_cfg, temperature, base.gap
        )
        exp.stepped.add(agent)
        base.per_step.append(stats)
        entropy += ent * stats.tokens
    trim_heap()  # the next agent's activations get fresh pages, not a grown heap
    release_cuda_cache()  # an engine waking next on this card needs what torch caches
    steps = base.per_step
    trained = sum(s.tokens for s in steps)
    base.steps = sum(s.finite for s in steps)
    base.loss = sum(s.loss for s in steps) / max(len(steps), 1)
    base.grad_norm = sum(s.grad_norm for s in steps) / max(len(steps), 1)
    base.clip_frac = sum(s.clip_frac * s.tokens for s in steps) / max(trained, 1)
    base.approx_kl = sum(s.approx_kl * s.tokens for s in steps) / max(trained, 1)
    base.entropy = entropy / max(trained, 1)
    base.skipped = "" if all(s.finite for s in steps) else NON_FINITE
    return base


def _mini_batch_step(
    policy: TrainablePolicy,
    agent: str,
    exp: Experience,
    mini: Sequence[list[int]],
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.nn.Parameter],
    cfg: RLConfig,
    loss_cfg: LossConfig,
    temperature: float,
    gap: SamplerGap,
) -> tuple[StepStats, float]:
    """One optimizer step over the micro-batches ``mini``: (its stats, its token-mean
    entropy). A non-finite loss or gradient drops the step (Adam's moments stay finite)."""
    flat = [i for micro in mini for i in micro]
    mask_all = exp.loss_mask[flat]
    n_tokens = int(mask_all.sum())
    normalizer = (
        float(n_tokens) if cfg.loss_agg == "token_mean" else float((mask_all.sum(-1) > 0).sum())
    )
    width = exp.sample.shape[1]
    optimizer.zero_grad(set_to_none=True)
    totals = {"loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "entropy": 0.0}
    for idx in mini:
        m = exp.loss_mask[idx]
        if m.sum() == 0:
            continue
        chunk = [exp.actions[i] for i in idx]
        out = action_logprobs(policy, agent, chunk, temperature, with_entropy=True)
        logp = fit_width(out.logprobs, width)
        dev = logp.device
        old, weights = _old_and_weights(exp, idx, logp.detach(), m.to(dev), cfg.tis_cap, gap)
        loss, measured = policy_loss(
            logp,
            old,
            exp.advantages[idx].to(dev),
            m.to(dev),
            loss_cfg,
            normalizer=normalizer,
            logp_ref=None if exp.ref is None else exp.ref[idx].to(dev),
            entropy=None if out.entropy is None else fit_width(out.entropy.detach(), width),
            is_weights=weights,
        )
        torch.autograd.backward(loss)  # = loss.backward(), whose signature is unannotated
        share = float(m.sum()) / n_tokens  # token-weighted averages of the statistics
        totals["loss"] += float(loss.detach())
        for key in ("clip_frac", "approx_kl", "entropy"):
            totals[key] += measured.get(key, 0.0) * share
    grad_norm = torch.nn.utils.clip_grad_norm_(list(params), cfg.grad_clip)
    finite = math.isfinite(float(grad_norm)) and math.isfinite(totals["loss"])
    if finite:  # else drop the gradients: no Adam step, so its moments stay finite
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    stats = StepStats(
        tokens=n_tokens,
        loss=totals["loss"],
        clip_frac=totals["clip_frac"],
        approx_kl=totals["approx_kl"],
        grad_norm=float(grad_norm),
        finite=finite,
    )
    return stats, totals["entropy"]


def _old_and_weights(
    exp: Experience,
    idx: list[int],
    logp: torch.Tensor,
    mask: torch.Tensor,
    cap: float | None,
    gap: SamplerGap,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A micro-batch's old log-probs and importance weights: the experience's, or, where it
    has no old log-probs, this forward's own ``logp`` (detached), weighed against the
    sampling log-probs on ``mask`` and added to ``gap``."""
    dev = logp.device
    if exp.old is not None:
        return exp.old[idx].to(dev), None if exp.is_weights is None else exp.is_weights[idx].to(dev)
    sample = exp.sample[idx].to(dev)
    gap.add(logp, sample, mask, cap)
    return logp, None if cap is None else tis_weights(logp, sample, mask, cap)


AgentSteps = Callable[[Experience], Mapping[str, UpdateStats]]
"""Takes each agent's optimizer step on its rows of the experience; returns the stats by
agent. ``update_agents`` steps them here, one after another; ``mappa.cluster`` on each
agent's trainer actor."""


def run_update(
    policy: TrainablePolicy,
    episodes: Sequence[Episode],
    cfg: RLConfig,
    kl_ctl: KLController,
    step_agents: AgentSteps,
    *,
    exclude_flagged: bool,
    temperature: float,
    recompute_old: bool = False,
    seed: str = "",
) -> dict[str, Any]:
    """Advantages over the whole batch, the agents' steps (``step_agents``), then adapt beta.

    ``recompute_old`` forces the old log-probs' pass before any step
    (``rl.recompute_old_logprobs: always``; ``make_experience`` makes it anyway where they
    are needed). ``seed`` seeds the mini-batch shuffle: the run's seed and the step.

    Returns the step's metrics: ``kl_beta`` (the beta used), ``trained_actions``,
    ``rl/<agent>/<stat>`` for every ``UpdateStats`` field, ``mean_kl`` over all real
    completion tokens (``None`` when no action was scored or the run applies no KL),
    ``rl/logprob_gap_max`` and ``rl/logprob_gap_mean`` (|trainer - sampling| log-probs: the
    recomputed old ones over every completion token where the pass ran, else the update's
    own over the tokens it trained on), ``rl/tis_capped_frac`` (with
    ``rl.tis_cap``) and the estimator's
    degenerate-case counts (``rl/unwhitened_scopes``; ``rl/flat_groups``,
    ``rl/singleton_groups``).

    Raises ``ValueError`` for ``grpo``/``rloo`` when a task was sampled only once.
    """
    check_group_sizes(episodes, cfg.advantage)
    items = scored_actions(episodes, exclude_flagged, needs_score=cfg.needs_coach)
    out: dict[str, Any] = {"kl_beta": kl_ctl.beta, "trained_actions": len(items)}
    if not items:
        out["mean_kl"] = None
        return out
    exp = make_experience(policy, items, cfg, kl_ctl.beta, temperature, recompute_old, seed)
    gap = exp.sampler_gap(cfg.tis_cap)
    for name, stats in step_agents(exp).items():
        out.update({f"rl/{name}/{k}": v for k, v in stats.logged().items()})
        gap = gap.merge(stats.gap)
    out["mean_kl"] = exp.mean_kl()
    out.update(gap.metrics(cfg.tis_cap))
    out.update({f"rl/{k}": v for k, v in exp.counts.items()})
    if out["mean_kl"] is not None:
        kl_ctl.update(out["mean_kl"], int(exp.valid.sum()))
    return out


def update_agents(
    policy: TrainablePolicy,
    episodes: Sequence[Episode],
    agents: Sequence[str],
    optimizers: Mapping[str, torch.optim.Optimizer],
    params: Mapping[str, Sequence[torch.nn.Parameter]],
    cfg: RLConfig,
    kl_ctl: KLController,
    *,
    exclude_flagged: bool,
    temperature: float,
    recompute_old: bool = False,
    seed: str = "",
) -> dict[str, Any]:
    """``run_update`` with every agent's steps taken here, in ``agents`` order; arguments and
    metrics as there."""

    def step_here(exp: Experience) -> dict[str, UpdateStats]:
        return {
            name: policy_step(
                policy, name, exp, optimizers[name], params[name], cfg, kl_ctl.beta, temperature
            )
            for name in agents
        }

    return run_update(
        policy,
        episodes,
        cfg,
        kl_ctl,
        step_here,
        exclude_flagged=exclude_flagged,
        temperature=temperature,
        recompute_old=recompute_old,
        seed=seed,
    )
