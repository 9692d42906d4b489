"""Built-in arithmetic tasks, task files and the deterministic grader."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mappa.tasks import load_tasks
from mappa.tasks.arithmetic import generate
from mappa.tasks.grader import answers_match, extract_boxed, grade

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "math"


def _solve(prompt: str) -> int:
    """An independent reading of the generated sentences (not the generator's own sums)."""
    value = int(re.search(r"has (\d+) ", prompt).group(1))
    for sentence in prompt.split(". ")[1:]:
        if m := re.search(r"get (\d+) more", sentence):
            value += int(m.group(1))
        elif m := re.search(r"give away (\d+)", sentence):
            value -= int(m.group(1))
        elif m := re.search(r"multiplied by (\d+)", sentence):
            value *= int(m.group(1))
        elif m := re.search(r"buy (\d+) boxes with (\d+)", sentence):
            value += int(m.group(1)) * int(m.group(2))
    return value


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_arithmetic_answers_are_exact_and_seeded(difficulty: int) -> None:
    tasks = generate(50, seed=3, difficulty=difficulty)
    assert tasks == generate(50, seed=3, difficulty=difficulty)
    assert tasks != generate(50, seed=4, difficulty=difficulty)
    for t in tasks:
        assert t.answer is not None and int(t.answer) >= 0
        assert _solve(t.prompt) == int(t.answer), t.prompt
    assert len({t.task_id for t in tasks}) == 50


def test_grader() -> None:
    assert extract_boxed(r"\boxed{\frac{3}{4}} then \boxed{ 12 }") == "12"
    assert grade(r"so \boxed{1,234}", "1234") == ("1,234", True)
    assert grade(r"\boxed{\frac{1}{2}}", "0.5")[1]
    assert grade(r"\boxed{x+1}", "x + 1")[1]
    assert grade("17", "17") == (None, False)  # no box: wrong
    assert not answers_match("18", "18.5")


def test_task_files(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"prompt": "1+1?", "answer": 2.0, "id": "a"}\n{"prompt": "2+2?", "answer": "4"}\n')
    tasks = load_tasks(str(p), 0, 1, 0)
    assert [(t.task_id, t.answer) for t in tasks] == [("a", "2"), ("1", "4")]
    (tmp_path / "bad.json").write_text(json.dumps([{"question": "x"}]))
    with pytest.raises(ValueError, match="no 'prompt'"):
        load_tasks(str(tmp_path / "bad.json"), 0, 1, 0)
    if SHARED.is_dir():
        amc = load_tasks(str(SHARED / "amc_eval_32.json"), 0, 1, 0)
        assert len(amc) == 32 and amc[0].answer == "18"
