"""Command line: ``mappa train`` and ``mappa eval``.

The config is loaded and validated before anything heavy is imported, so a typo fails in
well under a second and no model is ever loaded for a config that cannot run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from importlib import resources
from pathlib import Path

from mappa.config import ConfigError, RunConfig, load_config


def default_config() -> Path:
    """The demo config shipped inside the package (``configs/`` in the repo links to it)."""
    return Path(str(resources.files("mappa") / "configs" / "demo.yaml"))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mappa", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in [
        ("train", "rollout -> coach -> update for train.steps steps"),
        ("eval", "pipeline accuracy on a task set, graded deterministically"),
        ("coach-check", "score built-in good and bad actions: does the coach discriminate?"),
    ]:
        s = sub.add_parser(name, help=help_text)
        s.add_argument("--config", type=Path, default=None, help="run config YAML (default: demo)")
        s.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. rl.lr=1e-5")
    ev = sub.choices["eval"]
    ev.add_argument("--adapters", type=Path, default=None,
                    help="a run dir or its adapters/ dir (default: the untrained base)")
    ev.add_argument("--tasks", default=None, help="task file (default: tasks.eval_source)")
    ev.add_argument("--limit", type=int, default=None, help="evaluate only the first N tasks")
    ev.add_argument("--out", type=Path, default=None, help="where eval outputs go")
    return p


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # PEFT 0.21 calls a transformers API that transformers 5 deprecates; not actionable.
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")


def _eval(cfg: RunConfig, args: argparse.Namespace) -> int:
    from mappa.tasks import load_tasks
    from mappa.train import evaluate

    adapters = args.adapters
    if adapters is not None and (adapters / "adapters").is_dir():
        adapters = adapters / "adapters"
    source = args.tasks or cfg.tasks.eval_source or "arithmetic"
    tasks = load_tasks(source, cfg.tasks.eval_num_tasks, cfg.tasks.difficulty, cfg.seed + 1_000_003)
    if args.limit:
        tasks = tasks[: args.limit]
    out = args.out or (adapters.parent if adapters is not None else Path("runs/eval-base"))
    result = evaluate(cfg, adapters, tasks, out)
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    return 0


def _coach_check(cfg: RunConfig) -> int:
    from mappa.coach.check import run_check
    from mappa.train import load_policies, make_coach

    needs_policy = cfg.coach.backend == "local" and cfg.coach.local.model_path is None
    policies = load_policies(cfg) if needs_policy and cfg.coach.cache.mode != "replay" else None
    table, _ = run_check(make_coach(cfg, policies), {a.name: a.role for a in cfg.agents})
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config_path = args.config or default_config()
    try:
        cfg = load_config(config_path, args.overrides)
    except ConfigError as err:
        print(f"mappa: {err}", file=sys.stderr)
        return 2
    _setup_logging()
    if args.command == "train":
        from mappa.train import train

        run_dir = train(cfg)
        print(f"run directory: {run_dir}")
        return 0
    if args.command == "coach-check":
        return _coach_check(cfg)
    return _eval(cfg, args)


if __name__ == "__main__":
    sys.exit(main())
