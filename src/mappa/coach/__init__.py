"""The coach: scores every action 0-10 from its context. Imports no torch."""

from mappa.coach.base import (
    CoachBackend,
    CoachContext,
    CoachFallbackError,
    CoachFatalError,
    CoachView,
    FallbackGuard,
    build_context,
    score_episodes,
)
from mappa.coach.parse import ParsedScore, parse_score

__all__ = [
    "CoachBackend",
    "CoachContext",
    "CoachFallbackError",
    "CoachFatalError",
    "CoachView",
    "FallbackGuard",
    "ParsedScore",
    "build_context",
    "parse_score",
    "score_episodes",
]
