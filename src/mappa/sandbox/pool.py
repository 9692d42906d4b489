"""Running the code of many episodes at once, with results back in order.

A rollout step executes one agent's blocks for every episode in the batch; the episodes
are independent, so they run in parallel on a bounded number of threads (each waits on a
sandboxed process). Within one job (one action of one agent in one episode) blocks run in
order, since each may use the files or variables the previous one made. The pool also
owns the persistent interpreters (mode ``persistent``): one per agent per episode.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mappa.sandbox.backends.base import Backend, Session
from mappa.sandbox.limits import Limits
from mappa.sandbox.result import ExecutionResult
from mappa.sandbox.workspace import Author, Workspace

Mode = Literal["stateless", "persistent"]


@dataclass(frozen=True)
class Job:
    """The code blocks of one action: ``agent``'s action number ``turn`` in ``workspace``."""

    workspace: Workspace
    agent: str
    turn: int
    blocks: Sequence[str]


class SandboxPool:
    """Runs jobs on at most ``size`` sandboxes at once; records file provenance.

    Threads live as long as the pool: a persistent interpreter dies with the thread that
    started it (bwrap's ``--die-with-parent``), so call ``close()`` when done.
    """

    def __init__(
        self, backend: Backend, limits: Limits, size: int = 4, mode: Mode = "stateless"
    ) -> None:
        if size < 1:
            raise ValueError("pool size must be >= 1")
        self.backend = backend
        self.limits = limits
        self.mode = mode
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="sandbox")
        self._sessions: dict[tuple[Path, str], Session] = {}
        self._sessions_lock = threading.Lock()

    def run(self, jobs: Sequence[Job]) -> list[list[ExecutionResult]]:
        """Each job's results (one per block), in the order of ``jobs``."""
        return list(self._executor.map(self.run_job, jobs))

    def run_job(self, job: Job) -> list[ExecutionResult]:
        author = Author(job.agent, job.turn)
        results = []
        with job.workspace.lock:
            for code in job.blocks:
                result = self._execute(code, job)
                job.workspace.record(result.files_changed, author)
                results.append(result)
        return results

    def _execute(self, code: str, job: Job) -> ExecutionResult:
        if self.mode == "stateless":
            return self.backend.execute(code, job.workspace.path, self.limits)
        key = (job.workspace.path, job.agent)
        with self._sessions_lock:
            session = self._sessions.get(key)
            if session is None:
                session = self._sessions[key] = self.backend.open_session(
                    job.workspace.path, self.limits
                )
        return session.run(code)

    def end(self, workspace: Workspace, agent: str | None = None) -> None:
        """Close the persistent interpreters of ``workspace`` (of one ``agent``, if given)."""
        with self._sessions_lock:
            keys = [k for k in self._sessions if k[0] == workspace.path and agent in (None, k[1])]
            sessions = [self._sessions.pop(k) for k in keys]
        for session in sessions:
            session.close()

    def close(self) -> None:
        with self._sessions_lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session.close()
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
