"""The interface every execution backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Protocol

from mappa.sandbox.limits import Limits
from mappa.sandbox.result import ExecutionResult


class SandboxUnavailable(RuntimeError):
    """A backend that was asked for by name cannot run on this machine; says why."""


class Session(Protocol):
    """A persistent interpreter: cells share variables, like a notebook."""

    def run(self, code: str) -> ExecutionResult: ...

    def close(self) -> None: ...


class Backend(ABC):
    """Runs one block of code in a workspace under limits; never raises for the code's faults."""

    name: ClassVar[str]

    @abstractmethod
    def execute(self, code: str, workdir: Path, limits: Limits) -> ExecutionResult:
        """Run ``code`` as a fresh script with ``workdir`` as its (only writable) directory."""

    def open_session(self, workdir: Path, limits: Limits) -> Session:
        """A persistent interpreter in ``workdir`` with the same isolation as ``execute``."""
        raise SandboxUnavailable(f"the {self.name} backend has no persistent mode")
