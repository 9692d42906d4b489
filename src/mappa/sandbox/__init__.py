"""Execution of agents' code: isolated, limited, in a workspace shared by one episode.

``execute(code, workdir, limits)`` runs one block; ``SandboxPool`` runs many episodes' blocks
in parallel with a chosen backend (``bwrap`` by default on Linux, ``process`` as fallback,
``sandboxfusion`` over HTTP) and mode (stateless scripts or a persistent interpreter per
agent); ``Workspace`` records which agent and action made each file.
"""

from mappa.sandbox.backends import (
    Backend,
    BackendName,
    BwrapBackend,
    ProcessBackend,
    SandboxFusionBackend,
    SandboxIsolationWarning,
    SandboxUnavailable,
    Session,
    bwrap_problem,
    make_backend,
)
from mappa.sandbox.blocks import extract_code_blocks
from mappa.sandbox.execute import default_backend, execute
from mappa.sandbox.limits import Limits
from mappa.sandbox.pool import Job, Mode, SandboxPool
from mappa.sandbox.result import ExecutionResult, Status
from mappa.sandbox.workspace import Author, FileRecord, Workspace

__all__ = [
    "Author",
    "Backend",
    "BackendName",
    "BwrapBackend",
    "ExecutionResult",
    "FileRecord",
    "Job",
    "Limits",
    "Mode",
    "ProcessBackend",
    "SandboxFusionBackend",
    "SandboxIsolationWarning",
    "SandboxPool",
    "SandboxUnavailable",
    "Session",
    "Status",
    "Workspace",
    "bwrap_problem",
    "default_backend",
    "execute",
    "extract_code_blocks",
    "make_backend",
]
