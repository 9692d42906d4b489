"""``run_sync``: a workflow's event loop, run from synchronous code."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from mappa.workflow.team import run_sync


def test_ctrl_c_interrupts_a_long_synchronous_call_inside_the_loop_at_once() -> None:
    """A batched ``generate`` is one long synchronous call inside the loop; ``asyncio.run``
    turns Ctrl-C into a cancellation that waits for the next ``await`` (the whole batch).
    A real SIGINT to this process, 0.2 s into a 30 s busy call, raises
    ``KeyboardInterrupt`` within a second, and the other tasks are cancelled."""
    cancelled = []

    async def waiting() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def batch() -> None:
        other = asyncio.ensure_future(waiting())
        await asyncio.sleep(0)  # let it start waiting
        end = time.monotonic() + 30
        while time.monotonic() < end:  # one long synchronous call, as generate is
            sum(range(1000))
        await other

    # Python's own Ctrl-C handler, as a user's process has it (a library imported by an
    # earlier test may have replaced it in this one)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_sync(batch())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 2
    assert cancelled == [True]


def test_a_result_and_an_error_come_back_as_from_asyncio_run() -> None:
    async def value() -> int:
        await asyncio.sleep(0)
        return 7

    async def fails() -> None:
        raise ValueError("boom")

    assert run_sync(value()) == 7
    with pytest.raises(ValueError, match="boom"):
        run_sync(fails())
