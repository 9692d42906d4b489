"""Where mappa keeps files that outlive a run (converted models, the coach cache)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$MAPPA_CACHE_DIR``, else ``$XDG_CACHE_HOME/mappa``, else ``~/.cache/mappa``."""
    if env := os.environ.get("MAPPA_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mappa"
