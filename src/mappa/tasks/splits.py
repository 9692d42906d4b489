"""Split hygiene: held-out problems must not appear among the training problems.

The reference evaluation set shared 14 of its 32 problems with its training pool; an
accuracy measured on such a set says little. Problems are compared by normalized text
(case, whitespace, punctuation and LaTeX spacing ignored; operators kept), so reformatted
copies of the same problem are caught too.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from mappa.tasks.base import Task

_LATEX_NOISE = re.compile(r"\\[,;:! ]|\\(?:left|right|displaystyle)\b|[~${}]")
_PUNCTUATION_AND_SPACE = re.compile(r"[\s.,;:!?'\"`]+")


def normalize_text(text: str) -> str:
    r"""The text a duplicate check compares: case, spacing, punctuation and LaTeX
    spacing or braces dropped; operators and digits kept (``20 + 6`` is not ``20 - 6``).

    >>> normalize_text(r"Find  $x$, if $x^2 = 4$.") == normalize_text("find x if x^{2}=4")
    True
    >>> normalize_text("What is 20 + 6?") == normalize_text("What is 20 - 6?")
    False
    """
    s = unicodedata.normalize("NFKC", text).casefold()
    return _PUNCTUATION_AND_SPACE.sub("", _LATEX_NOISE.sub(" ", s))


class SplitOverlapError(ValueError):
    """Evaluation problems that also occur in the training set."""

    SHOWN = 5
    """Pairs named in the message; the rest are counted."""

    def __init__(self, pairs: list[tuple[str, str]], eval_name: str, train_name: str) -> None:
        self.pairs = pairs
        shown = ", ".join(f"{e} (= train {t})" for e, t in pairs[: self.SHOWN])
        more = f" and {len(pairs) - self.SHOWN} more" if len(pairs) > self.SHOWN else ""
        super().__init__(
            f"{len(pairs)} problem(s) of {eval_name} also occur in {train_name}: {shown}{more}. "
            "Remove them, or set eval.allow_overlap=true (mappa eval: --allow-overlap) to "
            "evaluate anyway."
        )


def find_overlap(eval_tasks: Sequence[Task], train_tasks: Sequence[Task]) -> list[tuple[str, str]]:
    """``(eval id, train id)`` for every eval problem whose normalized text is a training one."""
    train = {normalize_text(t.prompt): t.task_id for t in train_tasks}
    return [
        (t.task_id, train[key]) for t in eval_tasks if (key := normalize_text(t.prompt)) in train
    ]


def check_disjoint(
    eval_tasks: Sequence[Task],
    train_tasks: Sequence[Task],
    allow_overlap: bool,
    eval_name: str = "the evaluation set",
    train_name: str = "the training set",
) -> list[tuple[str, str]]:
    """Raise SplitOverlapError on overlap unless allowed; returns the overlapping pairs."""
    pairs = find_overlap(eval_tasks, train_tasks)
    if pairs and not allow_overlap:
        raise SplitOverlapError(pairs, eval_name, train_name)
    return pairs
