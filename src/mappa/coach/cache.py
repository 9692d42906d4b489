"""A persistent SQLite cache of coach scores, and replay mode.

Keyed by (template digest, backend, model, context digest): rerunning or resuming a run
never pays twice for the same judgement, and editing the template invalidates old scores.
``replay`` answers only from the cache and fails loudly on a miss, so tests and
reproductions are exact and never reach a server. Transport failures ("coach
unavailable") are not cached, so a rerun retries them; unparseable replies are, because a
deterministic coach would give the same reply again.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from mappa.coach.base import CoachBackend
from mappa.coach.context import CoachContext
from mappa.workflow.records import Score


class CoachCacheMiss(RuntimeError):
    """Replay mode met a context that the cache has never scored."""


class ScoreCache:
    """A key -> Score table in one SQLite file (safe to share between runs)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(path)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS scores "
            "(key TEXT PRIMARY KEY, score TEXT NOT NULL, created REAL)"
        )
        self.db.commit()

    def get(self, key: str) -> Score | None:
        row = self.db.execute("SELECT score FROM scores WHERE key = ?", (key,)).fetchone()
        return Score(**json.loads(row[0])) if row else None

    def put_many(self, items: Sequence[tuple[str, Score]]) -> None:
        now = time.time()
        self.db.executemany(
            "INSERT OR REPLACE INTO scores (key, score, created) VALUES (?, ?, ?)",
            [(k, json.dumps(asdict(s)), now) for k, s in items],
        )
        self.db.commit()

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
