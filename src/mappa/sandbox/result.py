"""What one execution produced, and the text an agent (and the coach) is shown for it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mappa.sandbox.limits import LimitName
from mappa.sandbox.workspace import Snapshot, changed_files, snapshot

Status = Literal["ok", "error", "timeout", "killed"]
"""``ok``: exit 0. ``error``: non-zero exit (an exception, or a limit the code saw as an
error such as MemoryError). ``timeout``: wall time ran out. ``killed``: ended by a signal
(segfault, CPU limit) or stopped for flooding output."""


@dataclass
class ExecutionResult:
    """The outcome of one code block; ``message`` names the limit when one was hit."""

    status: Status
    exit_code: int | None
    """Process exit code; ``-N`` when killed by signal N; ``None`` when stopped by us."""
    stdout: str
    stderr: str
    duration_s: float
    files_changed: dict[str, int] = field(default_factory=dict)
    """Workspace-relative name -> size of every regular file this run created or modified."""
    message: str = ""
    """Why the run ended abnormally, in words an agent can act on."""
    limit: LimitName | None = None
    """The limit that ended the run, if one did (for statistics and tests)."""

    def observation(self) -> str:
        """The text an agent (and the coach) sees as the tool turn."""
        parts = [s.rstrip("\n") for s in (self.stdout, self.stderr) if s]
        if self.message:
            parts.append(f"[{self.message}]")
        elif not parts:
            parts.append("[no output]" if self.status == "ok" else f"[exit code {self.exit_code}]")
        return "\n".join(parts)


@dataclass
class RunWatch:
    """The workspace and the clock as a run begins; ``result`` adds what the run changed in
    the workspace and how long it took."""

    workdir: Path
    before: Snapshot
    start: float

    @classmethod
    def begin(cls, workdir: Path, start: float | None = None) -> RunWatch:
        """Create ``workdir`` if needed and take its snapshot; the clock starts now, or at
        ``start`` when the caller started it earlier (e.g. to set a deadline)."""
        workdir.mkdir(parents=True, exist_ok=True)
        before = snapshot(workdir)
        return cls(workdir, before, time.monotonic() if start is None else start)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def result(
        self,
        status: Status,
        exit_code: int | None,
        stdout: str,
        stderr: str,
        message: str = "",
        limit: LimitName | None = None,
    ) -> ExecutionResult:
        return ExecutionResult(
            status=status,
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            duration_s=self.elapsed(),
            files_changed=changed_files(self.before, snapshot(self.workdir)),
            message=message,
            limit=limit,
        )
