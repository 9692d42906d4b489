"""``trim_heap`` really returns freed heap pages to the system (the P1 fix)."""

from __future__ import annotations

import os
import sys

import pytest

from mappa.models.memory import trim_heap


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_trim_heap_returns_freed_blocks_in_the_middle_of_the_heap() -> None:
    # 100 kB blocks sit below glibc's mmap threshold, so they come from the heap; the last
    # one stays alive, so free() cannot shrink the heap from the top on its own
    blocks = [bytearray(100_000) for _ in range(2000)]
    keep = blocks[-1]
    del blocks
    held = _rss_mib()
    assert trim_heap() is True
    released = held - _rss_mib()
    print(f"rss {held:.0f} MiB before the trim, {released:.0f} MiB released")
    assert released > 150  # of the ~190 MiB freed
    assert len(keep) == 100_000
