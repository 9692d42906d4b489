"""An episode's shared working directory, and who made each file in it.

All agents of one episode run in the same directory (the DSBench contract: the Data
Engineer's ``X_train.pkl`` is there for the Modeler). The coach is told which agent and
which action produced each file, so blame for a missing or broken file lands on its maker.
"""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

Snapshot = dict[str, tuple[int, int, int]]
"""Workspace-relative name -> (size, mtime_ns, inode) of every regular file."""


def snapshot(root: Path) -> Snapshot:
    """Regular files under ``root``. Symlinks are neither followed nor listed: code in the
    sandbox could point them anywhere on the host."""
    out: Snapshot = {}
    for dirpath, _dirnames, filenames in os.walk(root):  # does not descend into symlinks
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def changed_files(before: Snapshot, after: Snapshot) -> dict[str, int]:
    """Name -> size of the files created or modified between two snapshots."""
    return {name: meta[0] for name, meta in sorted(after.items()) if before.get(name) != meta}


@dataclass(frozen=True)
class Author:
    """Who wrote a file: an agent's action (``turn`` counts from 0), or the task itself."""

    agent: str
    turn: int | None = None

    def __str__(self) -> str:
        return self.agent if self.turn is None else f"{self.agent} (action {self.turn + 1})"


TASK = Author("task")
"""Files present when the workspace was opened: the task's inputs."""
OUTSIDE = Author("outside the sandbox")
"""Files that appeared between runs, written by the host."""


@dataclass
class FileRecord:
    size: int
    created_by: Author
    modified_by: Author


class Workspace:
    """One episode's directory plus the provenance of its files.

    ``lock`` serializes runs in one workspace: blocks of one episode depend on each other.
    """

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path.resolve()
        self.lock = threading.Lock()
        self.files: dict[str, FileRecord] = {
            name: FileRecord(meta[0], TASK, TASK)
            for name, meta in sorted(snapshot(self.path).items())
        }

    def record(self, files_changed: dict[str, int], author: Author) -> None:
        """Update provenance after a run by ``author`` that changed ``files_changed``."""
        present = snapshot(self.path)
        for name in [n for n in self.files if n not in present]:
            del self.files[name]  # deleted by the run
        for name, meta in present.items():
            if name not in self.files and name not in files_changed:
                self.files[name] = FileRecord(meta[0], OUTSIDE, OUTSIDE)
        for name, size in files_changed.items():
            if name not in present:
                continue  # written, then removed again in the same run
            record = self.files.get(name)
            if record is None:
                self.files[name] = FileRecord(size, author, author)
            else:
                record.size = size
                record.modified_by = author

    def describe(self) -> str:
        """One line per file, for the coach and later agents."""
        if not self.files:
            return "(no files)"
        lines = []
        for name, rec in sorted(self.files.items()):
            line = f"{name} ({rec.size} bytes): created by {rec.created_by}"
            if rec.modified_by != rec.created_by:
                line += f", last modified by {rec.modified_by}"
            lines.append(line)
        return "\n".join(lines)

    def read_bytes(self, name: str) -> bytes:
        """A file's content, refusing anything that leads out of the workspace (a symlink
        the code planted, ``..``): the host reads these files, e.g. to score a submission."""
        path = self.path / name
        if path.resolve() != path or not path.is_relative_to(self.path):
            raise PermissionError(f"{name!r} leaves the workspace")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            return f.read()
