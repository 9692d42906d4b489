"""Which code made a run: the commit of mappa's source tree, noted by the run itself each time
it starts or resumes, so a record says what trained the run, not what copied it.

A run resumed under other code (an experiment that spans machines and sessions) has more
than one: ``run_dir/code.jsonl`` holds one line per start, ``{"from_step", "code"}``, and
``run_code`` reads it back as the commits in step order.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from mappa.jsonl import append_jsonl, read_jsonl

CODE_LOG = "code.jsonl"


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


def note_code(run_dir: Path, from_step: int) -> None:
    """Note in ``run_dir`` that the code running now trains it from ``from_step`` on."""
    append_jsonl(run_dir / CODE_LOG, [{"from_step": from_step, "code": source_revision()}])


def run_code(run_dir: Path) -> str | None:
    """The code that trained the run in ``run_dir``: one commit, or ``"A then B"`` when it was
    resumed under other code; ``None`` when it noted none (a run older than this log, or one
    never run from a checkout). A start that resumed from step s replaces what earlier
    starts noted from s on (their steps after the checkpoint were cut)."""
    path = run_dir / CODE_LOG
    kept: list[tuple[int, str | None]] = []
    for row in read_jsonl(path) if path.is_file() else []:
        step = int(row["from_step"])
        kept = [k for k in kept if k[0] < step] + [(step, row.get("code"))]
    codes: list[str | None] = []
    for _, code in kept:
        if not codes or codes[-1] != code:
            codes.append(code)
    if all(c is None for c in codes):
        return None
    return " then ".join(c or "unknown" for c in codes)
