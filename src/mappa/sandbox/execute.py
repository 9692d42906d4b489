"""Run one block of agent code in a fresh Python subprocess.

Isolation here is process-level: a scrubbed environment (no API keys leak into agent
code), the episode's workspace as working directory and HOME, a new session so a timeout
kills the whole process group, CPU-time and file-size rlimits, and output cut to a limit
with head and tail kept. Stronger isolation (bubblewrap) plugs in behind ``execute``.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

_CODE_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code_blocks(text: str) -> list[str]:
    """The ```python blocks of a message, in order (an unclosed last block counts)."""
    return [m.group(1).strip("\n") for m in _CODE_BLOCK.finditer(text) if m.group(1).strip()]


@dataclass(frozen=True)
class Limits:
    """Resource limits for one execution."""

    wall_time_s: float = 10.0
    cpu_time_s: int = 20
    file_size_bytes: int = 64 * 1024 * 1024
    max_output_chars: int = 8000


@dataclass
class ExecutionResult:
    status: Literal["ok", "error", "timeout"]
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    files_changed: dict[str, int] = field(default_factory=dict)

    def observation(self) -> str:
        """The text an agent (and the coach) sees as the tool turn."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append(self.stderr.rstrip("\n"))
        if self.status == "timeout":
            parts.append("[execution timed out]")
        elif not parts:
            parts.append("[no output]" if self.status == "ok" else f"[exit code {self.exit_code}]")
        return "\n".join(parts)


def cut_middle(text: str, limit: int, marker: str = "\n...[{n} chars cut]...\n") -> str:
    """Keep the head and tail of ``text`` within ``limit`` chars, marking what was cut."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return text[:head] + marker.format(n=len(text) - limit) + text[-tail:]


def _snapshot(workdir: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in workdir.rglob("*"):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(workdir))] = (st.st_size, st.st_mtime_ns)
    return out


def _clean_env(workdir: Path) -> dict[str, str]:
    """Only what Python needs: nothing from the parent (API keys stay out)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workdir),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "1",
    }


def execute(code: str, workdir: Path, limits: Limits | None = None) -> ExecutionResult:
    """Run ``code`` with ``python -`` in ``workdir``; never raises for the code's own faults."""
    limits = limits or Limits()
    workdir.mkdir(parents=True, exist_ok=True)
    before = _snapshot(workdir)

    def _limit() -> None:  # runs in the child before exec
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_time_s, limits.cpu_time_s))
        resource.setrlimit(
            resource.RLIMIT_FSIZE, (limits.file_size_bytes, limits.file_size_bytes)
        )

    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-"],
        cwd=workdir,
        env=_clean_env(workdir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_limit,
    )
    timed_out = False
    try:
        out, err = proc.communicate(code.encode(), timeout=limits.wall_time_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    else:
        # Children left running in the background die with the group.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    duration = time.monotonic() - start
    after = _snapshot(workdir)
    changed = {name: size for name, (size, mtime) in after.items() if before.get(name) != (size, mtime)}
    cap = limits.max_output_chars
    return ExecutionResult(
        status="timeout" if timed_out else ("ok" if proc.returncode == 0 else "error"),
        exit_code=None if timed_out else proc.returncode,
        stdout=cut_middle(out.decode(errors="replace"), cap),
        stderr=cut_middle(err.decode(errors="replace"), cap),
        duration_s=duration,
        files_changed=changed,
    )
