"""Where mappa keeps files that outlive a run (converted models, the coach cache), and
where a run goes."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path


def cache_root() -> Path:
    """``$MAPPA_CACHE_DIR``, else ``$XDG_CACHE_HOME/mappa``, else ``~/.cache/mappa``."""
    if env := os.environ.get("MAPPA_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mappa"


def expand_run_dir(run_dir: Path) -> Path:
    """``run_dir`` with ``{time}`` replaced by the local time now (``20261206-142301``), so
    the path announced before a run starts is the one it writes to.

    >>> str(expand_run_dir(Path("runs/plain")))
    'runs/plain'
    """
    return Path(str(run_dir).format(time=datetime.now().strftime("%Y%m%d-%H%M%S")))
