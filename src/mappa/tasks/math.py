r"""Deterministic grading of math answers: our answer policy around ``math-verify``.

Evaluation never asks the coach whether an answer is right (fault (2) in docs/design.md §1).
The policy, in order:

1. **Extract** the answer: the last top-level ``\boxed{...}`` (braces balanced, a box
   inside a box unwrapped), or with ``answer_format="answer_line"`` the last line that
   starts with ``Answer:``. Nothing extracted is wrong, whatever the text says.
2. **Normalize** both sides: ``$``, ``\left``/``\right``, spacing commands, ``\dfrac``,
   ``\text{}`` wrappers, thousands separators, percent and degree signs, trailing unit
   words, a leading ``x =``.
3. **Compare**: two plain numbers (integers, decimals, ``a/b``, ``\frac{a}{b}``) are
   compared exactly as fractions, so ``033`` equals ``33`` and ``18.0`` equals ``18``, and
   nothing else is consulted; otherwise equal normalized text, then sympy equivalence via
   ``math-verify`` under a time limit (``mappa.tasks.equivalence``).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import NamedTuple

from mappa.config import AnswerFormat
from mappa.tasks.equivalence import equivalent

Reference = str | int | float | Fraction

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_LINE = re.compile(r"^[\s*#>_-]*(?:final\s+)?answer\s*[*_]*\s*[:：]\s*(.*)$", re.I | re.M)


def _boxes(text: str) -> list[tuple[int, int]]:
    """(start, end) of each top-level box's contents, in order; unclosed boxes are skipped."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while m := _BOX.search(text, pos):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:
            break
        spans.append((m.end(), i - 1))
        pos = i
    return spans


def extract_boxed(text: str) -> str | None:
    r"""Contents of the last top-level ``\boxed{...}``; None if there is none or it is empty.

    >>> extract_boxed(r"so \boxed{\frac{1}{2}} and finally \boxed{42}")
    '42'
    >>> extract_boxed(r"\boxed{\boxed{7}}"), extract_boxed("no box")
    ('7', None)
    """
    spans = _boxes(text)
    if not spans:
        return None
    inner = text[spans[-1][0] : spans[-1][1]].strip()
    nested = _boxes(inner)
    if len(nested) == 1 and _BOX.match(inner) and nested[0][1] == len(inner) - 1:
        return extract_boxed(inner)
    return inner or None


def extract_answer(text: str, answer_format: AnswerFormat = "boxed") -> str | None:
    r"""The answer a response commits to under ``answer_format``, or None.

    >>> extract_answer("work...\nAnswer: 12 apples", "answer_line")
    '12 apples'
    """
    if answer_format == "boxed":
        return extract_boxed(text)
    lines = _ANSWER_LINE.findall(text)
    if not lines:
        return None
    last = lines[-1].strip().rstrip(".").strip("*_ ")
    return extract_boxed(last) or last or None


_UNWRAP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_DROP = re.compile(
    r"\\left|\\right|\\[,;:! ]|\\displaystyle|~|\\\$|\$|\\%|%|°|\^\s*\{?\\circ\}?|\\circ"
)
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_MATH_WORDS = r"(?:pi|sqrt|log|ln|sin|cos|tan|exp|inf)\b"
_UNITS = re.compile(rf"^(-?[\d.,/]+)\s*(?:(?!{_MATH_WORDS})[a-zA-Z]{{2,}}\.?\s*)+$")
_ASSIGN = re.compile(r"^[a-zA-Z]\w*\s*=\s*(?!.*=)")


def normalize_answer(text: str) -> str:
    r"""Canonical text of an answer: the surface forms that do not change its value removed.

    Single spaces stay (``2\pi r`` must not become ``\pir``); compare with them removed.

    >>> normalize_answer(r"\$1{,}000 \text{ dollars}"), normalize_answer(r"x = \dfrac{3}{4}")
    ('1000', '\\frac{3}{4}')
    >>> normalize_answer(r"45^\circ"), normalize_answer(r"12.5\%")
    ('45', '12.5')
    >>> normalize_answer(r"\left( 1, 2 \right)")
    '( 1, 2 )'
    """
    s = text.strip()
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = s.replace("{,}", ",")
    while (unwrapped := _UNWRAP.sub(r"\1", s)) != s:
        s = unwrapped
    s = _DROP.sub(" ", s)
    s = _ASSIGN.sub("", s.strip())
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    if m := _UNITS.match(s):
        s = m.group(1)
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


_DECIMAL = re.compile(r"^[+-]?(\d{1,60}(\.\d{0,60})?|\.\d{1,60})$")
_FRAC = re.compile(r"^([+-]?)\\frac\{([+-]?\d{1,60})\}\{([+-]?\d{1,60})\}$")
_SLASH = re.compile(r"^([+-]?\d{1,60})/(\d{1,60})$")


def as_number(text: str) -> Fraction | None:
    r"""The exact value of a plain number in normalized form, else None.

    Bounded digit counts keep this instant: nothing like ``1e999999999`` is ever expanded.

    >>> as_number("033"), as_number("-18.50"), as_number(r"-\frac{6}{4}"), as_number("2^3")
    (Fraction(33, 1), Fraction(-37, 2), Fraction(-3, 2), None)
    """
    if _DECIMAL.match(text):
        return Fraction(text)
    if m := _FRAC.match(text):
        sign, num, den = m.groups()
        value = Fraction(int(num), int(den)) if int(den) else None
        return -value if value is not None and sign == "-" else value
    if (m := _SLASH.match(text)) and int(m.group(2)):
        return Fraction(int(m.group(1)), int(m.group(2)))
    return None


def reference_text(answer: Reference) -> str:
    """A reference answer as text; data files store AMC answers as floats (``18.0``)."""
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))
    return str(answer)


def compare_answers(predicted: str, reference: Reference, timeout_s: float = 5.0) -> bool | None:
    r"""Compare an extracted answer with the reference (steps 2 and 3 of the policy); None
    when the symbolic comparison gave no verdict within ``timeout_s``.

    >>> compare_answers("1,000", 1000), compare_answers("7", "8")
    (True, False)
    """
    pred, gold = normalize_answer(predicted), normalize_answer(reference_text(reference))
    pred_compact, gold_compact = pred.replace(" ", ""), gold.replace(" ", "")
    if not pred_compact or not gold_compact:
        return False
    a, b = as_number(pred_compact), as_number(gold_compact)
    if a is not None and b is not None:
        return a == b
    return pred_compact == gold_compact or equivalent(gold, pred, timeout_s)


def answers_equal(predicted: str, reference: Reference, timeout_s: float = 5.0) -> bool:
    r"""``compare_answers`` with no verdict counted as not equal (the grader's rule).

    >>> answers_equal("1,000", 1000), answers_equal("0.5", r"\frac{1}{2}"), answers_equal("7", "8")
    (True, True, False)
    """
    return compare_answers(predicted, reference, timeout_s) is True


class Graded(NamedTuple):
    """What was extracted from a response and whether it matches the reference: ``correct``
    is None when the comparison gave no verdict in time (the caller counts it wrong, and
    may say that it was never checked)."""

    extracted: str | None
    correct: bool | None


def grade_answer(
    response: str, answer: Reference, answer_format: AnswerFormat = "boxed", timeout_s: float = 5.0
) -> Graded:
    r"""Extract with ``answer_format``, then compare; unpacks as ``(extracted, correct)``.

    >>> grade_answer(r"The total is \boxed{033}.", "33")
    Graded(extracted='033', correct=True)
    """
    extracted = extract_answer(response, answer_format)
    if extracted is None:
        return Graded(None, False)
    return Graded(extracted, compare_answers(extracted, answer, timeout_s))


def grade(
    response: str, answer: Reference, answer_format: AnswerFormat = "boxed", timeout_s: float = 5.0
) -> bool:
    r"""Whether ``response`` commits to ``answer``; a response with no answer is wrong.

    >>> grade(r"so the area is $\boxed{18}$", 18.0), grade("It is 18.", "18")
    (True, False)
    """
    return grade_answer(response, answer, answer_format, timeout_s).correct is True
