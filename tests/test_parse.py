"""Coach reply parsing."""

from __future__ import annotations

import pytest

from mappa.coach import parse_score


@pytest.mark.parametrize(
    ("text", "score", "correct"),
    [
        ("PROCESS_SCORE: 7", 7.0, None),
        ("Analysis...\n**PROCESS_SCORE:** 9\nANSWER_CORRECT: 1", 9.0, True),
        ("PROCESS_SCORE: 3.5\nANSWER_CORRECT: 0", 3.5, False),
        ("process_score = 6", 6.0, None),
        ("PROCESS_SCORE: 11", 10.0, None),
        ("PROCESS_SCORE: -2", 0.0, None),
        ("PROCESS_SCORE: 2 ... on reflection PROCESS_SCORE: 4", 4.0, None),
        ("PROCESS_SCORE: 8 because the code ran", 8.0, None),
        ("I cannot evaluate this.", None, None),
        ("", None, None),
    ],
)
def test_strict(text: str, score: float | None, correct: bool | None) -> None:
    parsed = parse_score(text)
    assert parsed.process_score == score
    assert parsed.answer_correct == correct


def test_lenient_only_when_asked() -> None:
    assert parse_score("Score: 7/10").process_score is None
    assert parse_score("Score: 7/10", lenient=True).process_score == 7.0
    assert parse_score("Final score: 12", lenient=True).process_score == 10.0
