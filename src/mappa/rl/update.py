"""One REINFORCE++ update of one agent from its actions in a rollout batch.

The model is reached only through ``completion_logprobs``; everything else is the pure
math of ``mappa.rl.core``. Training tokens are exactly ``prompt_ids + completion_ids`` of
each action as sampled; old log-probs are the sampling log-probs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mappa.config import RLConfig
from mappa.models.interface import TrainablePolicy
from mappa.rl.advantages import get_estimator
from mappa.rl.core import kl_estimate, masked_mean, token_rewards
from mappa.rl.loss import policy_loss
from mappa.workflow.records import Action


@dataclass
class UpdateStats:
    """What one agent's update did (logged per step)."""

    actions: int
    tokens: int
    loss: float = 0.0
    mean_reward: float = 0.0
    mean_kl: float = 0.0
    clip_frac: float = 0.0
    grad_norm: float = 0.0
    skipped: str = ""


def _pad(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=torch.float32)
    return out


def update_agent(
    policy: TrainablePolicy,
    agent: str,
    actions: Sequence[Action],
    rewards: Sequence[float],
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.nn.Parameter],
    cfg: RLConfig,
    temperature: float = 1.0,
) -> UpdateStats:
    """Compute advantages over this agent's whole batch and take one optimizer step."""
    if not actions:
        return UpdateStats(0, 0, skipped="no actions")
    width = max(len(a.completion_ids) for a in actions)
    lengths = torch.tensor([len(a.completion_ids) for a in actions])
    valid = (torch.arange(width)[None, :] < lengths[:, None]).float()
    keep = torch.tensor(
        [0.0 if (cfg.mask_truncated and a.truncated) else 1.0 for a in actions]
    )[:, None]
    loss_mask = valid * keep
    n_tokens = int(loss_mask.sum())
    if n_tokens == 0:
        return UpdateStats(len(actions), 0, skipped="every completion truncated (masked)")

    old = _pad([a.sample_logprobs for a in actions], width)
    mb = cfg.micro_batch_size
    with torch.no_grad():
        ref = torch.cat(
            [
                _to_width(
                    policy.completion_logprobs(
                        None,
                        [a.prompt_ids for a in actions[i : i + mb]],
                        [a.completion_ids for a in actions[i : i + mb]],
                        temperature,
                    ).cpu(),
                    width,
                )
                for i in range(0, len(actions), mb)
            ]
        )
    kl = kl_estimate(old, ref, cfg.kl_estimator) * valid
    r = token_rewards(torch.tensor(list(rewards), dtype=torch.float32), kl, valid, cfg.kl_beta)
    advantages, _ = get_estimator(cfg.advantage)(r, loss_mask, cfg.gamma)

    optimizer.zero_grad(set_to_none=True)
    total_loss, clip_tokens = 0.0, 0.0
    for i in range(0, len(actions), mb):
        chunk = actions[i : i + mb]
        m = loss_mask[i : i + mb]
        if m.sum() == 0:
            continue
        logp = policy.completion_logprobs(
            agent, [a.prompt_ids for a in chunk], [a.completion_ids for a in chunk], temperature
        )
        logp = _to_width(logp, width)
        dev = logp.device
        loss, stats = policy_loss(
            logp, old[i : i + mb].to(dev), advantages[i : i + mb].to(dev), m.to(dev),
            cfg.clip_eps, normalizer=n_tokens,
        )
        loss.backward()
        total_loss += float(loss.detach())
        clip_tokens += stats["clip_frac"] * float(m.sum())
    grad_norm = torch.nn.utils.clip_grad_norm_(list(params), cfg.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return UpdateStats(
        actions=len(actions),
        tokens=n_tokens,
        loss=total_loss,
        mean_reward=float(sum(rewards) / len(rewards)),
        mean_kl=float(masked_mean(kl, valid)),
        clip_frac=clip_tokens / n_tokens,
        grad_norm=float(grad_norm),
    )


def _to_width(x: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad a (B, T') tensor with zeros to (B, width)."""
    if x.shape[1] == width:
        return x
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))
