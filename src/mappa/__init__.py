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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mappa.config import RunConfig

__version__ = "0.1.0"
__all__ = ["ConfigError", "__version__", "evaluate", "load_config", "train"]


def __getattr__(name: str) -> Any:
    """``mappa.ConfigError`` (what a bad config raises), imported on first use: importing
    mappa stays free of pydantic until a config is read."""
    if name == "ConfigError":
        from mappa.config import ConfigError

        return ConfigError
    raise AttributeError(f"module 'mappa' has no attribute {name!r}")


def load_config(config: str | PathLike[str], overrides: Sequence[str] = ()) -> RunConfig:
    """A run config read from its file, or a config shipped with mappa by name (``demo``,
    as ``--config`` takes), with ``key.path=value`` ``overrides``, checked as the command
    line checks it (``mappa.config.ConfigError`` names the key and the file)."""
    from mappa.config import load_config as load

    if not isinstance(config, str | PathLike):  # a dict is a config already read
        raise TypeError(
            f"config: give a config file's path or a shipped config's name, not a "
            f"{type(config).__name__} (train and evaluate take a RunConfig too: "
            "mappa.config.RunConfig.model_validate(d) builds one from a dict d)"
        )
    if isinstance(overrides, str):  # a str is a sequence of one-letter "overrides"
        raise TypeError(f"overrides: give a list of key=value strings, e.g. [{overrides!r}]")
    return load(_config_file(config), list(overrides))


def _config_file(config: str | PathLike[str]) -> Path:
    """``config``, else the shipped config it names; a path that is neither is left to the
    loader to refuse."""
    from mappa.experiment.spec import shipped_config

    path = Path(config)
    return path if path.exists() else shipped_config(str(config)) or path


def _config(config: RunConfig | str | PathLike[str], overrides: Sequence[str]) -> RunConfig:
    from mappa.config import RunConfig

    if isinstance(config, RunConfig):
        if overrides:
            raise ValueError("overrides apply to a config file; a RunConfig is already built")
        return config
    return load_config(config, overrides)


def train(
    config: RunConfig | str | PathLike[str],
    overrides: Sequence[str] = (),
    resume: str | PathLike[str] | None = None,
) -> Path:
    """What ``mappa train --config`` runs, from Python: ``config`` is a config file's path
    (read with ``overrides``, as on the command line) or a ``RunConfig``; ``resume`` a run
    directory to continue. Returns the run directory.
    """
    from mappa.run.loop import train as run_loop

    cfg = _config(config, overrides)
    return run_loop(cfg, resume=None if resume is None else Path(resume))


def evaluate(
    config: RunConfig | str | PathLike[str],
    overrides: Sequence[str] = (),
    adapters: str | PathLike[str] | None = None,
    out: str | PathLike[str] = "runs/eval-base",
) -> dict[str, Any]:
    """What ``mappa eval`` runs, from Python: the team of ``config`` (with the adapters a
    run saved in ``adapters``, e.g. ``RUN_DIR/adapters``) on the config's held-out set,
    refused if it overlaps the training problems. Writes ``eval.json`` and
    ``eval_episodes.jsonl`` into ``out``; returns the metrics (accuracy, avg@k, pass@k,
    per-agent behaviour, ``per_task``)."""
    from mappa.run.evaluation import adapters_dir, checked_heldout, evaluate_model

    cfg = _config(config, overrides)
    given = None if adapters is None else Path(adapters)
    found = adapters_dir(given, [a.name for a in cfg.agents], "adapters=")
    tasks = checked_heldout(cfg)
    source = cfg.eval.source or "arithmetic (held out)"
    return evaluate_model(cfg, tasks, Path(out), source, found)
