"""Durable JSONL appends: every line is flushed and fsynced before the call returns.

A process killed in the middle of an append can leave a *torn* last line (no trailing
newline, or not valid JSON). Readers skip it with a warning (``read_jsonl``); the next
append first cuts it off (``repair_jsonl``), so the file never holds a torn line in the
middle. ``truncate_jsonl`` cuts a file back to a byte offset (``mappa train --resume``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def repair_jsonl(path: Path) -> int:
    """Cut a torn last line (one without its newline) off ``path``; returns the bytes cut.

    Only the tail after the last newline can be torn: every append writes whole lines and
    fsyncs before returning. A missing file needs no repair.
    """
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb") as fh:
        keep, block = size, 1 << 16
        while keep > 0:  # search backwards for the last newline
            start = max(0, keep - block)
            fh.seek(start)
            chunk = fh.read(keep - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            keep = start
    if keep == size:
        return 0
    log.warning("%s: cutting a torn last line (%d bytes) before appending", path, size - keep)
    truncate_jsonl(path, keep)
    return size - keep


def truncate_jsonl(path: Path, offset: int) -> None:
    """Cut ``path`` back to ``offset`` bytes, durably (a missing file stays missing)."""
    if not path.exists() or path.stat().st_size <= offset:
        return
    with path.open("r+b") as fh:
        fh.truncate(offset)
        fh.flush()
        os.fsync(fh.fileno())


def append_jsonl(path: Path, rows: Iterable[dict[str, Any] | str]) -> None:
    """Append rows (dicts or ready JSON strings) to ``path``; a crash after return loses none.

    A torn last line left by an earlier crash is cut off first (``repair_jsonl``).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    repair_jsonl(path)
    with path.open("a", encoding="utf-8") as fh:
        for row in rows:
            fh.write((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The records of ``path``, streamed (a file larger than memory is fine); a torn last
    line (a kill mid-append, or a write in progress) is skipped with a warning. A bad line
    anywhere else is corruption, not a crash, and raises."""
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if not line.endswith("\n"):  # a last record without its newline is torn even
                # if it happens to parse
                log.warning("%s: skipping a torn last line (%d chars)", path, len(line))
                return
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON record ({err})") from err


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every record of ``path`` (``iter_jsonl``'s rules)."""
    return list(iter_jsonl(path))
