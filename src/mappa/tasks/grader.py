"""Deterministic answer checking: the final ``\\boxed{...}`` against the reference.

Evaluation never asks the coach whether an answer is right (fault (2) in DESIGN.md §1).
"""

from __future__ import annotations

import re
from fractions import Fraction


def extract_boxed(text: str) -> str | None:
    r"""Contents of the last ``\boxed{...}``, braces balanced.

    >>> extract_boxed(r"so \boxed{\frac{1}{2}} and finally \boxed{42}")
    '42'
    >>> extract_boxed("no box") is None
    True
    """
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


_FRAC = re.compile(r"^\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$")


def _as_number(text: str) -> Fraction | None:
    s = text.strip().strip("$").replace(",", "").replace("\\!", "").replace(" ", "")
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s)
    if m := _FRAC.match(s):
        return Fraction(int(m.group(1)), int(m.group(2))) if int(m.group(2)) else None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str, reference: str) -> bool:
    """Numeric equality when both parse as numbers, else whitespace-insensitive equality.

    >>> answers_match("1,000", "1000"), answers_match("0.5", "\\frac{1}{2}"), answers_match("7", "8")
    (True, True, False)
    """
    a, b = _as_number(predicted), _as_number(reference)
    if a is not None and b is not None:
        return a == b
    return re.sub(r"\s+", "", predicted) == re.sub(r"\s+", "", reference)


def grade(response: str, reference: str) -> tuple[str | None, bool]:
    """(extracted answer, correct). No ``\\boxed{}`` in the response counts as wrong."""
    predicted = extract_boxed(response)
    return predicted, predicted is not None and answers_match(predicted, reference)
