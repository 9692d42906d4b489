"""Persistent mode: one interpreter per agent per episode, variables kept between blocks.

The interpreter is the same guest program in the same sandbox as a stateless run, started
once and fed cells over a pipe. A cell that hits a limit ends the interpreter; the next
cell starts a fresh one and says so, since the agent's variables are gone.

bwrap's ``--die-with-parent`` is tied to the *thread* that started the sandbox: start and
use a session from a thread that outlives it (``SandboxPool`` keeps its threads).
"""

from __future__ import annotations

import json
import os
import select
import time
from typing import TYPE_CHECKING

from mappa.sandbox.capture import Capture, End
from mappa.sandbox.limits import LimitName, Limits
from mappa.sandbox.result import ExecutionResult, RunWatch, Status
from mappa.sandbox.running import Running, by_exit_code, classify

if TYPE_CHECKING:
    from pathlib import Path

    from mappa.sandbox.backends.local import LocalBackend

RESTARTED = "note: the interpreter was restarted, variables from earlier blocks are gone"


class LocalSession:
    """A persistent interpreter in ``workdir`` (see ``LocalBackend.open_session``)."""

    def __init__(self, backend: LocalBackend, workdir: Path, limits: Limits) -> None:
        self.backend = backend
        self.workdir = workdir
        self.limits = limits
        self._run: Running | None = None
        self._lost_state = False

    def run(self, code: str) -> ExecutionResult:
        start = time.monotonic()
        deadline = start + self.limits.wall_time_s
        watch = RunWatch.begin(self.workdir, start)
        note = ""
        if self._run is None:
            self._start()
            note, self._lost_state = (RESTARTED if self._lost_state else ""), False
        run = self._run
        assert run is not None and run.command_fd is not None
        data = code.encode()
        out, err = Capture(self.limits.max_output_chars), Capture(self.limits.max_output_chars)
        reply = bytearray()
        end: End
        if _send(run.command_fd, f"{len(data)}\n".encode() + data, deadline):
            end = run.read(out, err, deadline, self.limits, reply=reply)
        else:
            end = "deadline" if time.monotonic() >= deadline else "eof"  # it died between cells
        status: Status
        exit_code: int | None
        limit: LimitName | None = None
        stderr = err.text(self.limits.max_output_chars)
        answered = _exit_code(reply) if end == "reply" else None
        if answered is not None:
            status, exit_code, message, limit = by_exit_code(answered, stderr, self.limits)
        else:  # the interpreter ended, or must be ended: its state is lost
            returncode = run.finish(clean=end == "eof")
            self._discard()
            self._lost_state = True
            if end == "reply":  # the code wrote something else on the reply channel
                status, exit_code, message = (
                    "error",
                    None,
                    "error: the code broke the interpreter's reply channel",
                )
            else:
                status, exit_code, message, limit = classify(end, returncode, stderr, self.limits)
        stdout = out.text(self.limits.max_output_chars)
        message = "; ".join(m for m in (note, message) if m)
        return watch.result(status, exit_code, stdout, stderr, message, limit)

    def close(self) -> None:
        """End the interpreter and everything it started."""
        if self._run is not None:
            self._run.stop()
            self._discard()

    def _start(self) -> None:
        code_r, code_w = os.pipe()
        reply_r, reply_w = os.pipe()
        try:
            run = self.backend.start(self.workdir, self.limits, code_fd=code_r, reply_fd=reply_w)
        except BaseException:
            os.close(code_w)
            os.close(reply_r)
            raise
        finally:
            os.close(code_r)  # the sandbox has its own copies now
            os.close(reply_w)
        run.command_fd, run.reply_fd = code_w, reply_r
        os.set_blocking(code_w, False)
        os.set_blocking(reply_r, False)
        self._run = run

    def _discard(self) -> None:
        if self._run is not None:
            self._run.release()
            self._run = None


def _send(fd: int, data: bytes, deadline: float) -> bool:
    """Write all of ``data`` before ``deadline``; False if the reader is gone or too slow."""
    view = memoryview(data)
    while view:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        _, ready, _ = select.select([], [fd], [], remaining)
        if not ready:
            continue
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue
        except BrokenPipeError:
            return False
    return True


def _exit_code(reply: bytes | bytearray) -> int | None:
    """The exit code in the interpreter's answer; None if the line is not one of ours."""
    try:
        return int(json.loads(reply.split(b"\n", 1)[0])["exit_code"])
    except (ValueError, KeyError, TypeError):
        return None
