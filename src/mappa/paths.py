"""Where mappa keeps files that outlive a run (converted models, the coach cache), and
where a run goes."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

CHECKPOINTS = "checkpoints"
"""A run's checkpoints folder, ``<run_dir>/checkpoints/step-N``."""


def checkpoint_of(path: Path) -> Path | None:
    """The checkpoint folder (``<run>/checkpoints/step-N``) that ``path`` is, or whose
    ``adapters/`` it is; None for any other path.

    >>> checkpoint_of(Path("r/checkpoints/step-000002/adapters")), checkpoint_of(Path("r"))
    (PosixPath('r/checkpoints/step-000002'), None)
    """
    folder = path.parent if path.name == "adapters" else path
    return folder if folder.parent.name == CHECKPOINTS else None


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


def run_config_file(run_dir: Path) -> Path:
    """The config a training run saved, ``run_dir/config.yaml``; ``FileNotFoundError`` says
    what ``run_dir`` is instead (missing, a file, a directory of something else) rather
    than that a config.yaml nobody named is missing."""
    if run_dir.is_file():
        raise FileNotFoundError(f"{run_dir}: is a file; give a run directory")
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise FileNotFoundError(f"{run_dir}: not a training run (no config.yaml)")
    return config


def fresh_run_dir_problem(run_dir: Path) -> str | None:
    """Why a new run cannot write to ``run_dir`` (expanded): a file is there, or the records
    of another run, which two runs would mix; None when it may."""
    if run_dir.exists() and not run_dir.is_dir():
        return f"run_dir {run_dir}: is a file; choose another run_dir"
    if (run_dir / "metrics.jsonl").exists() or (run_dir / "episodes.jsonl").exists():
        return (
            f"run_dir {run_dir} already holds a run; choose another run_dir, or continue it "
            f"with `mappa train --resume {run_dir}`"
        )
    return None
