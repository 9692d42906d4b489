"""In-process coach: the expected score under the model's distribution over 0-10.

The model reads the probability of each score token right after ``PROCESS_SCORE:`` (no
generation: one batched forward over the contexts, see ``mappa.models.scorer``); the
expected value is a smooth reward that separates good from bad actions even when a small
model would not write the format itself (docs/design.md §2). The model is injected as a
``ScoreDistribution`` so this module imports no torch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from mappa.coach.context import CoachContext
from mappa.coach.templates import CoachTemplate, render_messages
from mappa.workflow.records import Score

SCORE_PREFIX = "Analysis omitted.\nPROCESS_SCORE:"


class ScoreDistribution(Protocol):
    """Given chat messages and an assistant prefix, P(score = 0..10) per conversation."""

    def __call__(
        self, conversations: Sequence[list[dict[str, str]]], prefix: str
    ) -> list[list[float]]: ...


class LocalCoach:
    """Coach backend over a local model's score distribution."""

    name = "local"

    def __init__(self, distribution: ScoreDistribution, template: CoachTemplate) -> None:
        self.distribution = distribution
        self.template = template

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        start = time.monotonic()
        probs = self.distribution(
            [render_messages(self.template, c) for c in contexts], SCORE_PREFIX
        )
        per = (time.monotonic() - start) / max(1, len(contexts))
        scores = []
        for p in probs:
            mass = sum(p)
            if mass < 1e-6:  # the model puts no weight on any score: no signal, say so
                scores.append(
                    Score(
                        5.0,
                        "no probability on any score token",
                        None,
                        True,
                        self.name,
                        per,
                        flag_reason="no_score_mass",
                    )
                )
                continue
            expected = sum(s * q for s, q in enumerate(p)) / mass
            top = max(range(len(p)), key=p.__getitem__)
            scores.append(
                Score(
                    value=expected,
                    rationale=f"expected score {expected:.2f} (mode {top}, digit mass {mass:.2f})",
                    backend=self.name,
                    latency_s=per,
                )
            )
        return scores
