"""Held-out evaluation: accuracy by the deterministic grader, and how each agent behaves.

Used by ``mappa eval`` (writes ``eval.json``) and by the training loop every ``eval.every``
steps (``eval/...`` keys in ``metrics.jsonl``). Correctness is never judged by the coach
(docs/design.md §1, fault 2): the rollout grades every final answer with ``tasks.answer_format``,
the same path training uses. Before anything runs, the held-out problems are checked
against the training problems (``mappa.tasks.splits``).

Metrics (``k`` = ``eval.samples``): ``accuracy`` = ``avg@k`` (mean correctness over all
samples of all graded problems) and ``pass@k`` (share of problems with at least one correct
sample), plus the per-agent keys of ``mappa.run.metrics``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mappa.config import RunConfig
from mappa.paths import checkpoint_of
from mappa.provenance import environment, source_revision
from mappa.records import Episode, append_episodes
from mappa.run.metrics import accuracy, agent_metrics
from mappa.tasks import Columns, Task, load_tasks
from mappa.tasks.arithmetic import generate
from mappa.tasks.splits import check_disjoint
from mappa.workflow.interface import Rollout, RolloutInput

log = logging.getLogger(__name__)


def training_tasks(cfg: RunConfig) -> list[Task]:
    """The training set named by ``tasks``, drawn with ``tasks.seed`` (else the run's)."""
    t = cfg.tasks
    return load_tasks(t.source, t.num_tasks, t.difficulty, cfg.task_seed, columns=Columns.of(t))


def heldout_tasks(cfg: RunConfig, source: str | None = None) -> list[Task]:
    """The held-out set: ``source``, else ``eval.source``, else arithmetic problems that
    come after the training ones in the same seeded stream (disjoint by construction)."""
    t, e = cfg.tasks, cfg.eval
    source = source or e.source or "arithmetic"
    if source == "arithmetic":
        return generate(t.num_tasks + e.num_tasks, cfg.task_seed, t.difficulty)[t.num_tasks :]
    columns = Columns.of(t, e)
    return load_tasks(source, e.num_tasks, t.difficulty, cfg.task_seed, columns=columns)


def checked_heldout(
    cfg: RunConfig,
    source: str | None = None,
    limit: int | None = None,
    train_tasks: Sequence[Task] | None = None,
) -> list[Task]:
    """Held-out tasks (the first ``limit``), refused if any is also a training problem.

    Raises ``SplitOverlapError`` naming the duplicated ids unless ``eval.allow_overlap``.
    """
    tasks = heldout_tasks(cfg, source)[:limit]
    if train_tasks is None:
        train_tasks = training_tasks(cfg)
    pairs = check_disjoint(
        tasks,
        train_tasks,
        cfg.eval.allow_overlap,
        source or cfg.eval.source or "the held-out set",
        cfg.tasks.source,
    )
    if pairs:
        log.warning("evaluating with %d held-out problem(s) also in training (allowed)", len(pairs))
    return tasks


def run_heldout(
    cfg: RunConfig, rollout: Rollout, tasks: Sequence[Task], step: int = 0
) -> tuple[dict[str, Any], list[Episode], list[dict[str, Any]]]:
    """Run every task ``eval.samples`` times; returns (metrics, episodes, per-task results)."""
    k = cfg.eval.samples
    episodes = rollout.run(
        RolloutInput([t for t in tasks for _ in range(k)], step, "eval")
    ).episodes
    per_task: list[dict[str, Any]] = []
    correct: list[list[bool]] = []
    for i, task in enumerate(tasks):
        samples = episodes[i * k : (i + 1) * k]
        if task.answer is not None:
            correct.append([bool(e.correct) for e in samples])
        per_task.append(
            {
                "task_id": task.task_id,
                "answer": task.answer,
                "predictions": [e.final_answer for e in samples],
                "correct": [e.correct for e in samples],
            }
        )
    metrics: dict[str, Any] = {
        "tasks": len(tasks),
        "samples": k,
        "temperature": cfg.eval.temperature,
    }
    metrics.update(accuracy(correct, k))
    metrics.update(agent_metrics(episodes, cfg.agents, cfg.tasks.answer_format))
    if any(t.dsbench is not None for t in tasks):  # modeling tasks: success, fair metrics, blame
        from mappa.tasks.dsbench.report import dsbench_report

        metrics["dsbench"] = dsbench_report(episodes, cfg.agents)
    return metrics, episodes, per_task


def evaluate(
    cfg: RunConfig,
    rollout: Rollout,
    tasks: Sequence[Task],
    out_dir: Path,
    source: str,
    adapters_dir: Path | None = None,
) -> dict[str, Any]:
    """``mappa eval``: evaluate, write ``eval.json`` and ``eval_episodes.jsonl`` (both
    replaced: one evaluation per directory). ``eval.json`` names the code and environment
    that evaluated (``mappa.provenance``), as a run's record does."""
    start = time.monotonic()
    metrics, episodes, per_task = run_heldout(cfg, rollout, tasks)
    result = {
        "source": source,
        "adapters": str(adapters_dir) if adapters_dir else None,
        "answer_format": cfg.tasks.answer_format,
        **metrics,
        "wall_s": time.monotonic() - start,
        "code": source_revision(),
        "environment": environment(),
        "per_task": per_task,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "eval_episodes.jsonl").unlink(missing_ok=True)
    append_episodes(out_dir / "eval_episodes.jsonl", episodes)
    (out_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


class TrainingEvaluator:
    """Held-out evaluation inside the training loop: every ``eval.every`` steps (and after
    the last) the held-out metrics as ``eval/...`` keys, and with ``eval.at_start`` the
    untrained team's as ``eval_start/...``; episodes to ``heldout_episodes.jsonl``.

    Built before the model loads, so an overlapping held-out set stops the run at once.
    """

    def __init__(self, cfg: RunConfig, train_tasks: Sequence[Task], run_dir: Path) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        wanted = cfg.eval.every or cfg.eval.at_start
        self.tasks = checked_heldout(cfg, train_tasks=train_tasks) if wanted else []

    def due(self, step: int) -> bool:
        every = self.cfg.eval.every
        return bool(every) and ((step + 1) % every == 0 or step + 1 == self.cfg.train.steps)

    def after_step(self, step: int, rollout: Rollout) -> dict[str, Any]:
        """Metrics to add to the step's line in ``metrics.jsonl`` (none when not due)."""
        if not self.due(step):
            return {}
        return self._evaluate(step, rollout, "eval")

    def at_start(self, rollout: Rollout) -> dict[str, Any]:
        """The untrained team's held-out metrics as ``eval_start/...`` keys for step 0's line
        (``eval.at_start``; none otherwise); its episodes are recorded as step -1."""
        if not self.cfg.eval.at_start:
            return {}
        return self._evaluate(-1, rollout, "eval_start")

    def _evaluate(self, step: int, rollout: Rollout, prefix: str) -> dict[str, Any]:
        start = time.monotonic()
        metrics, heldout, _ = run_heldout(self.cfg, rollout, self.tasks, step)
        append_episodes(self.run_dir / "heldout_episodes.jsonl", heldout)
        out = {f"{prefix}/{key}": value for key, value in metrics.items()}
        out[f"{prefix}_s"] = time.monotonic() - start
        log.info(
            "%s held-out accuracy %.3f on %d tasks",
            "before training:" if step < 0 else f"step {step}",
            metrics["accuracy"] or 0.0,
            len(self.tasks),
        )
        return out


def adapter_base(adapters: Path, agent: str) -> str | None:
    """The base model a saved adapter names (``base_model_name_or_path``)."""
    config = adapters / agent / "adapter_config.json"
    if not config.is_file():
        return None
    name = json.loads(config.read_text()).get("base_model_name_or_path")
    return str(name) if name else None


def adapters_dir(adapters: Path | None, agents: Sequence[str], key: str) -> Path | None:
    """``adapters`` (a run dir or its ``adapters/``) as the directory that holds one
    adapter per agent, checked before any model loads: ``FileNotFoundError`` naming ``key``
    (the flag or argument that gave it), the path and the fix."""
    if adapters is None:
        return None
    if not adapters.is_dir():
        raise FileNotFoundError(
            f"{key} {adapters}: no such directory; give a run dir or its adapters/ dir"
        )
    if (adapters / "adapters").is_dir():
        adapters = adapters / "adapters"
    missing = [a for a in agents if not (adapters / a / "adapter_config.json").is_file()]
    if missing:
        raise FileNotFoundError(
            f"{key} {adapters}: no adapter for {', '.join(missing)} (each agent's is "
            "<dir>/<agent>/adapter_config.json); give a run dir or its adapters/ dir"
        )
    return adapters


def default_out(adapters: Path | None) -> Path:
    """Where ``mappa eval`` writes without ``--out``: ``runs/eval-base`` for the untrained
    base; the run dir for a run's adapters; ``<run>/eval-step-N`` for a checkpoint's (a
    checkpoint folder is deleted when its run saves the next one, and what was written
    into it with it).

    >>> default_out(Path("runs/r1/adapters")), default_out(None)
    (PosixPath('runs/r1'), PosixPath('runs/eval-base'))
    >>> default_out(Path("runs/r1/checkpoints/step-000004/adapters"))
    PosixPath('runs/r1/eval-step-000004')
    """
    if adapters is None:
        return Path("runs/eval-base")
    if (ckpt := checkpoint_of(adapters)) is not None:
        return ckpt.parent.parent / f"eval-{ckpt.name}"
    return adapters.parent


def evaluate_model(
    cfg: RunConfig,
    tasks: Sequence[Task],
    out_dir: Path,
    source: str,
    adapters_dir: Path | None = None,
) -> dict[str, Any]:
    """``mappa eval`` after its checks: load the team (the base, or with the adapters saved
    in ``adapters_dir``, on the base they name), roll out ``tasks`` and write ``eval.json``
    (``evaluate``); returns its metrics."""
    import torch

    from mappa.run import build

    base = None if adapters_dir is None else adapter_base(adapters_dir, cfg.agents[0].name)
    if base is not None and base != cfg.model.path:  # the adapters know their base
        log.info("adapters name their base %s; loading it", base)
        cfg.model.path = base
    torch.manual_seed(cfg.seed)  # sampled evaluations (eval.temperature > 0) are repeatable
    policies = build.load_policies(cfg, adapters_dir)
    engine = build.make_engine(cfg, policies)
    runner = build.make_runner(cfg, engine, policies.tokenizer, out_dir / "eval_workspaces")
    try:
        return evaluate(cfg, runner, tasks, out_dir, source, adapters_dir)
    finally:
        runner.close()
        engine.close()
