"""Reading ``PROCESS_SCORE: x`` and ``ANSWER_CORRECT: 0|1`` out of a coach's reply."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from mappa.models.score_tokens import SCORES, ZERO, score_value, split_ten

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
MULTI_DIGIT = re.compile(r"\s*[0-9]{2,}\s*")
"""A token that is a whole number of two or more digits (``fullmatch``): a tokenizer that
has one writes numbers in multi-digit tokens, "10" among them (GPT-4's, Llama 3's). Not any
token holding two digits: Qwen2.5's GGUF vocabulary pads with ``[PAD151665]`` and the like."""


class ExpectedScore(NamedTuple):
    """An expected score read from ``top_logprobs``.

    ``value``: the expected score, the middle of ``low``..``high``; ``low``/``high``: the
    expected score with the unresolved share of "1" read as 1 / as 10 (equal when the reply
    settles what "1" is); ``digit_mass``: the summed probability of the score tokens among
    the alternatives at the score position (low: the score was not read where the model
    writes one, and ``value`` is noise).
    """

    value: float
    digit_mass: float
    low: float
    high: float


def _listed(token: dict[str, Any]) -> list[tuple[str, float]]:
    """(text, probability) of what a reply lists at one position: its ``top_logprobs``
    and the sampled token where its logprob is given (a sampled token is not always among
    the top ones; one without a logprob is not taken as certain)."""
    top = token.get("top_logprobs") or []
    listed = [(alt.get("token", ""), math.exp(alt["logprob"])) for alt in top]
    sampled = token.get("token", "")
    if "logprob" in token and sampled not in {text for text, _ in listed}:
        listed.append((sampled, math.exp(token["logprob"])))
    return listed


def _zero_bounds(token: dict[str, Any]) -> tuple[float, float]:
    """Bounds on P("0") at a position: exact where "0" is listed; else at most what the
    listing leaves unaccounted for and, ``top_logprobs`` being the likeliest tokens, no
    more than the least likely of them."""
    listed = _listed(token)
    if any(text == ZERO for text, _ in listed):
        p_zero = sum(p for text, p in listed if text == ZERO)
        return p_zero, p_zero
    most = max(0.0, 1.0 - sum(p for _, p in listed))
    top = token.get("top_logprobs") or []
    if top:
        most = min(most, min(math.exp(alt["logprob"]) for alt in top))
    return 0.0, most


def _ten_share(tokens: list[dict[str, Any]], position: int) -> tuple[float, float]:
    """Bounds on the share of P("1") at the score position that is the start of "10"."""
    if score_value(tokens[position]["token"]) == 1 and position + 1 < len(tokens):
        return _zero_bounds(tokens[position + 1])  # P("0" | "1"), as the local scorers read
    texts = [t.get("token", "") for t in tokens]
    texts += [a.get("token", "") for t in tokens for a in t.get("top_logprobs") or []]
    if any(MULTI_DIGIT.fullmatch(text) for text in texts):
        return 0.0, 0.0  # the tokenizer writes numbers in multi-digit tokens: "10" is one
    return 0.0, 1.0


def _mean(probs: list[float]) -> float:
    return sum(s * p for s, p in enumerate(probs)) / sum(probs)


def expected_score_from_logprobs(tokens: list[dict[str, Any]]) -> ExpectedScore | None:
    """Expected score from an OpenAI-style ``logprobs.content`` list (with ``top_logprobs``).

    Finds the last token that follows ``PROCESS_SCORE:`` and is a score (``score_value``:
    "07" is none), and averages the scores 0-10 over what the reply lists there. Where
    "10" is two tokens, "1" may start 10, and the share of P("1") that does is P("0") at
    the next position, the split the in-process scorers make (``split_ten``). A reply
    shows that position only after a sampled "1"; otherwise the share is known only where
    the reply shows the tokenizer writes numbers in multi-digit tokens (a token that is a
    number of two or more digits, ``MULTI_DIGIT``, e.g. "10"): then "1" is the score 1.
    Else it lies anywhere in 0..1, and the expected score between ``low`` ("1" is 1) and
    ``high`` ("1" starts 10); ``value`` is the middle: whatever the split, off by at most
    half the range, where dropping the share and renormalising the rest (the older rule)
    assumed the "1" scored like the rest and was off by up to the whole range when it did
    not. None when no score position exists or no score has mass there.

    >>> toks = [{"token": "PROCESS_SCORE:", "top_logprobs": []},
    ...         {"token": " 8", "top_logprobs": [{"token": " 8", "logprob": -0.2231},
    ...                                          {"token": " 6", "logprob": -1.6094}]}]
    >>> [round(x, 2) for x in expected_score_from_logprobs(toks)]
    [7.6, 1.0, 7.6, 7.6]
    """
    text, position = "", None
    for i, tok in enumerate(tokens):
        if (
            _BEFORE_SCORE.search(text.replace("*", ""))
            and score_value(tok.get("token", "")) is not None
        ):
            position = i
        text += tok.get("token", "")
    if position is None:
        return None
    probs = [0.0] * len(SCORES)
    for token, p in _listed(tokens[position]):
        value = score_value(token)
        if value is not None:
            probs[value] += p
    digit_mass = sum(probs)
    if digit_mass <= 0:
        return None
    share_low, share_high = _ten_share(tokens, position)
    low, high = _mean(split_ten(probs, share_low)), _mean(split_ten(probs, share_high))
    return ExpectedScore((low + high) / 2, digit_mass, low, high)
