"""From scored episodes to one optimizer step per agent.

``build_batch`` turns actions into padded tensors and group ids; ``compute_advantages``
runs the chosen estimator over the whole batch at once, so the whitening scope can span one
agent, all agents, or (agent, task type); ``policy_step`` then updates one agent on its rows.
The model is reached only through ``TrainablePolicy``. Training tokens are exactly
``prompt_ids + completion_ids`` of each action as sampled; old log-probs are the sampling
log-probs.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from mappa.config import RLConfig
from mappa.models.interface import TrainablePolicy
from mappa.rl.advantages import EstimatorConfig, Groups, get_estimator
from mappa.rl.core import masked_mean, token_rewards
from mappa.rl.kl import kl_estimate
from mappa.rl.loss import LossConfig, policy_loss
from mappa.rl.rewards import mix_reward
from mappa.workflow.records import Action, Episode


@dataclass
class RolloutBatch:
    """Every trainable action of a step, padded to one width ``T``."""

    actions: list[Action]
    agents: list[str]
    old: torch.Tensor  # (B, T) sampling log-probs
    valid: torch.Tensor  # (B, T) 1 on real completion tokens
    loss_mask: torch.Tensor  # (B, T) valid minus masked-out truncated completions
    groups: Groups

    def rows(self, agent: str) -> list[int]:
        return [i for i, a in enumerate(self.agents) if a == agent]


@dataclass
class UpdateStats:
    """What one agent's update did (logged per step)."""

    actions: int
    tokens: int
    loss: float = 0.0
    mean_reward: float = 0.0
    mean_kl: float = 0.0
    clip_frac: float = 0.0
    approx_kl: float = 0.0
    entropy: float = 0.0
    grad_norm: float = 0.0
    skipped: str = ""


def _pad(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=torch.float32)
    return out


def _ids(keys: Sequence[Hashable]) -> torch.Tensor:
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)


def build_batch(items: Sequence[tuple[Episode, Action]], cfg: RLConfig) -> RolloutBatch:
    """Tensors and group ids for scored actions (``items``: (episode, action) pairs)."""
    if not items:
        raise ValueError("no scored actions to train on")
    actions = [a for _, a in items]
    width = max(len(a.completion_ids) for a in actions)
    lengths = torch.tensor([len(a.completion_ids) for a in actions])
    valid = (torch.arange(width)[None, :] < lengths[:, None]).float()
    keep = torch.tensor([0.0 if (cfg.mask_truncated and a.truncated) else 1.0 for a in actions])
    outcomes = [None if ep.correct is None else float(ep.correct) for ep, _ in items]
    rewards = [
        mix_reward(
            a.coach.value if a.coach else 0.0, o, cfg.w_process, cfg.w_outcome, cfg.reward_clip
        )
        for (_, a), o in zip(items, outcomes, strict=True)
    ]
    scope_key = {
        "agent": lambda ep, a: a.agent,
        "global": lambda ep, a: 0,
        "agent_tasktype": lambda ep, a: (a.agent, ep.task_type),
    }[cfg.norm_scope]
    groups = Groups(
        prompt=_ids([(ep.task_id, a.agent, a.turn) for ep, a in items]),
        scope=_ids([scope_key(ep, a) for ep, a in items]),
        rewards=torch.tensor(rewards, dtype=torch.float32),
        outcomes=torch.tensor([o or 0.0 for o in outcomes], dtype=torch.float32),
    )
    return RolloutBatch(
        actions=actions,
        agents=[a.agent for a in actions],
        old=_pad([a.sample_logprobs for a in actions], width),
        valid=valid,
        loss_mask=valid * keep[:, None],
        groups=groups,
    )


def _fit(x: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad a (B, T') tensor with zeros to (B, width)."""
    return x if x.shape[1] == width else torch.nn.functional.pad(x, (0, width - x.shape[1]))


@torch.no_grad()
def reference_logprobs(
    policy: TrainablePolicy,
    actions: Sequence[Action],
    width: int,
    micro_batch: int,
    temperature: float,
) -> torch.Tensor:
    """Log-probs of every completion under the frozen reference (adapters off)."""
    parts = []
    for i in range(0, len(actions), micro_batch):
        chunk = actions[i : i + micro_batch]
        out = policy.completion_logprobs(
            None, [a.prompt_ids for a in chunk], [a.completion_ids for a in chunk], temperature
        )
        parts.append(_fit(out.logprobs.cpu(), width))
    return torch.cat(parts)


def compute_advantages(
    batch: RolloutBatch, ref: torch.Tensor, cfg: RLConfig, beta: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(advantages, returns, kl): KL-shaped token rewards, then the configured estimator."""
    kl = kl_estimate(batch.old, ref, cfg.kl_estimator) * batch.valid
    reward_beta = 0.0 if cfg.kl_in_loss else beta
    r = token_rewards(batch.groups.rewards, kl, batch.valid, reward_beta)
    adv, returns = get_estimator(cfg.advantage)(
        r, batch.loss_mask, batch.groups, EstimatorConfig(cfg.gamma)
    )
    return adv, returns, kl


def policy_step(
    policy: TrainablePolicy,
    agent: str,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    ref: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.nn.Parameter],
    cfg: RLConfig,
    beta: float,
    temperature: float = 1.0,
) -> UpdateStats:
    """One optimizer step for ``agent`` over its rows of ``batch`` (micro-batched)."""
    rows = batch.rows(agent)
    if not rows:
        return UpdateStats(0, 0, skipped="no actions")
    mask = batch.loss_mask[rows]
    n_tokens = int(mask.sum())
    if n_tokens == 0:
        return UpdateStats(len(rows), 0, skipped="every completion truncated (masked)")
    normalizer = (
        float(n_tokens) if cfg.loss_agg == "token_mean" else float((mask.sum(-1) > 0).sum())
    )
    loss_cfg = LossConfig(
        cfg.clip_eps_low,
        cfg.clip_eps_high,
        cfg.loss_agg,
        kl_beta_in_loss=beta if cfg.kl_in_loss else 0.0,
        kl_estimator=cfg.kl_estimator,
    )
    width = batch.old.shape[1]
    optimizer.zero_grad(set_to_none=True)
    totals = {"loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "entropy": 0.0}
    for start in range(0, len(rows), cfg.micro_batch_size):
        idx = rows[start : start + cfg.micro_batch_size]
        m = batch.loss_mask[idx]
        if m.sum() == 0:
            continue
        chunk = [batch.actions[i] for i in idx]
        out = policy.completion_logprobs(
            agent,
            [a.prompt_ids for a in chunk],
            [a.completion_ids for a in chunk],
            temperature,
            with_entropy=True,
        )
        logp = _fit(out.logprobs, width)
        dev = logp.device
        loss, stats = policy_loss(
            logp,
            batch.old[idx].to(dev),
            advantages[idx].to(dev),
            m.to(dev),
            loss_cfg,
            normalizer=normalizer,
            logp_ref=ref[idx].to(dev),
            entropy=None if out.entropy is None else _fit(out.entropy.detach(), width),
        )
        loss.backward()
        share = float(m.sum()) / n_tokens  # token-weighted averages of the statistics
        totals["loss"] += float(loss.detach())
        for key in ("clip_frac", "approx_kl", "entropy"):
            totals[key] += stats.get(key, 0.0) * share
    grad_norm = torch.nn.utils.clip_grad_norm_(list(params), cfg.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    rewards = batch.groups.rewards[rows]
    kl = kl_estimate(batch.old[rows], ref[rows], cfg.kl_estimator)
    return UpdateStats(
        actions=len(rows),
        tokens=n_tokens,
        mean_reward=float(rewards.mean()),
        mean_kl=float(masked_mean(kl, batch.valid[rows])),
        grad_norm=float(grad_norm),
        **totals,
    )
