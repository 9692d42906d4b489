"""From scored episodes to experience: the padded batch the update trains on.

The shape of OpenRLHF's experience maker, for MAPPA's REINFORCE++ (docs/design.md §1):

1. ``scored_actions``: the (episode, action) pairs that carry a coach score.
2. ``build_batch`` -> ``RolloutBatch``: completions padded to one width ``T``, the old
   (sampling) log-probs, the masks, each action's scalar reward and its group ids.
3. ``reference_logprobs``: the same tokens under the frozen reference (adapters off).
4. ``compute_advantages``: the per-token KL estimate (computed once, here), KL-shaped token
   rewards, then the configured estimator over the whole batch at once, so the whitening
   scope can span one agent, all agents, or (agent, task type).

``make_experience`` runs 2-4 and returns an ``Experience``; ``mappa.rl.update`` then takes
one optimizer step per agent on its rows. Training tokens are exactly ``prompt_ids +
completion_ids`` of each action as sampled; old log-probs are the sampling log-probs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from mappa.config import RLConfig
from mappa.models.interface import TrainablePolicy
from mappa.rl.advantages import EstimatorConfig, Groups, get_estimator
from mappa.rl.core import masked_mean, token_rewards
from mappa.rl.kl import kl_estimate
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
class Experience(RolloutBatch):
    """A ``RolloutBatch`` with what the update needs, all ``(B, T)`` and 0 on padding.

    Attributes:
        ref: log-probs of the completion tokens under the frozen reference.
        kl: the per-token KL estimate ``rl.kl_estimator`` of old vs reference.
        returns: returns-to-go of the KL-shaped token rewards.
        advantages: the estimator's advantages (whitened within each scope).
    """

    ref: torch.Tensor
    kl: torch.Tensor
    returns: torch.Tensor
    advantages: torch.Tensor

    def mean_kl(self, rows: Sequence[int] | None = None) -> float:
        """Mean KL estimate over the real completion tokens of ``rows`` (default: all)."""
        if rows is None:
            return float(masked_mean(self.kl, self.valid))
        idx = list(rows)
        return float(masked_mean(self.kl[idx], self.valid[idx]))


def scored_actions(
    episodes: Sequence[Episode], exclude_flagged: bool
) -> list[tuple[Episode, Action]]:
    """(episode, action) pairs with a coach score, minus flagged scores if excluded."""
    return [
        (e, a)
        for e in episodes
        for a in e.actions
        if a.coach is not None and not (exclude_flagged and a.coach.flagged)
    ]


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
    scope_keys: dict[str, Callable[[Episode, Action], Hashable]] = {
        "agent": lambda ep, a: a.agent,
        "global": lambda ep, a: 0,
        "agent_tasktype": lambda ep, a: (a.agent, ep.task_type),
    }
    scope_key = scope_keys[cfg.norm_scope]
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


def fit_width(x: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad a (B, T') tensor with zeros to (B, width)."""
    return x if x.shape[1] == width else torch.nn.functional.pad(x, (0, width - x.shape[1]))


def reference_logprobs(
    policy: TrainablePolicy,
    actions: Sequence[Action],
    width: int,
    micro_batch: int,
    temperature: float,
) -> torch.Tensor:
    """Log-probs of every completion under the frozen reference (adapters off)."""
    parts = []
    with torch.no_grad():
        for i in range(0, len(actions), micro_batch):
            chunk = actions[i : i + micro_batch]
            out = policy.completion_logprobs(
                None, [a.prompt_ids for a in chunk], [a.completion_ids for a in chunk], temperature
            )
            parts.append(fit_width(out.logprobs.cpu(), width))
    return torch.cat(parts)


def compute_advantages(
    batch: RolloutBatch, ref: torch.Tensor, cfg: RLConfig, beta: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(advantages, returns, kl): KL-shaped token rewards, then the configured estimator.

    ``kl`` is the per-token estimate of old vs reference, 0 on padding. The KL goes into
    the token rewards with weight ``beta`` unless ``cfg.kl_in_loss`` puts it in the loss.
    """
    kl = kl_estimate(batch.old, ref, cfg.kl_estimator) * batch.valid
    reward_beta = 0.0 if cfg.kl_in_loss else beta
    r = token_rewards(batch.groups.rewards, kl, batch.valid, reward_beta)
    adv, returns = get_estimator(cfg.advantage)(
        r, batch.loss_mask, batch.groups, EstimatorConfig(cfg.gamma)
    )
    return adv, returns, kl


def make_experience(
    policy: TrainablePolicy,
    items: Sequence[tuple[Episode, Action]],
    cfg: RLConfig,
    beta: float,
    temperature: float,
) -> Experience:
    """Scored actions -> padded batch, reference log-probs, KL, returns and advantages."""
    batch = build_batch(items, cfg)
    ref = reference_logprobs(
        policy, batch.actions, batch.old.shape[1], cfg.micro_batch_size, temperature
    )
    advantages, returns, kl = compute_advantages(batch, ref, cfg, beta)
    return Experience(
        actions=batch.actions,
        agents=batch.agents,
        old=batch.old,
        valid=batch.valid,
        loss_mask=batch.loss_mask,
        groups=batch.groups,
        ref=ref,
        kl=kl,
        returns=returns,
        advantages=advantages,
    )
