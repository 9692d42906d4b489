"""The fallback backend: a plain subprocess with rlimits and a scrubbed environment.

Isolation is weaker than bwrap's and a warning says so once per process: the code sees the
host's filesystem (everything its uid may read), world-writable places such as /tmp, and
the network. What it does get: a cleared environment, the rlimits, a private HOME/TMPDIR,
and a supervisor (see ``guest.py``) that reaps and kills everything the code started.

As root, the code runs as a leased unprivileged uid (process limit enforced, root's files
and processes out of reach) when the interpreter is readable by such a uid. If it is not
(e.g. a pyenv under /root, mode 0700) the code runs as root: the process limit cannot be
enforced and it can do anything root can; use bwrap, or an interpreter outside /root.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import tempfile
import warnings
from pathlib import Path

from mappa.sandbox.backends.local import LocalBackend, sandbox_env
from mappa.sandbox.identity import DEFAULT_UID_BASE, Identity, host_is_root
from mappa.sandbox.limits import Limits


class SandboxIsolationWarning(UserWarning):
    """Agents' code runs with weaker isolation than the bwrap backend gives."""


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
