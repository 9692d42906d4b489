"""What the two local backends (bwrap, process) share: start the guest program with the
code in a sandbox of the subclass's making, and run one block to the end (see ``running``
for reading, stopping and classifying it; ``session`` for the persistent mode)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from abc import abstractmethod
from pathlib import Path
from typing import ClassVar

from mappa.sandbox.backends.base import Backend, Session
from mappa.sandbox.capture import Capture
from mappa.sandbox.identity import DEFAULT_UID_BASE, Identity, IdentityPool
from mappa.sandbox.limits import Limits
from mappa.sandbox.result import ExecutionResult, RunWatch
from mappa.sandbox.running import Running, classify

GUEST_SOURCE = (Path(__file__).resolve().parent.parent / "guest.py").read_text()


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
        watch = RunWatch.begin(workdir)
        with tempfile.TemporaryFile() as code_file:
            code_file.write(code.encode())
            code_file.flush()
            code_file.seek(0)
            run = self.start(workdir, limits, code_fd=code_file.fileno())
        try:
            out, err = Capture(limits.max_output_chars), Capture(limits.max_output_chars)
            end = run.read(out, err, watch.start + limits.wall_time_s, limits)
            returncode = run.finish(clean=end == "eof")
        finally:
            run.release()
        stderr = err.text(limits.max_output_chars)
        status, exit_code, message, limit = classify(end, returncode, stderr, limits)
        stdout = out.text(limits.max_output_chars)
        return watch.result(status, exit_code, stdout, stderr, message, limit)

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
