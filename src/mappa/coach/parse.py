"""Reading ``PROCESS_SCORE: x`` and ``ANSWER_CORRECT: 0|1`` out of a coach's reply."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

# After the tag: spaces, and any of the wrappers coaches put around a number (markdown bold
# is stripped before matching): [7], (7), "8", '8', `8`, {8}.
_WRAP = r"[\s\[\](){}\"'`]*"
_STRICT = re.compile(
    r"PROCESS_SCORE" + _WRAP + r"[:=]" + _WRAP + r"(-?\d+(?:\.\d+)?)", re.IGNORECASE
)
_LENIENT = re.compile(
    r"\bscore\b[^0-9\-\n]{0,20}?" + _WRAP + r"(-?\d+(?:\.\d+)?)\s*(?:/\s*10)?", re.IGNORECASE
)
_CORRECT = re.compile(r"ANSWER_CORRECT\s*[:=]\s*\**\s*([01]|true|false|yes|no)", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedScore:
    """``process_score`` is None when no score was found or it lay outside [0, 10]; then
    ``out_of_range`` holds the value as written (it is never clamped into range)."""

    process_score: float | None
    answer_correct: bool | None
    out_of_range: float | None = None


def _in_range(x: float) -> bool:
    return 0.0 <= x <= 10.0


def parse_score(text: str, lenient: bool = False) -> ParsedScore:
    """Parse a coach reply. The last ``PROCESS_SCORE`` wins; a value outside [0, 10] is not
    a score (``process_score`` None, ``out_of_range`` the value), never clamped.

    ``lenient`` also accepts looser forms such as ``Score: 7/10`` when the strict tag is
    missing (used after the corrective retry also failed).

    >>> parse_score("Good work.\\n**PROCESS_SCORE:** 8\\nANSWER_CORRECT: 1")
    ParsedScore(process_score=8.0, answer_correct=True, out_of_range=None)
    >>> parse_score("Score: 7/10").process_score is None
    True
    >>> parse_score("Score: 7/10", True).process_score
    7.0
    >>> parse_score('**PROCESS_SCORE:** "8"').process_score, parse_score("PROCESS_SCORE: [7]")
    (8.0, ParsedScore(process_score=7.0, answer_correct=None, out_of_range=None))
    >>> parse_score("PROCESS_SCORE: 11")
    ParsedScore(process_score=None, answer_correct=None, out_of_range=11.0)
    """
    text = text.replace("*", "") if isinstance(text, str) else ""
    found = _STRICT.findall(text)
    if not found and lenient:
        found = _LENIENT.findall(text)
    raw = float(found[-1]) if found else None
    correct = _CORRECT.findall(text)
    answer = correct[-1].lower() in {"1", "true", "yes"} if correct else None
    if raw is not None and not _in_range(raw):
        return ParsedScore(None, answer, out_of_range=raw)
    return ParsedScore(raw, answer)


_BEFORE_SCORE = re.compile(r"PROCESS_SCORE\s*[:=]\s*$", re.IGNORECASE)


class ExpectedScore(NamedTuple):
    """``value``: the expected score; ``digit_mass``: the summed probability of the score
    tokens among the alternatives at the score position (low: the score was not read where
    the model writes one, and ``value`` is noise)."""

    value: float
    digit_mass: float


def _score_token(token: str) -> int | None:
    """The score 0-10 a token writes: ASCII digits only (``int`` would also read "²")."""
    t = token.strip()
    return int(t) if t.isascii() and t.isdigit() and int(t) <= 10 else None


def expected_score_from_logprobs(tokens: list[dict[str, Any]]) -> ExpectedScore | None:
    """Expected score from an OpenAI-style ``logprobs.content`` list (with ``top_logprobs``).

    Finds the last token that follows ``PROCESS_SCORE:`` and is a score, and averages the
    scores 0-10 over its top alternatives. Where "10" is two tokens, "1" may start 10:
    when "1" was sampled, its probability is split into 1 and 10 by the probability of "0"
    at the next position. When it was not, that share is unknown (an OpenAI-style reply
    has no next position for an unsampled token), so the mass of "1" is left out and the
    rest renormalised; at temperature 0 what is left out is at most P(sampled). A
    single-token "10" among the alternatives shows the tokenizer writes 10 in one token,
    and then "1" is the score 1. None when no score position exists or no mass is left.

    >>> toks = [{"token": "PROCESS_SCORE:", "top_logprobs": []},
    ...         {"token": " 8", "top_logprobs": [{"token": " 8", "logprob": -0.2231},
    ...                                          {"token": " 6", "logprob": -1.6094}]}]
    >>> [round(x, 2) for x in expected_score_from_logprobs(toks)]
    [7.6, 1.0]
    """
    text, position = "", None
    for i, tok in enumerate(tokens):
        if (
            _BEFORE_SCORE.search(text.replace("*", ""))
            and _score_token(tok.get("token", "")) is not None
        ):
            position = i
        text += tok.get("token", "")
    if position is None:
        return None
    sampled = tokens[position]
    probs = [0.0] * 11
    for alt in sampled.get("top_logprobs") or [
        {"token": sampled["token"], "logprob": sampled.get("logprob", 0.0)}
    ]:
        value = _score_token(alt.get("token", ""))
        if value is not None:
            probs[value] += math.exp(alt["logprob"])
    digit_mass = sum(probs)
    if _score_token(sampled["token"]) == 1:
        if position + 1 < len(tokens):
            p_zero = sum(
                math.exp(a["logprob"])
                for a in tokens[position + 1].get("top_logprobs") or []
                if a.get("token", "").strip() == "0"
            )
            probs[10] += probs[1] * p_zero
            probs[1] *= 1 - p_zero
    elif probs[10] == 0.0:  # no single-token "10" seen: "1" may be the start of 10
        probs[1] = 0.0
    mass = sum(probs)
    if mass <= 0:
        return None
    return ExpectedScore(sum(s * p for s, p in enumerate(probs)) / mass, digit_mass)
