"""Reading a sandbox's output without trusting its size or its timing.

``communicate()`` would buffer everything a program prints (100 MB of it, if asked) and
wait for pipes that a leftover background process may hold open forever. Here each stream
keeps only a head and a tail of bounded size, the total is counted against a hard limit,
and reading stops at the wall-time deadline, when the output limit is passed, or shortly
after the process has exited even if something else still holds its pipes.
"""

from __future__ import annotations

import os
import selectors
import time
from typing import Literal

from mappa.text import CUT_MARKER, cut_middle

End = Literal["eof", "exited", "deadline", "output_limit", "reply"]
"""Why reading stopped: all streams closed; the process exited but its pipes stayed open
(a leftover process holds them); the wall time ran out; too much output; a persistent
interpreter answered (see ``reply_fd``)."""

_CHUNK = 1 << 16


class Capture:
    """One output stream: the first and last ``keep`` bytes, and how many there were."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.keep:  # trim in batches, not on every chunk
                del self.tail[: len(self.tail) - self.keep]

    def text(self, max_chars: int) -> str:
        """The stream decoded and cut to ``max_chars`` (head and tail, marker between)."""
        if self.total == len(self.head) + len(self.tail):
            return cut_middle((self.head + self.tail).decode("utf-8", "replace"), max_chars)
        head = self.head.decode("utf-8", "replace")[: max_chars // 2]
        tail = self.tail.decode("utf-8", "replace")[-(max_chars - max_chars // 2) :]
        dropped = self.total - len(head.encode()) - len(tail.encode())
        return head + CUT_MARKER.format(n=dropped) + tail


def pump(
    streams: dict[int, Capture],
    deadline: float,
    max_bytes: int,
    *,
    exit_fd: int | None = None,
    reply_fd: int | None = None,
    reply: bytearray | None = None,
    grace_s: float = 0.5,
) -> End:
    """Read ``streams`` (fd -> Capture, non-blocking fds) until one of the ``End`` reasons.

    ``exit_fd`` (a pidfd) becomes readable when the process exits. With ``reply_fd``, a full
    line arriving there ends the read: it is appended to ``reply``, and the output written
    before it is drained first.
    """
    if reply_fd is not None and reply is None:
        raise ValueError("pump: reply_fd needs a reply buffer")
    selector = selectors.DefaultSelector()
    try:
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        for extra_fd in (exit_fd, reply_fd):
            if extra_fd is not None:
                selector.register(extra_fd, selectors.EVENT_READ)
        open_streams = set(streams)
        exited_at: float | None = None
        while open_streams:
            now = time.monotonic()
            stop_at = deadline if exited_at is None else min(deadline, exited_at + grace_s)
            if now >= stop_at:
                return "deadline" if now >= deadline else "exited"
            for key, _ in selector.select(stop_at - now):
                fd = key.fd
                if fd == exit_fd:
                    exited_at = time.monotonic()
                    selector.unregister(fd)
                    continue
                data = _read(fd)
                if data is None:
                    continue
                if fd == reply_fd:
                    if not data:
                        selector.unregister(fd)
                        continue
                    reply += data  # type: ignore[operator]  # checked above
                    if b"\n" in reply:
                        _drain(streams)
                        return "reply"
                    continue
                if not data:
                    selector.unregister(fd)
                    open_streams.discard(fd)
                    continue
                streams[fd].feed(data)
                if sum(c.total for c in streams.values()) > max_bytes:
                    return "output_limit"
        return "eof"
    finally:
        selector.close()


def _read(fd: int) -> bytes | None:
    """A chunk, ``b''`` at EOF, ``None`` when nothing is ready after all."""
    try:
        return os.read(fd, _CHUNK)
    except BlockingIOError:
        return None


def _drain(streams: dict[int, Capture]) -> None:
    """Take what is already in the pipes (the interpreter flushed before replying)."""
    for fd, capture in streams.items():
        while data := _read(fd):
            capture.feed(data)
