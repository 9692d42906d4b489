"""Which uid and gid agents' code runs as, and what that buys.

When the host runs as root, sandboxed code must not: the kernel exempts root from
``RLIMIT_NPROC`` (a fork bomb would fill the pid table), root-owned secret files would be
readable, and root may signal any process. So each running sandbox leases its own unused uid
(``uid_base + 1 + slot``), held by one sandbox at a time across processes too (an ``flock``
per slot), which makes per-uid counting and per-uid killing per-sandbox. Each workspace gets
a group of its own (from ``uid_base + 2048``), shared by every agent of that episode like a
team directory and by no other episode. Not root: code runs as the user (bwrap's user
namespace keeps it apart).
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import signal
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_UID_BASE = 2_000_000_000
"""Far above any uid a distribution or a container's user map hands out; checked unused."""

_SHARED_DIR_MODE = 0o2770  # setgid: new files join the episode's group; nobody else gets in
_SLOTS = 1024
_GROUP_OFFSET = 2048
_GROUPS = 1 << 20  # reused round-robin: a clash needs a million newer workspaces in use


def host_is_root() -> bool:
    return os.geteuid() == 0


@dataclass(frozen=True)
class Identity:
    """The uid one sandbox runs as and the group of the workspace it runs in."""

    uid: int
    gid: int


class Lease:
    """Exclusive use of one sandbox uid until ``release()``."""

    def __init__(self, uid: int, lock_fd: int) -> None:
        self.uid = uid
        self._fd: int | None = lock_fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


class IdentityPool:
    """Hands out sandbox uids (blocking when all ``slots`` are busy) and workspace groups."""

    def __init__(self, uid_base: int = DEFAULT_UID_BASE, slots: int = _SLOTS) -> None:
        self.uid_base = uid_base
        self.slots = slots
        self.group_base = uid_base + _GROUP_OFFSET
        self._lock_dir = Path(tempfile.gettempdir()) / f"mappa-sandbox-{os.geteuid()}"
        self._checked: set[tuple[str, int]] = set()
        self._mutex = threading.Lock()

    def acquire(self, timeout_s: float = 60.0) -> Lease:
        lock_dir = self._ensure_lock_dir()
        give_up = time.monotonic() + timeout_s
        while True:
            for slot in range(self.slots):
                fd = _open_lock(lock_dir / f"slot-{slot}.lock")
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                uid = self.uid_base + 1 + slot
                try:
                    self._require_unused("user", uid)
                except RuntimeError:
                    os.close(fd)
                    raise
                return Lease(uid, fd)
            if time.monotonic() > give_up:
                raise TimeoutError(f"all {self.slots} sandbox uids are in use")
            time.sleep(0.01)

    def workspace_gid(self, path: Path) -> int:
        """The group of workspace ``path``, giving it a fresh one (and sharing the directory
        with it) the first time. Cheap afterwards: one stat."""
        st = os.stat(path)
        if self.group_base <= st.st_gid < self.group_base + _GROUPS and (
            stat.S_IMODE(st.st_mode) == _SHARED_DIR_MODE
        ):
            return st.st_gid
        gid = self._next_gid()
        _share(path, gid)
        return gid

    def _next_gid(self) -> int:
        fd = _open_lock(self._ensure_lock_dir() / "next-group")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            n = int(os.pread(fd, 32, 0) or b"0")
            os.pwrite(fd, str((n + 1) % _GROUPS).encode().ljust(32), 0)
        finally:
            os.close(fd)
        gid = self.group_base + n
        self._require_unused("group", gid)
        return gid

    def _require_unused(self, kind: str, ident: int) -> None:
        """Refuse ids that belong to someone: every process of a sandbox uid gets killed."""
        with self._mutex:
            if (kind, ident) in self._checked:
                return
        try:
            name = pwd.getpwuid(ident).pw_name if kind == "user" else grp.getgrgid(ident).gr_name
        except KeyError:
            with self._mutex:
                self._checked.add((kind, ident))
            return
        raise RuntimeError(f"sandbox {kind} id {ident} belongs to {name!r}: set sandbox.uid_base")

    def _ensure_lock_dir(self) -> Path:
        self._lock_dir.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(self._lock_dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise PermissionError(f"{self._lock_dir} is not a directory owned by us")
        return self._lock_dir


def _open_lock(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)


def _share(path: Path, gid: int) -> None:
    """Give ``path`` and its contents to group ``gid``, group-writable, setgid directories:
    files the sandboxes create inherit the group and, with umask 002, stay writable for the
    next agent of the episode."""
    for root, dirs, files in os.walk(path):
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chown(p, -1, gid)
                os.chmod(p, stat.S_IMODE(os.stat(p).st_mode) | 0o660)
        for name in dirs:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chown(p, -1, gid)
                os.chmod(p, _SHARED_DIR_MODE)
    os.chown(path, -1, gid)
    os.chmod(path, _SHARED_DIR_MODE)


def kill_uid(uid: int, rounds: int = 50) -> int:
    """SIGKILL every live process whose real uid is ``uid``; returns how many were signalled.

    Repeats until a scan finds none: a process forked just before its parent was killed
    shows up in the next scan, and a killed process cannot fork again.
    """
    killed = 0
    for _ in range(rounds):
        found = _pids_of(uid)
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.001)
    return killed


def _pids_of(uid: int) -> list[int]:
    """Live (not zombie) processes with real uid ``uid``; /proc ownership is not reliable
    for this, since a process that changed uid is not dumpable and shows as root."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                state = real_uid = None
                for line in f:
                    if line.startswith("State:"):
                        state = line.split()[1]
                    elif line.startswith("Uid:"):
                        real_uid = int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue
        if real_uid == uid and state != "Z":
            pids.append(int(entry))
    return pids
