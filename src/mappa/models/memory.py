"""Hand freed memory back between agents' updates: the C heap's to the operating system,
torch's cached CUDA blocks to the driver.

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

import torch


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


def release_cuda_cache() -> bool:
    """Return torch's cached, unused CUDA blocks to the driver; ``False`` without CUDA.

    The caching allocator keeps an update's freed activations for reuse by this process.
    A vLLM engine that wakes next (in another Ray actor on the same card, or from sleep in
    this process, whose allocator is its own) cannot use them, and runs out of memory
    while they sit idle in torch's cache.
    """
    if not torch.cuda.is_available():
        return False
    torch.cuda.empty_cache()
    return True
