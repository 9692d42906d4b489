"""A persistent SQLite cache of coach scores, and replay mode.

Keyed by (template digest, backend, model, context digest): rerunning or resuming a run
never pays twice for the same judgement, and editing the template invalidates old scores.
``replay`` answers only from the cache and fails loudly on a miss, so tests and
reproductions are exact and never reach a server. Transport failures ("coach
unavailable") are not cached, so a rerun retries them; unparseable replies are, because a
deterministic coach would give the same reply again.

The file is shared between runs: it uses WAL (readers never block the writer) and waits up
to ``BUSY_TIMEOUT_S`` for a lock. A file that is not a readable SQLite database is moved
aside (``<name>.corrupt-<time>``) and rebuilt empty, with a warning; a read or write that
fails later warns and is treated as a miss / skipped: the cache never stops a run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from mappa.coach.base import CoachBackend
from mappa.coach.context import CoachContext
from mappa.records import Score

log = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 30.0


class CoachCacheMiss(RuntimeError):
    """Replay mode met a context that the cache has never scored."""


class ScoreCache:
    """A key -> Score table in one SQLite file (safe to share between runs)."""

    def __init__(self, path: Path, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = self._open(path)
        except (OSError, sqlite3.OperationalError) as err:  # locked past the timeout, unwritable
            self.db = self._in_memory(err)
        except sqlite3.DatabaseError as err:  # not a database, or damaged
            try:
                self._move_aside(err)
                self.db = self._open(path)
            except (OSError, sqlite3.Error) as again:
                self.db = self._in_memory(again)

    def _in_memory(self, err: Exception) -> sqlite3.Connection:
        log.warning(
            "coach cache %s cannot be used (%s); this run keeps its scores in memory",
            self.path,
            err,
        )
        return self._open(":memory:")

    def _move_aside(self, err: Exception) -> None:
        path = self.path
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        path.replace(aside)
        for suffix in ("-wal", "-shm"):  # the old journal belongs to the old file
            side = path.with_name(path.name + suffix)
            if side.exists():
                side.replace(aside.with_name(aside.name + suffix))
        log.warning(
            "coach cache %s is unreadable (%s); moved aside to %s, starting an empty one",
            path,
            err,
            aside,
        )

    def _open(self, where: Path | str) -> sqlite3.Connection:
        """A connection with WAL, the busy timeout and the table; ``DatabaseError`` (but not
        ``OperationalError``: a lock or a permission) means the file is damaged."""
        db = sqlite3.connect(where, timeout=self.busy_timeout_s)
        try:
            db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS scores "
                "(key TEXT PRIMARY KEY, score TEXT NOT NULL, created REAL)"
            )
            db.commit()
            check = db.execute("PRAGMA quick_check").fetchone()
            if not check or check[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check}")  # damaged, not locked
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def get(self, key: str) -> Score | None:
        """The cached score, or None (also when the row or the file cannot be read)."""
        try:
            row = self.db.execute("SELECT score FROM scores WHERE key = ?", (key,)).fetchone()
            return Score(**json.loads(row[0])) if row else None
        except (sqlite3.Error, ValueError, TypeError) as err:
            log.warning(
                "coach cache %s: reading a score failed (%s); asking the coach", self.path, err
            )
            return None

    def put_many(self, items: Sequence[tuple[str, Score]]) -> bool:
        """Store the scores; on failure warn and go on (the run needs no cache). True if
        stored."""
        now = time.time()
        try:
            self.db.executemany(
                "INSERT OR REPLACE INTO scores (key, score, created) VALUES (?, ?, ?)",
                [(k, json.dumps(asdict(s)), now) for k, s in items],
            )
            self.db.commit()
        except (sqlite3.Error, ValueError, TypeError) as err:
            log.warning(
                "coach cache %s: storing %d scores failed (%s); the run goes on without them",
                self.path,
                len(items),
                err,
            )
            with contextlib.suppress(sqlite3.Error):  # nothing to undo is fine too
                self.db.rollback()
            return False
        return True

    def __len__(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM scores").fetchone()[0])


class CachedCoach:
    """Wraps a backend with the cache. ``inner`` may be ``None`` in replay mode."""

    def __init__(
        self, inner: CoachBackend | None, cache: ScoreCache, namespace: str, replay: bool = False
    ) -> None:
        if inner is None and not replay:
            raise ValueError("a cached coach needs a backend unless it only replays")
        self.inner = inner
        self.cache = cache
        self.namespace = namespace
        self.replay = replay
        self.name = getattr(inner, "name", "replay")

    def key(self, ctx: CoachContext) -> str:
        return hashlib.sha256(f"{self.namespace}\x00{ctx.digest()}".encode()).hexdigest()

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        keys = [self.key(c) for c in contexts]
        found = [self.cache.get(k) for k in keys]
        misses = [i for i, s in enumerate(found) if s is None]
        if misses and self.replay:
            first = contexts[misses[0]]
            raise CoachCacheMiss(
                f"replay: {len(misses)} of {len(contexts)} actions are not in {self.cache.path} "
                f"(first: agent {first.agent}, turn {first.turn}, task {first.task[:60]!r})"
            )
        out: list[Score | None] = [replace(s, cached=True) if s else None for s in found]
        if misses:
            if self.inner is None:  # replay mode raised above; only a misconfiguration is left
                raise CoachCacheMiss(f"{len(misses)} actions not cached and no coach to ask")
            fresh = self.inner.score([contexts[i] for i in misses])
            for i, s in zip(misses, fresh, strict=True):
                out[i] = s
            self.cache.put_many(
                [
                    (keys[i], s)
                    for i, s in zip(misses, fresh, strict=True)
                    if s.flag_reason != "unavailable"
                ]
            )
        return [s for s in out if s is not None]  # every miss was filled: one score each
