"""The deterministic math grader: answer policy and equivalence, case by case.

Each case is (response, reference, expected); a reference may be a float as AMC data
stores it. Cases that reach sympy share one worker process, so the file runs in seconds.
"""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from mappa.tasks.math import as_number, extract_answer, extract_boxed, grade, grade_answer

B = r"The final answer is $\boxed{%s}$."

CASES: list[tuple[str, object, bool]] = [
    # AIME: integers 0-999, often written with leading zeros
    (B % "033", "33", True),
    (B % "33", "033", True),
    (B % "007", 7, True),
    (B % "000", "0", True),
    (B % "034", "33", False),
    (B % "330", "33", False),
    # AMC: answers stored as floats
    (B % "18", 18.0, True),
    (B % "18.0", "18", True),
    (B % "18.00", 18.0, True),
    (B % "18.5", 18.0, False),
    (B % "2.5", 2.5, True),
    (B % "-4", -4.0, True),
    # fractions
    (B % r"\frac{1}{2}", "0.5", True),
    (B % r"\dfrac{3}{4}", r"\frac{3}{4}", True),
    (B % r"\tfrac{6}{8}", "3/4", True),
    (B % "3/4", r"\frac34", True),
    (B % r"\frac{2}{3}", "0.667", False),
    (B % r"-\frac{1}{3}", r"\frac{-1}{3}", True),
    (B % r"\frac{1}{3}", r"-\frac{1}{3}", False),
    (B % r"\frac{10}{4}", "2.5", True),
    # radicals
    (B % r"2\sqrt{3}", r"\sqrt{12}", True),
    (B % r"\sqrt{12}", r"2\sqrt{3}", True),
    (B % r"\frac{\sqrt{3}}{2}", r"\frac{1}{2}\sqrt{3}", True),
    (B % r"\sqrt{2}", r"\sqrt{3}", False),
    (B % r"3+2\sqrt{2}", r"2\sqrt{2}+3", True),
    (B % r"\sqrt[3]{8}", "2", True),
    # negatives
    (B % "-7", "-7", True),
    (B % "-7", "7", False),
    (B % "7", "-7", False),
    (B % r"-\sqrt{5}", r"-\sqrt{5}", True),
    # percent, degrees, money, units
    (B % r"25\%", "25", True),
    (B % "25%", "25", True),
    (B % r"45^\circ", "45", True),
    (B % r"45^{\circ}", "45", True),
    (B % r"\$15", "15", True),
    (B % r"12 \text{ cm}", "12", True),
    (B % r"12\text{ square units}", "12", True),
    (B % "12 apples", "12", True),
    (B % r"12 \mbox{ inches}", "13", False),
    # commas as thousands separators (and not inside tuples)
    (B % "1,234", "1234", True),
    (B % "1{,}000{,}000", "1000000", True),
    (B % r"1\,000", "1000", True),
    (B % "1,234", "1.234", False),
    (B % "(1,2)", "(1, 2)", True),
    (B % "(1,2)", "(2,1)", False),
    # \left( \right) and other structures
    (B % r"\left( 3, 4 \right)", "(3,4)", True),
    (B % r"\left[ 0, 1 \right]", "[0,1]", True),
    (B % r"\{1, 2\}", r"\{2, 1\}", True),
    (B % r"x = 5", "5", True),
    (B % r"n=12", "12", True),
    (B % r"3\pi", r"3\pi", True),
    (B % r"\pi r^2", r"r^2\pi", True),
    (B % "x+1", "1+x", True),
    (B % r"\textbf{42}", "42", True),
    # text around the box, several boxes (the last counts), nested braces, no box
    (r"We compute. So $\boxed{12}$ apples are left, as checked.", "12", True),
    (r"First guess \boxed{10}, but correcting: \boxed{12}", "12", True),
    (r"First guess \boxed{12}, but correcting: \boxed{10}", "12", False),
    (r"\boxed{\frac{\sqrt{2}}{\sqrt{8}}}", "0.5", True),
    (r"\boxed{\boxed{9}}", "9", True),
    (r"\boxed {9}", "9", True),
    (r"\fbox{9}", "9", True),
    ("The answer is 12.", "12", False),
    ("Answer: 12", "12", False),  # boxed policy: an answer line is not a box
    (r"\boxed{}", "0", False),
    (r"unclosed \boxed{12", "12", False),
    (r"\boxed{12} and then \boxed{13", "12", True),  # an unclosed box commits to nothing
    ("", "1", False),
    # garbage in a box is wrong, not an error
    (B % "the number of apples", "12", False),
    (B % r"\frac{", "1", False),
]


@pytest.mark.parametrize(("response", "reference", "expected"), CASES)
def test_boxed_policy(response: str, reference: object, expected: bool) -> None:
    assert grade(response, reference) is expected


ANSWER_LINE_CASES: list[tuple[str, object, bool]] = [
    ("Let me think.\nAnswer: 12", "12", True),
    ("answer: 012", 12.0, True),
    ("**Final Answer:** 3/4", r"\frac{3}{4}", True),
    ("**Answer**: 7 marbles.", "7", True),
    ("Answer: 5\nWait, no.\nAnswer: 6", "6", True),
    ("Answer: 5\nWait, no.\nAnswer: 6", "5", False),
    (r"Answer: \boxed{1,000}", "1000", True),
    (r"So \boxed{12}.", "12", False),  # answer-line policy: a box alone is no answer line
    ("The answer is 12", "12", False),
]


@pytest.mark.parametrize(("response", "reference", "expected"), ANSWER_LINE_CASES)
def test_answer_line_policy(response: str, reference: object, expected: bool) -> None:
    assert grade(response, reference, answer_format="answer_line") is expected


def test_there_are_at_least_sixty_cases() -> None:
    assert len(CASES) + len(ANSWER_LINE_CASES) >= 60


def test_extraction_returns_what_was_committed_to() -> None:
    assert extract_boxed(r"\boxed{\frac{3}{4}} then \boxed{ 12 }") == "12"
    assert extract_boxed(r"\boxed{a^{2} + \frac{1}{2}}") == r"a^{2} + \frac{1}{2}"
    assert extract_answer("x\nAnswer: 4 cats.", "answer_line") == "4 cats"
    assert grade_answer(r"so \boxed{1,234}", "1234") == ("1,234", True)
    extracted, correct = grade_answer("no box here", "1")
    assert (extracted, correct) == (None, False)


def test_plain_numbers_never_reach_sympy() -> None:
    assert as_number("1" * 61) is None  # bounded: huge literals go to the guarded path
    assert as_number("0033.50") == Fraction(67, 2)


def test_time_limit_stops_a_runaway_comparison() -> None:
    assert grade(r"\boxed{10^{10^{10}}}", "1", timeout_s=1.0) is False  # not a hang
    # no verdict in time is no verdict, not "not equal": callers may say it was unchecked
    assert grade_answer(r"\boxed{10^{10^{10}}}", "1", timeout_s=1.0).correct is None
    assert grade(r"\boxed{2\sqrt{2}}", r"\sqrt{8}")  # the worker comes back after a kill


def test_grading_works_from_a_script_without_a_main_guard(tmp_path: Path) -> None:
    """The sympy worker must not re-import the caller's ``__main__`` (as a spawned
    ``multiprocessing`` child does, running an unguarded script again)."""
    script = tmp_path / "grade_it.py"
    script.write_text(
        "from mappa.tasks.math import grade, grade_answer\n"
        "print('RUN')\n"
        "print(grade(r'\\boxed{2\\sqrt{2}}', r'\\sqrt{8}'))\n"
        "print(grade_answer(r'\\boxed{x^2}', 'x^3').correct)\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["RUN", "True", "False"]  # the script ran once
