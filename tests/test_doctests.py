"""The examples in docstrings are tests too: run them so they cannot drift from the code."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "mappa.coach.parse",
    "mappa.coach.stats",
    "mappa.rl.rewards",
    "mappa.tasks.arithmetic",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
