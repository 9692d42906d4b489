"""mappa: finetune multi-agent LLM systems with per-action process rewards from an AI coach.

The method is MAPPA (arXiv 2601.23228); see docs/design.md and docs/architecture.md for
how the parts fit. Heavy dependencies (torch, transformers) are imported lazily by the
modules that need them, so that ``mappa.config`` and the CLI's argument checking stay fast
and model-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mappa.config import RunConfig

__version__ = "0.1.0"


def train(
    config: RunConfig | str | PathLike[str],
    overrides: Sequence[str] = (),
    resume: str | PathLike[str] | None = None,
) -> Path:
    """What ``mappa train --config`` runs, from Python: ``config`` is a config file's path
    (read with ``overrides``, as on the command line) or a ``RunConfig``; ``resume`` a run
    directory to continue. Returns the run directory.
    """
    from mappa.config import RunConfig, load_config
    from mappa.run.loop import train as run_loop

    if isinstance(config, RunConfig):
        if overrides:
            raise ValueError("overrides apply to a config file; a RunConfig is already built")
        cfg = config
    else:
        cfg = load_config(Path(config), list(overrides))
    return run_loop(cfg, resume=None if resume is None else Path(resume))
