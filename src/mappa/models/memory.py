"""Hand freed heap memory back to the operating system between agents' updates.

Each agent's update allocates and frees the same large activation tensors. glibc's malloc
raises its mmap threshold once a large block is freed, so later blocks of that size come
from the heap, and a freed heap block in the middle of an arena is kept by the process:
without a trim, a 3-agent step peaks about a sixth higher than a 1-agent step on the demo
model (docs/benchmarks.md, P1). ``malloc_trim(0)`` releases the free pages of every arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or ``None`` where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def trim_heap() -> bool:
    """Return the free pages of the C heap to the system; ``False`` where that is not
    possible here (a no-op: memory is then only reused, never returned)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
