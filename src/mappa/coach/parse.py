"""Reading ``PROCESS_SCORE: x`` and ``ANSWER_CORRECT: 0|1`` out of a coach's reply."""

from __future__ import annotations

import re
from dataclasses import dataclass

_STRICT = re.compile(r"PROCESS_SCORE\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_LENIENT = re.compile(r"\bscore\b[^0-9\-\n]{0,20}(-?\d+(?:\.\d+)?)\s*(?:/\s*10)?", re.IGNORECASE)
_CORRECT = re.compile(r"ANSWER_CORRECT\s*[:=]\s*\**\s*([01]|true|false|yes|no)", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedScore:
    process_score: float | None
    answer_correct: bool | None


def _clamp(x: float) -> float:
    return min(10.0, max(0.0, x))


def parse_score(text: str, lenient: bool = False) -> ParsedScore:
    """Parse a coach reply. The last ``PROCESS_SCORE`` wins; values are clamped to [0, 10].

    ``lenient`` also accepts looser forms such as ``Score: 7/10`` when the strict tag is
    missing (used after the corrective retry also failed).

    >>> parse_score("Good work.\\n**PROCESS_SCORE:** 8\\nANSWER_CORRECT: 1")
    ParsedScore(process_score=8.0, answer_correct=True)
    >>> parse_score("Score: 7/10").process_score is None, parse_score("Score: 7/10", True).process_score
    (True, 7.0)
    """
    text = text.replace("*", "") if text else ""
    strict = _STRICT.findall(text)
    value: float | None = _clamp(float(strict[-1])) if strict else None
    if value is None and lenient:
        loose = _LENIENT.findall(text)
        value = _clamp(float(loose[-1])) if loose else None
    correct = _CORRECT.findall(text)
    answer = correct[-1].lower() in {"1", "true", "yes"} if correct else None
    return ParsedScore(value, answer)
