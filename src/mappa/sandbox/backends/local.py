"""What the two local backends (bwrap, process) share: start the guest program with the
code, read its output under the limits, stop it and everything it started, and turn the
way it ended into a status and a message naming the limit."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from mappa.sandbox.backends.base import Backend, Session
from mappa.sandbox.capture import Capture, End, pump
from mappa.sandbox.identity import (
    DEFAULT_UID_BASE,
    Identity,
    IdentityPool,
    Lease,
    kill_uid,
)
from mappa.sandbox.limits import LimitName, Limits
from mappa.sandbox.result import ExecutionResult, Status
from mappa.sandbox.workspace import changed_files, snapshot

GUEST_SOURCE = (Path(__file__).resolve().parent.parent / "guest.py").read_text()

_STOP_GRACE_S = 2.0


def sandbox_env(python: str, home: str) -> dict[str, str]:
    """The whole environment of agents' code: nothing inherited (API keys stay out).

    One thread per numeric library, since threads count against the process limit.
    """
    return {
        "PATH": f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


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
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # whatever is left in its group
            except (ProcessLookupError, PermissionError):
                pass
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


class LocalBackend(Backend):
    """A backend that runs the guest program as a local process (see ``guest.py``)."""

    supervised: ClassVar[bool]
    """Whether the guest must reap and clean up itself (no PID namespace to do it)."""
    stop_signal: ClassVar[signal.Signals]
    """What ends the sandbox at the deadline: the supervisor cleans up on SIGUSR1."""

    def __init__(self, python: str | None = None, uid_base: int = DEFAULT_UID_BASE) -> None:
        self.python = python or sys.executable
        self.uid_base = uid_base
        self._identities = IdentityPool(uid_base) if self.runs_as_sandbox_uid() else None

    @abstractmethod
    def runs_as_sandbox_uid(self) -> bool:
        """Whether code runs under a leased unprivileged uid (see ``identity``)."""

    @abstractmethod
    def _command(
        self, guest: list[str], workdir: Path, limits: Limits, env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """The argv and the environment to start ``guest`` with."""

    @abstractmethod
    def _scratch(self, identity: Identity | None) -> tuple[Path | None, str]:
        """A private HOME/TMPDIR to delete afterwards (or None), and its path for the code."""

    def _nproc_shared_with_user(self) -> bool:
        """The code's uid also runs the user's own processes, all counted by RLIMIT_NPROC."""
        return False

    def execute(self, code: str, workdir: Path, limits: Limits) -> ExecutionResult:
        workdir = Path(workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        before = snapshot(workdir)
        start = time.monotonic()
        with tempfile.TemporaryFile() as code_file:
            code_file.write(code.encode())
            code_file.flush()
            code_file.seek(0)
            run = self.start(workdir, limits, code_fd=code_file.fileno())
        try:
            out, err = Capture(limits.max_output_chars), Capture(limits.max_output_chars)
            end = run.read(out, err, start + limits.wall_time_s, limits)
            returncode = run.finish(clean=end == "eof")
        finally:
            run.release()
        stderr = err.text(limits.max_output_chars)
        status, exit_code, message, limit = classify(end, returncode, stderr, limits)
        return ExecutionResult(
            status=status,
            exit_code=exit_code,
            stdout=out.text(limits.max_output_chars),
            stderr=stderr,
            duration_s=time.monotonic() - start,
            files_changed=changed_files(before, snapshot(workdir)),
            message=message,
            limit=limit,
        )

    def open_session(self, workdir: Path, limits: Limits) -> Session:
        from mappa.sandbox.session import LocalSession

        return LocalSession(self, Path(workdir).resolve(), limits)

    def start(
        self, workdir: Path, limits: Limits, *, code_fd: int, reply_fd: int | None = None
    ) -> Running:
        """Start the guest in ``workdir``; with ``reply_fd`` it serves cells (persistent)."""
        pool = self._identities
        lease = pool.acquire() if pool is not None else None
        scratch: Path | None = None
        try:
            identity = None
            if pool is not None and lease is not None:
                identity = Identity(lease.uid, pool.workspace_gid(workdir))
            scratch, home = self._scratch(identity)
            guest = [self.python, "-I", "-B", "-c", GUEST_SOURCE]
            guest.append(json.dumps(self._guest_config(identity, limits, code_fd, reply_fd)))
            argv, env = self._command(guest, workdir, limits, sandbox_env(self.python, home))
            proc = subprocess.Popen(
                argv,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=[fd for fd in (code_fd, reply_fd) if fd is not None],
                start_new_session=True,
            )
        except BaseException:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            if lease is not None:
                lease.release()
            raise
        for stream in (proc.stdout, proc.stderr):
            assert stream is not None
            os.set_blocking(stream.fileno(), False)
        try:
            pidfd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            pidfd = None  # not Linux >= 5.3: the end is seen as EOF instead
        return Running(proc, lease, scratch, self.stop_signal, pidfd)

    def _guest_config(
        self, identity: Identity | None, limits: Limits, code_fd: int, reply_fd: int | None
    ) -> dict[str, object]:
        cpu = math.ceil(limits.cpu_time_s)
        rlimits = {
            "AS": [limits.memory_bytes, limits.memory_bytes],
            "FSIZE": [limits.file_size_bytes, limits.file_size_bytes],
            "NPROC": [limits.max_processes, limits.max_processes],
        }
        if reply_fd is None:  # a persistent interpreter re-arms the CPU limit per cell
            rlimits["CPU"] = [cpu, cpu + 1]  # SIGXCPU at the soft limit names the cause
        return {
            "supervise": self.supervised,
            "persistent": reply_fd is not None,
            "uid": identity.uid if identity else None,
            "gid": identity.gid if identity else None,
            "umask": 0o002 if identity else 0o022,
            "rlimits": rlimits,
            "nproc_relative": self._nproc_shared_with_user(),
            "code_fd": code_fd,
            "reply_fd": reply_fd,
            "cell_cpu_s": cpu,
        }


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


def classify(
    end: End, returncode: int, stderr: str, limits: Limits
) -> tuple[Status, int | None, str, LimitName | None]:
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
        meaning = {signal.SIGSEGV: " (segmentation fault)", signal.SIGBUS: " (bus error)"}
        return "killed", -sig, f"killed by signal {name}{meaning.get(sig, '')}", None
    if returncode == 0:
        return "ok", 0, "", None
    limit = limit_from_traceback(stderr)
    message = f"error: {limits.describe(limit)} reached" if limit else ""
    return "error", returncode, message, limit
