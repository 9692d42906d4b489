"""In-process coach: the expected score under the model's distribution over 0-10.

The model reads the probability of each score where it would write the score's digit after
``PROCESS_SCORE:`` (no generation: one batched forward over the contexts, see
``mappa.models.scorer``); the expected value is a smooth reward that separates good from
bad actions even when a small model would not write the format itself (docs/design.md §2).
The probability on all scores together (the digit mass) is kept with each score: below
``LOW_MASS`` the model was not about to write a score there and the score is flagged. The
model is injected as a ``ScoreDistribution`` so this module imports no torch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from mappa.coach.context import CoachContext
from mappa.coach.templates import CoachTemplate, render_messages
from mappa.records import Score

SCORE_PREFIX = "Analysis omitted.\nPROCESS_SCORE:"
LOW_MASS = 0.5
"""The default ``coach.local.min_digit_mass``: below this probability on all scores together,
where the score was read, a score is flagged (``low_score_mass``): the model was not about to
write a score there, so the ratio of the digits' small probabilities is noise."""


class ScoreDistribution(Protocol):
    """Given chat messages and an assistant prefix, P(score = 0..10) per conversation."""

    def __call__(
        self, conversations: Sequence[list[dict[str, str]]], prefix: str
    ) -> list[list[float]]: ...


def expected_score(
    p: Sequence[float], backend: str, latency_s: float, min_mass: float = LOW_MASS
) -> Score:
    """The score of one distribution over 0..10: its mean, flagged when its mass is below
    ``min_mass``."""
    mass = sum(p)
    if mass <= 0.0:
        return Score(
            5.0,
            "no probability on any score token",
            flagged=True,
            backend=backend,
            latency_s=latency_s,
            flag_reason="low_score_mass",
            digit_mass=0.0,
        )
    expected = sum(s * q for s, q in enumerate(p)) / mass
    top = max(range(len(p)), key=p.__getitem__)
    low = mass < min_mass
    return Score(
        value=expected,
        rationale=f"expected score {expected:.2f} (mode {top}, digit mass {mass:.2f})"
        + (f"; below {min_mass}: the model was not about to write a score" if low else ""),
        flagged=low,
        backend=backend,
        latency_s=latency_s,
        flag_reason="low_score_mass" if low else "",
        digit_mass=mass,
    )


class LocalCoach:
    """Coach backend over a local model's score distribution."""

    name = "local"

    def __init__(
        self, distribution: ScoreDistribution, template: CoachTemplate, min_mass: float = LOW_MASS
    ) -> None:
        self.distribution = distribution
        self.template = template
        self.min_mass = min_mass

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        start = time.monotonic()
        probs = self.distribution(
            [render_messages(self.template, c) for c in contexts], SCORE_PREFIX
        )
        per = (time.monotonic() - start) / max(1, len(contexts))
        scores = [expected_score(p, self.name, per, self.min_mass) for p in probs]
        # a scorer that lets the coach write first (its facts) keeps what it wrote
        for score, reply in zip(
            scores, getattr(self.distribution, "replies", None) or [], strict=False
        ):
            score.rationale = f"{reply.strip()}\n{score.rationale}" if reply else score.rationale
        return scores
