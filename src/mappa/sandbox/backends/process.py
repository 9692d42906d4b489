"""The fallback backend: a plain subprocess with rlimits and a scrubbed environment.

Isolation is weaker than bwrap's and a warning says so once per process: the code sees the
host's filesystem (everything its uid may read), world-writable places such as /tmp, and
the network. What it does get: a cleared environment, the rlimits, a private HOME/TMPDIR,
and a supervisor (see ``guest.py``) that reaps and kills everything the code started.

As root, the code runs as a leased unprivileged uid (process limit enforced, root's files
and processes out of reach) when the interpreter is readable by such a uid. If it is not
(e.g. a pyenv under /root, mode 0700) the code runs as root: the process limit cannot be
enforced and it can do anything root can; use bwrap, or an interpreter outside /root.

**Secrets.** The code's own environment is cleared, but a process may read
``/proc/<pid>/environ`` of any process of its own uid: code that runs as the trainer's uid
(not root, or root with an unreadable interpreter) can read the trainer's API keys there.
``make_backend`` refuses that *unisolated* mode unless ``MAPPA_ALLOW_UNISOLATED=1`` is set
(``check_isolation``); run as a sandbox uid, root's ``/proc/<pid>/environ`` is unreadable.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from mappa.sandbox.backends.base import SandboxUnavailable
from mappa.sandbox.backends.local import LocalBackend, sandbox_env
from mappa.sandbox.identity import DEFAULT_UID_BASE, Identity, host_is_root
from mappa.sandbox.limits import Limits


class SandboxIsolationWarning(UserWarning):
    """Agents' code runs with weaker isolation than the bwrap backend gives."""


ALLOW_UNISOLATED_ENV = "MAPPA_ALLOW_UNISOLATED"
"""Set to ``1`` to accept the process backend running code as the trainer's own uid."""


def unisolated_reason(python: str | None = None, uid_base: int = DEFAULT_UID_BASE) -> str | None:
    """Why the process backend would run code as this process's own uid (None: it does not,
    the code runs as a leased sandbox uid)."""
    python = python or sys.executable
    if not host_is_root():
        return "mappa is not running as root, so the code would run as this user's own uid"
    if not _usable_by_other_uid(python, uid_base):
        return f"{python} is not readable by an unprivileged uid, so the code would run as root"
    return None


def check_isolation(python: str | None = None, uid_base: int = DEFAULT_UID_BASE) -> None:
    """Refuse the unisolated process backend unless ``MAPPA_ALLOW_UNISOLATED=1`` opts in.

    Raises ``SandboxUnavailable`` saying why: code of the trainer's uid can read the
    trainer's environment (API keys) through ``/proc/<pid>/environ``.
    """
    reason = unisolated_reason(python, uid_base)
    if reason is None or os.environ.get(ALLOW_UNISOLATED_ENV) == "1":
        return
    raise SandboxUnavailable(
        f"the process sandbox backend would not isolate agents' code: {reason}, which lets "
        "the code read this process's environment (API keys) through /proc/<pid>/environ "
        "and every file this uid can read. Use sandbox.backend=bwrap (Debian/Ubuntu: "
        "apt-get install bubblewrap), or run as root with an interpreter an unprivileged "
        f"uid can read, or set {ALLOW_UNISOLATED_ENV}=1 to accept the risk"
    )


_warned = False


class ProcessBackend(LocalBackend):
    name = "process"
    supervised = True
    stop_signal = signal.SIGUSR1  # the supervisor kills and reaps everything, then exits

    def __init__(self, python: str | None = None, uid_base: int = DEFAULT_UID_BASE) -> None:
        super().__init__(python, uid_base)
        _warn_once(self)

    def runs_as_sandbox_uid(self) -> bool:
        return host_is_root() and _usable_by_other_uid(self.python, self.uid_base)

    def _nproc_shared_with_user(self) -> bool:
        return not host_is_root()

    def _scratch(self, identity: Identity | None) -> tuple[Path | None, str]:
        scratch = Path(tempfile.mkdtemp(prefix="mappa-sandbox-home-"))
        if identity is not None:
            os.chown(scratch, identity.uid, identity.gid)
        return scratch, str(scratch)

    def _command(
        self, guest: list[str], workdir: Path, limits: Limits, env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        return guest, env

    def weaknesses(self) -> list[str]:
        """What this backend does not prevent here, for the warning and the docs."""
        out = [
            "the code can read every file its uid can read"
            " and write world-writable places such as /tmp",
            "the code can use the network",
        ]
        if host_is_root() and not self.runs_as_sandbox_uid():
            out += [
                f"the code runs as root ({self.python} is not readable by an unprivileged uid), "
                "so the process limit is not enforced and it can kill or read anything",
            ]
        elif not host_is_root():
            out += ["the code can signal this user's other processes"]
        if not self.runs_as_sandbox_uid():
            out += [
                "the code runs as this process's uid, so it can read this process's "
                "environment (API keys) through /proc/<pid>/environ"
            ]
        return out


def _warn_once(backend: ProcessBackend) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        "mappa.sandbox: agents' code runs with the 'process' backend, NOT isolated: "
        + "; ".join(backend.weaknesses())
        + ". Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)"
        " for sandbox.backend=bwrap.",
        SandboxIsolationWarning,
        stacklevel=3,
    )


@functools.cache
def _usable_by_other_uid(python: str, uid: int) -> bool:
    """Can an unprivileged uid start ``python`` and import the standard library?"""
    try:
        return (
            subprocess.run(
                [python, "-I", "-c", "import encodings, json, pickle"],
                user=uid,
                group=uid,
                extra_groups=[],
                cwd="/",
                env=sandbox_env(python, "/"),
                capture_output=True,
                timeout=30,
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False
