"""Seeded arithmetic word problems with exact integer answers.

The demo needs tasks without data files, and small models need tasks easy enough to get
some right (so the coach's scores vary). Each problem chains ``difficulty`` operations on
a quantity, every intermediate value stays a non-negative integer, and the answer is exact.
"""

from __future__ import annotations

import random

from mappa.tasks.base import Task

_NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas"]
_ITEMS = ["apples", "marbles", "books", "stickers", "coins", "pencils", "cards", "shells"]


def _step(rng: random.Random, value: int, item: str) -> tuple[str, int]:
    """One operation on the running quantity: (sentence, new value)."""
    kind = rng.choice(["add", "sub", "mul", "groups"])
    if kind == "add":
        k = rng.randint(2, 30)
        return f"Then they get {k} more {item}.", value + k
    if kind == "sub" and value > 1:
        k = rng.randint(1, value - 1)
        return f"Then they give away {k} {item}.", value - k
    if kind == "mul":
        k = rng.randint(2, 4)
        return f"Then the number of {item} is multiplied by {k}.", value * k
    boxes, each = rng.randint(2, 6), rng.randint(2, 9)
    return f"Then they buy {boxes} boxes with {each} {item} in each box.", value + boxes * each


def make_task(rng: random.Random, index: int, difficulty: int) -> Task:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    value = rng.randint(3, 40)
    sentences = [f"{name} has {value} {item}."]
    for _ in range(difficulty):
        sentence, value = _step(rng, value, item)
        sentences.append(sentence.replace("they", name, 1) if rng.random() < 0.5 else sentence)
    sentences.append(f"How many {item} does {name} have now?")
    return Task(
        task_id=f"arith-{difficulty}-{index}",
        prompt=" ".join(sentences),
        answer=str(value),
        task_type="arithmetic",
    )


def generate(n: int, seed: int = 0, difficulty: int = 1) -> list[Task]:
    """``n`` problems, identical for the same ``seed`` and ``difficulty``.

    >>> generate(2, seed=1) == generate(2, seed=1)
    True
    """
    rng = random.Random(f"arithmetic-{seed}-{difficulty}")
    return [make_task(rng, i, difficulty) for i in range(n)]
