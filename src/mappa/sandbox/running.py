"""One live local sandbox (bwrap or process backend) and how its end reads.

``Running`` is the guest program we started: read its output under the limits, stop it and
everything it started, give back what it held. ``classify`` turns the way it ended into a
status and a message naming the limit (``by_exit_code`` when the code's own exit code is
all there is). Both the stateless run (``backends.local``) and the persistent interpreter
(``session``) use them; this module imports neither, so neither depends on the other.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from mappa.sandbox.capture import Capture, End, pump
from mappa.sandbox.identity import Lease, kill_uid
from mappa.sandbox.limits import LimitName, Limits
from mappa.sandbox.result import Status

_STOP_GRACE_S = 2.0

Ending = tuple[Status, int | None, str, LimitName | None]
"""(status, exit_code, message, limit): how a run ended, as ``ExecutionResult`` says it."""


@dataclass
class Running:
    """One live sandbox: the process we started, the uid it holds, its scratch dir."""

    proc: subprocess.Popen[bytes]
    lease: Lease | None
    scratch: Path | None
    stop_signal: signal.Signals
    pidfd: int | None = None
    command_fd: int | None = None
    reply_fd: int | None = None
    _released: bool = field(default=False, repr=False)

    def read(
        self,
        out: Capture,
        err: Capture,
        deadline: float,
        limits: Limits,
        reply: bytearray | None = None,
    ) -> End:
        """Capture stdout and stderr until the end (or, given ``reply``, the next answer)."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        streams = {self.proc.stdout.fileno(): out, self.proc.stderr.fileno(): err}
        reply_fd = self.reply_fd if reply is not None else None
        return pump(
            streams,
            deadline,
            limits.max_output_bytes,
            exit_fd=self.pidfd,
            reply_fd=reply_fd,
            reply=reply,
        )

    def finish(self, clean: bool) -> int:
        """Wait for the exit status; after an unclean end first kill everything it started."""
        if clean:
            try:
                return self.proc.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        self.stop()
        return self.proc.returncode

    def stop(self) -> None:
        """Kill the sandbox and every process in it, and reap it."""
        if self.proc.returncode is None:  # not reaped: its pid and group id cannot be reused
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, self.stop_signal)
            if self.lease is not None:
                kill_uid(self.lease.uid)
            self._await_exit(_STOP_GRACE_S)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # whatever is left in its group
        elif self.lease is not None:
            kill_uid(self.lease.uid)
        self.proc.wait()

    def _await_exit(self, timeout_s: float) -> None:
        """Wait until the process has exited, without reaping it."""
        give_up = time.monotonic() + timeout_s
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        while os.waitid(os.P_PID, self.proc.pid, flags) is None and time.monotonic() < give_up:
            time.sleep(0.005)

    def release(self) -> None:
        """Give back fds, scratch dir and uid. Only after the sandbox has ended."""
        if self._released:
            return
        self._released = True
        for fd in (self.pidfd, self.command_fd, self.reply_fd):
            if fd is not None:
                os.close(fd)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        if self.lease is not None:
            self.lease.release()


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception))\b:?(.*)$")


def limit_from_traceback(stderr: str) -> LimitName | None:
    """The limit behind the code's last exception, when it is one the code could see."""
    for line in reversed(stderr.splitlines()):
        m = _EXCEPTION_LINE.match(line)
        if m is None:
            continue
        name, text = m.group(1), m.group(2)
        if name.endswith("MemoryError"):
            return "memory"
        if "[Errno 27]" in text or "File too large" in text:
            return "file_size"
        if (name == "BlockingIOError" and "[Errno 11]" in text) or "can't start new thread" in text:
            return "processes"
        return None
    return None


def classify(end: End, returncode: int, stderr: str, limits: Limits) -> Ending:
    """(status, exit_code, message, limit) for how a local sandbox ended.

    bwrap and the supervisor report a signal death as ``128 + N`` (so does a script that
    calls ``sys.exit(128 + N)``; the two cannot be told apart).
    """
    if end == "deadline":
        return (
            "timeout",
            None,
            f"execution timed out: {limits.describe('wall_time')} exceeded",
            "wall_time",
        )
    if end == "output_limit":
        return "killed", None, f"killed: {limits.describe('output')} exceeded", "output"
    sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if sig in signal.valid_signals() and sig > 0:
        if sig == signal.SIGXCPU:
            return "killed", -sig, f"killed: {limits.describe('cpu_time')} exceeded", "cpu_time"
        name = signal.Signals(sig).name
        meaning: dict[int, str] = {
            signal.SIGSEGV: " (segmentation fault)",
            signal.SIGBUS: " (bus error)",
        }
        return "killed", -sig, f"killed by signal {name}{meaning.get(sig, '')}", None
    return by_exit_code(returncode, stderr, limits)


def by_exit_code(exit_code: int, stderr: str, limits: Limits) -> Ending:
    """(status, exit_code, message, limit) for code that ended with ``exit_code`` (no signal):
    ``ok`` at 0, else ``error``, naming the limit when its traceback shows one."""
    if exit_code == 0:
        return "ok", 0, "", None
    limit = limit_from_traceback(stderr)
    message = f"error: {limits.describe(limit)} reached" if limit else ""
    return "error", exit_code, message, limit
