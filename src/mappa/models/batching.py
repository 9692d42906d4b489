"""Batching by length, shared by sampling, the update's micro-batches and the local coach.

Pure Python (no torch), so the RL layer can use it without the model implementation.
"""

from __future__ import annotations

from collections.abc import Sequence


def token_batches(
    lengths: Sequence[int], max_rows: int, max_tokens: int | None = None
) -> list[list[int]]:
    """Indices grouped into forwards, longest first, so rows of a batch have similar lengths
    (little left padding). A batch grows while it holds at most ``max_rows`` rows and (with
    ``max_tokens``) ``rows x its longest row`` tokens fit ``max_tokens``; a longer row goes
    alone. Sampling, the update's micro-batches and the local coach all batch this way.

    >>> token_batches([3, 9, 5, 8], max_rows=2)
    [[1, 3], [2, 0]]
    """
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        last = batches[-1] if batches else []
        if (
            last
            and len(last) < max_rows
            and (max_tokens is None or (len(last) + 1) * lengths[last[0]] <= max_tokens)
        ):
            last.append(i)
        else:
            batches.append([i])
    return batches
