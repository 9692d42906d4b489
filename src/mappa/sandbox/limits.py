"""Resource limits for one execution of agent code.

Every limit exists because agents' code runs unattended thousands of times on the user's
machine: one bad block must end quickly, with a message naming the limit it hit, and must
not take memory, processes or disk from the training job beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

LimitName = Literal["wall_time", "cpu_time", "memory", "processes", "file_size", "output"]


def format_bytes(n: int) -> str:
    """``2147483648 -> '2 GiB'``: limits are shown to agents, so keep them readable."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class Limits:
    """What one execution may use. Defaults suit the paper's pipelines on a laptop.

    Memory is bounded per process (``RLIMIT_AS``), processes per sandbox; without cgroups
    the worst case for one sandbox is therefore ``memory_bytes * max_processes``.
    """

    wall_time_s: float = 10.0
    """Real time until the whole sandbox is killed (status ``timeout``)."""
    cpu_time_s: float = 20.0
    """CPU seconds per process (``RLIMIT_CPU``); the kernel stops it with SIGXCPU."""
    memory_bytes: int = 2 * GiB
    """Address space per process (``RLIMIT_AS``); allocations beyond it fail (MemoryError)."""
    max_processes: int = 16
    """Processes and threads of one sandbox (``RLIMIT_NPROC``, per sandbox uid/namespace)."""
    file_size_bytes: int = 256 * MiB
    """Largest file the code may write (``RLIMIT_FSIZE``); bigger writes fail with EFBIG."""
    tmp_bytes: int = 256 * MiB
    """Size of the private ``/tmp`` and ``/dev/shm`` (bwrap): they live in RAM."""
    max_output_chars: int = 8000
    """Characters of stdout and of stderr kept (head and tail, with a marker between)."""
    max_output_bytes: int = 8 * MiB
    """Bytes of stdout+stderr read before the sandbox is killed (status ``killed``)."""

    def __post_init__(self) -> None:
        for name in ("wall_time_s", "cpu_time_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be > 0")
        for name in ("memory_bytes", "max_processes", "file_size_bytes", "tmp_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be >= 1")
        if self.max_output_chars < 2 or self.max_output_bytes < self.max_output_chars:
            raise ValueError("Limits: need 2 <= max_output_chars <= max_output_bytes")

    def describe(self, limit: LimitName) -> str:
        """The limit as an agent reads it, e.g. ``'wall time limit of 10 s'``."""
        return {
            "wall_time": f"wall time limit of {self.wall_time_s:g} s",
            "cpu_time": f"CPU time limit of {self.cpu_time_s:g} s",
            "memory": f"memory limit of {format_bytes(self.memory_bytes)} per process",
            "processes": f"process limit of {self.max_processes} processes/threads",
            "file_size": f"file size limit of {format_bytes(self.file_size_bytes)}",
            "output": f"output limit of {format_bytes(self.max_output_bytes)}",
        }[limit]
