"""Which code made a run, and on what: the commit of mappa's source tree and the environment
(Python, the numeric libraries, the CPU), noted by the run itself each time it starts or
resumes, so a record says what trained the run, not what copied it.

A run resumed under other code or on another machine (an experiment that spans machines and
sessions) has more than one: ``run_dir/code.jsonl`` holds one line per start, ``{"from_step",
"code", "env"}``, and ``run_code`` / ``run_environments`` read it back in step order. A new
machine resolves a newer release of a library a range admits; the environment says so, and
``mappa experiment --reproduce`` tells whether it changes what a run does.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from mappa.jsonl import append_jsonl, read_jsonl

CODE_LOG = "code.jsonl"
PACKAGES = ("torch", "transformers", "peft", "accelerate", "vllm")
"""The libraries whose release can change a run's numbers (kernels, generation, LoRA)."""


def source_revision() -> str | None:
    """The git commit of mappa's source tree, ``+modified`` when its files differ from it;
    ``None`` when mappa is not run from a git checkout (an installed wheel)."""
    src = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        if head.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "-C", str(src), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
        )
    except OSError:  # no git
        return None
    return head.stdout.strip() + ("+modified" if status.stdout.strip() else "")


def _cpu() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment() -> dict[str, str]:
    """What runs the code: Python, the machine, the CPU and how many cores it has (a float
    sum over another thread count is another number), and the installed ``PACKAGES``
    (those not installed are left out)."""
    env = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": _cpu(),
        "cpus": str(os.cpu_count()),
    }
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):  # not installed: left out
            env[name] = metadata.version(name)
    return env


def environment_changes(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """What differs between two environments, one ``"name X -> Y"`` per key ("none" where
    one lacks it), ``before``'s keys first.

    >>> environment_changes({"python": "3.11.7", "torch": "2.13.0"},
    ...                     {"python": "3.11.7", "torch": "2.14.1", "vllm": "0.32.0"})
    ['torch 2.13.0 -> 2.14.1', 'vllm none -> 0.32.0']
    """
    keys = list(dict.fromkeys([*before, *now]))
    return [
        f"{k} {before.get(k, 'none')} -> {now.get(k, 'none')}"
        for k in keys
        if before.get(k) != now.get(k)
    ]


def note_code(run_dir: Path, from_step: int) -> None:
    """Note in ``run_dir`` that the code running now, on this environment, trains it from
    ``from_step`` on."""
    row = {"from_step": from_step, "code": source_revision(), "env": environment()}
    append_jsonl(run_dir / CODE_LOG, [row])


def _starts(run_dir: Path) -> list[dict[str, Any]]:
    """The starts noted in ``run_dir`` whose steps the run kept, in step order: a start
    that resumed from step s replaces what earlier starts noted from s on (their steps
    after the checkpoint were cut)."""
    path = run_dir / CODE_LOG
    kept: list[dict[str, Any]] = []
    for row in read_jsonl(path) if path.is_file() else []:
        step = int(row["from_step"])
        kept = [k for k in kept if int(k["from_step"]) < step] + [row]
    return kept


def _distinct(values: list[Any]) -> list[Any]:
    """``values`` without consecutive repeats."""
    out: list[Any] = []
    for v in values:
        if not out or out[-1] != v:
            out.append(v)
    return out


def run_environments(run_dir: Path) -> list[dict[str, str]]:
    """The environments that trained the run in ``run_dir``, in step order, one per change
    (empty for a run that noted none: older than this field)."""
    return _distinct([row["env"] for row in _starts(run_dir) if row.get("env")])


def run_code(run_dir: Path) -> str | None:
    """The code that trained the run in ``run_dir``: one commit, or ``"A then B"`` when it was
    resumed under other code; ``None`` when it noted none (a run older than this log, or one
    never run from a checkout)."""
    codes: list[str | None] = _distinct([row.get("code") for row in _starts(run_dir)])
    if all(c is None for c in codes):
        return None
    return " then ".join(c or "unknown" for c in codes)
