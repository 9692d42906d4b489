"""``execute()``: run one block of agent code, isolated and limited, in a workspace.

The one-call entry point; the runner uses ``SandboxPool`` with a configured backend. The
default backend is chosen once per process (``auto``: bwrap when it works, else process).
"""

from __future__ import annotations

import functools
from pathlib import Path

from mappa.sandbox.backends import Backend, make_backend
from mappa.sandbox.limits import Limits
from mappa.sandbox.result import ExecutionResult

__all__ = ["default_backend", "execute"]


@functools.cache
def default_backend() -> Backend:
    return make_backend("auto")


def execute(code: str, workdir: Path, limits: Limits | None = None) -> ExecutionResult:
    """Run ``code`` as a fresh script in ``workdir``; never raises for the code's own faults."""
    return default_backend().execute(code, Path(workdir), limits or Limits())
