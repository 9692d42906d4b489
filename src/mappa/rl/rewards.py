"""Each action's scalar reward from the coach's score and the episode's outcome."""

from __future__ import annotations


def mix_reward(
    coach_score: float,
    outcome: float | None,
    w_process: float = 1.0,
    w_outcome: float = 0.0,
    clip: float | None = None,
) -> float:
    """reward = w_process * score / 10 + w_outcome * outcome, optionally clipped to [-c, c].

    A missing outcome (a task without a reference answer) counts as 0.

    >>> mix_reward(7.0, 1.0), mix_reward(7.0, 1.0, 0.0, 1.0), mix_reward(7.0, 0.0, 0.5, 0.5)
    (0.7, 1.0, 0.35)
    >>> mix_reward(10.0, 1.0, 1.0, 1.0, clip=1.5)
    1.5
    """
    reward = w_process * coach_score / 10.0 + w_outcome * (outcome or 0.0)
    if clip is not None:
        reward = max(-clip, min(clip, reward))
    return reward
