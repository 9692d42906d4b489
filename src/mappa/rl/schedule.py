"""The learning-rate schedule as a pure function of the step (OpenRLHF's cosine_with_min_lr)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from mappa.config import RLConfig


def lr_factor(
    step: int, total: int, warmup_ratio: float, min_ratio: float, kind: str = "cosine"
) -> float:
    """Multiplier of the peak lr for optimizer step ``step`` (0-based) of ``total``.

    Linear warmup over ``round(warmup_ratio * total)`` steps (at least the first step is
    taken at a non-zero lr), then ``constant`` at 1, or ``cosine`` from 1 down to
    ``min_ratio`` at the last step.

    >>> [round(lr_factor(s, 5, 0.0, 0.1), 3) for s in range(5)]
    [1.0, 0.868, 0.55, 0.232, 0.1]
    >>> [round(lr_factor(s, 4, 0.5, 0.1), 3) for s in range(4)]
    [0.5, 1.0, 1.0, 0.1]
    >>> lr_factor(3, 4, 0.5, 0.1, "constant")
    1.0
    """
    warmup = round(warmup_ratio * total)
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    if kind != "cosine":
        raise ValueError(f"unknown lr schedule {kind!r}; have cosine, constant")
    decay_steps = total - warmup - 1
    progress = 1.0 if decay_steps <= 0 else (step - warmup) / decay_steps
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def set_step_lr(
    optimizers: Iterable[torch.optim.Optimizer], cfg: RLConfig, step: int, total: int
) -> float:
    """Set every optimizer's lr for training step ``step`` of ``total``; returns it.

    Set from the step, not advanced by each optimizer step, so an agent whose update was
    skipped (no reward signal) rejoins at the schedule's current value.
    """
    lr = cfg.lr * lr_factor(step, total, cfg.lr_warmup_ratio, cfg.min_lr_ratio, cfg.lr_schedule)
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr
    return lr
