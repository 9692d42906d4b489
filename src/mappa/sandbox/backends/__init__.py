"""Execution backends behind one interface, and choosing one by name."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Literal

from mappa.sandbox.backends.base import Backend, SandboxUnavailable, Session
from mappa.sandbox.backends.bwrap import BwrapBackend, bwrap_path
from mappa.sandbox.backends.process import (
    ALLOW_UNISOLATED_ENV,
    ProcessBackend,
    SandboxIsolationWarning,
    check_isolation,
)
from mappa.sandbox.backends.sandboxfusion import SandboxFusionBackend
from mappa.sandbox.identity import DEFAULT_UID_BASE
from mappa.sandbox.limits import Limits

BackendName = Literal["auto", "bwrap", "process", "sandboxfusion"]

__all__ = [
    "ALLOW_UNISOLATED_ENV",
    "Backend",
    "BackendName",
    "BwrapBackend",
    "ProcessBackend",
    "SandboxFusionBackend",
    "SandboxIsolationWarning",
    "SandboxUnavailable",
    "Session",
    "bwrap_problem",
    "check_isolation",
    "make_backend",
]


@functools.cache
def bwrap_problem(python: str | None = None, uid_base: int = DEFAULT_UID_BASE) -> str | None:
    """Why bwrap cannot run code here, or None when it can (probed once: a real run)."""
    if bwrap_path() is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        with tempfile.TemporaryDirectory(prefix="mappa-bwrap-probe-") as d:
            result = BwrapBackend(python, uid_base).execute("print(6 * 7)", Path(d), Limits())
    except OSError as e:
        return f"bwrap could not start: {e}"
    if result.stdout.strip() != "42":
        return f"bwrap does not work here: {(result.stderr or result.message).strip()[-500:]}"
    return None


def make_backend(
    name: BackendName = "auto",
    *,
    python: str | None = None,
    uid_base: int = DEFAULT_UID_BASE,
    sandboxfusion_url: str = "http://localhost:8080",
) -> Backend:
    """The backend called ``name``; ``auto`` is bwrap when it works here, else process.

    The process backend is refused (``SandboxUnavailable``) where it would run code as this
    process's own uid, unless ``MAPPA_ALLOW_UNISOLATED=1`` (``process.check_isolation``).
    """
    if name == "sandboxfusion":
        return SandboxFusionBackend(sandboxfusion_url)
    if name in ("auto", "bwrap"):
        problem = bwrap_problem(python, uid_base)
        if problem is None:
            return BwrapBackend(python, uid_base)
        if name == "bwrap":
            raise SandboxUnavailable(problem)
        try:
            check_isolation(python, uid_base)
        except SandboxUnavailable as err:
            raise SandboxUnavailable(f"bwrap cannot run here ({problem}), and {err}") from None
    else:
        check_isolation(python, uid_base)
    return ProcessBackend(python, uid_base)
