"""The default backend on Linux: bubblewrap (Debian package ``bubblewrap``).

The sandbox sees a new root with the system (``/usr``, ``/etc``, the Python installation)
read-only, the episode's workspace read-write at its real path, and nothing else of the
host: no home directory, no other episode's workspace, a private ``/tmp``, a new PID
namespace (pid 1 is bwrap's reaper: when the code's process ends, everything it left is
killed with the namespace), no network (only a loopback of its own), a cleared environment.

As root, bwrap runs without a user namespace (it would map the code back to root) and keeps
only CAP_SETUID/CAP_SETGID, which the guest uses to drop to a leased unprivileged uid before
running any agent code; as any other user, bwrap creates a user namespace (``--unshare-all``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

from mappa.sandbox.backends.local import LocalBackend
from mappa.sandbox.identity import Identity, host_is_root
from mappa.sandbox.limits import Limits

_SYSTEM_TREES = ("/usr", "/etc")
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class BwrapBackend(LocalBackend):
    name = "bwrap"
    supervised = False  # the PID namespace reaps and kills
    stop_signal = signal.SIGKILL  # bwrap's --die-with-parent takes the namespace down with it

    def runs_as_sandbox_uid(self) -> bool:
        return host_is_root()

    def _scratch(self, identity: Identity | None) -> tuple[Path | None, str]:
        return None, "/tmp"  # private tmpfs, gone with the sandbox

    def _command(
        self, guest: list[str], workdir: Path, limits: Limits, env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        args = ["bwrap", *_system_mounts(), "--proc", "/proc", "--dev", "/dev"]
        for tmp in ("/tmp", "/dev/shm"):
            if _version() >= (0, 7):
                args += ["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", tmp]
            else:  # older bwrap cannot bound a tmpfs
                args += ["--tmpfs", tmp, "--chmod", "1777", tmp]
        # After the private /tmp: an interpreter (a venv) that lives under /tmp is mounted
        # on top of it rather than hidden by it.
        args += _python_mounts(self.python)
        w = str(workdir)
        args += [*_dirs_above(w), "--bind", w, w, "--chdir", w]
        if host_is_root():
            args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
            args += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            args += ["--unshare-all"]
        args += ["--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv"]
        for key, value in env.items():
            args += ["--setenv", key, value]
        return [*args, "--", *guest], {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@functools.cache
def _version() -> tuple[int, ...]:
    out = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


@functools.cache
def _system_mounts() -> tuple[str, ...]:
    """/usr and /etc read-only; /bin, /lib... as the symlinks or directories they are here."""
    args: list[str] = []
    for tree in _SYSTEM_TREES:
        args += ["--ro-bind-try", tree, tree]
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return tuple(args)


def _covered(path: str, roots: list[str] | tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


@functools.cache
def _python_mounts(python: str) -> tuple[str, ...]:
    """The interpreter's installation (and its venv) read-only, wherever it lives, under both
    its real and its symlinked paths (a venv is found by the path it was started from)."""
    query = "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix]))"
    out = subprocess.run([python, "-I", "-c", query], capture_output=True, text=True, check=True)
    paths = {*json.loads(out.stdout), os.path.dirname(python)}
    paths |= {os.path.realpath(p) for p in paths}
    paths.add(os.path.dirname(os.path.realpath(python)))
    system = (*_SYSTEM_TREES, *_SYSTEM_LINKS)
    roots = sorted(p for p in paths if not _covered(p, system))
    roots = [p for p in roots if not _covered(p, [r for r in roots if r != p])]
    args: list[str] = []
    for root in roots:
        args += [*_dirs_above(root), "--ro-bind", root, root]
    return tuple(args)


def _dirs_above(path: str) -> list[str]:
    """``--dir`` for each missing ancestor: bwrap would create them mode 0700, which the
    unprivileged sandbox uid could not cross."""
    parts = Path(path).parents
    return [
        arg
        for parent in reversed(parts)
        if str(parent) != "/" and not _covered(str(parent), (*_SYSTEM_TREES, *_SYSTEM_LINKS))
        for arg in ("--dir", str(parent))
    ]
