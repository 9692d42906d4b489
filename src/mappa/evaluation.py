"""Held-out evaluation: accuracy by the deterministic grader, and how each agent behaves.

Used by ``mappa eval`` (writes ``eval.json``) and by the training loop every
``tasks.eval_every`` steps (``eval/...`` keys in ``metrics.jsonl``). Correctness is never
judged by the coach (DESIGN.md §1, fault 2): every final answer is regraded here with the
configured answer format. Before anything runs, the held-out problems are checked against
the training problems (``mappa.tasks.splits``).

Metrics (``k`` = ``tasks.eval_samples``; rates are fractions in [0, 1]):

- ``accuracy`` = ``avg@k``: mean correctness over all samples of all graded problems;
  ``pass@k``: share of problems with at least one correct sample among their k.
- per agent ``a``: ``response_tokens/a`` (mean completion tokens per action),
  ``truncation_rate/a`` (actions cut at ``max_new_tokens``), ``format_rate/a`` (episodes
  whose last message of ``a`` holds an answer in the configured format: the boxed-format
  rate by default); for agents that run code also ``tool_call_rate/a`` (episodes in which
  ``a`` ran code at least once) and ``exec_error_rate/a`` (code runs that failed).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import TYPE_CHECKING, Any

from mappa.config import AgentConfig, RunConfig, TaskConfig
from mappa.tasks import Task, load_tasks
from mappa.tasks.arithmetic import generate
from mappa.tasks.math import extract_answer, grade_answer
from mappa.tasks.splits import check_disjoint
from mappa.workflow.records import Episode, append_episodes

if TYPE_CHECKING:
    from mappa.models.policies import AgentPolicies
    from mappa.workflow.runner import PipelineRunner

log = logging.getLogger(__name__)

_FAILED_RUN = re.compile(
    r"Traceback \(most recent call last\)|^[\w.]*(?:Error|Exception)(?::|$)|^\[exit code -?\d+\]"
    r"|^\[[^\]\n]*(?:timed out|killed|limit)[^\]\n]*\]$",
    re.M,
)


def execution_failed(observation: str) -> bool:
    """Whether a tool observation shows a failed run (traceback, error exit, limit hit).

    Actions record the text the agent saw, not the run's status, so this reads the text.

    >>> execution_failed("42"), execution_failed('Traceback (most recent call last):\\n  ...')
    (False, True)
    """
    return bool(_FAILED_RUN.search(observation))


def heldout_tasks(cfg: TaskConfig, seed: int, source: str | None = None) -> list[Task]:
    """The held-out set: ``source``, else ``cfg.eval_source``, else arithmetic problems that
    come after the training ones in the same seeded stream (disjoint by construction)."""
    source = source or cfg.eval_source or "arithmetic"
    if source == "arithmetic":
        return generate(cfg.num_tasks + cfg.eval_num_tasks, seed, cfg.difficulty)[cfg.num_tasks :]
    return load_tasks(source, cfg.eval_num_tasks, cfg.difficulty, seed)


def checked_heldout(
    cfg: RunConfig,
    source: str | None = None,
    limit: int | None = None,
    train_tasks: Sequence[Task] | None = None,
) -> list[Task]:
    """Held-out tasks (the first ``limit``), refused if any is also a training problem.

    Raises ``SplitOverlapError`` naming the duplicated ids unless ``tasks.allow_overlap``.
    """
    tasks = heldout_tasks(cfg.tasks, cfg.seed, source)[:limit]
    if train_tasks is None:
        train_tasks = load_tasks(
            cfg.tasks.source, cfg.tasks.num_tasks, cfg.tasks.difficulty, cfg.seed
        )
    pairs = check_disjoint(
        tasks,
        train_tasks,
        cfg.tasks.allow_overlap,
        source or cfg.tasks.eval_source or "the held-out set",
        cfg.tasks.source,
    )
    if pairs:
        log.warning("evaluating with %d held-out problem(s) also in training (allowed)", len(pairs))
    return tasks


def regrade(episodes: Sequence[Episode], final_agent: str, cfg: TaskConfig) -> None:
    """Grade each episode's final answer with the configured format and time limit."""
    for ep in episodes:
        actions = ep.agent_actions(final_agent)
        if ep.answer is not None and actions:
            ep.final_answer, ep.correct = grade_answer(
                actions[-1].completion_text, ep.answer, cfg.answer_format, cfg.grade_timeout_s
            )


def _rate(values: Sequence[float]) -> float | None:
    return mean(map(float, values)) if values else None


def behaviour(
    episodes: Sequence[Episode], agents: Sequence[AgentConfig], cfg: TaskConfig
) -> dict[str, float | None]:
    """Per-agent behaviour metrics (see the module docstring for each key)."""
    out: dict[str, float | None] = {}
    for agent in agents:
        per_episode = [e.agent_actions(agent.name) for e in episodes]
        acts = [a for actions in per_episode for a in actions]
        out[f"response_tokens/{agent.name}"] = _rate([len(a.completion_ids) for a in acts])
        out[f"truncation_rate/{agent.name}"] = _rate([a.truncated for a in acts])
        out[f"format_rate/{agent.name}"] = _rate(
            [
                extract_answer(actions[-1].completion_text, cfg.answer_format) is not None
                for actions in per_episode
                if actions
            ]
        )
        if agent.run_code:
            out[f"tool_call_rate/{agent.name}"] = _rate(
                [any(a.tool_observation is not None for a in actions) for actions in per_episode]
            )
            out[f"exec_error_rate/{agent.name}"] = _rate(
                [
                    execution_failed(a.tool_observation)
                    for a in acts
                    if a.tool_observation is not None
                ]
            )
    return out


def accuracy(correct: Sequence[Sequence[bool]], k: int) -> dict[str, float | int | None]:
    """avg@k and pass@k over problems, each with its k graded samples.

    >>> accuracy([[True, False], [False, False]], 2)
    {'graded': 2, 'accuracy': 0.25, 'avg@2': 0.25, 'pass@2': 0.5}
    """
    avg = _rate([_rate(c) or 0.0 for c in correct])
    return {
        "graded": len(correct),
        "accuracy": avg,
        f"avg@{k}": avg,
        f"pass@{k}": _rate([any(c) for c in correct]),
    }


def eval_runner(cfg: RunConfig, policies: AgentPolicies, workspace_root: Path) -> PipelineRunner:
    """A pipeline runner that samples at ``tasks.eval_temperature`` (greedy at 0)."""
    from mappa.train import build_runner  # train.py owns the builders and imports this module

    temperature = cfg.tasks.eval_temperature or cfg.rollout.temperature
    rollout = cfg.rollout.model_copy(update={"temperature": temperature})
    return build_runner(cfg.model_copy(update={"rollout": rollout}), policies, workspace_root)


def run_heldout(
    cfg: RunConfig, runner: PipelineRunner, tasks: Sequence[Task], step: int = 0
) -> tuple[dict[str, Any], list[Episode], list[dict[str, Any]]]:
    """Run every task ``eval_samples`` times; returns (metrics, episodes, per-task results)."""
    tc = cfg.tasks
    k = tc.eval_samples
    episodes = runner.run(
        [t for t in tasks for _ in range(k)], step=step, greedy=tc.eval_temperature == 0.0
    )
    regrade(episodes, cfg.agents[-1].name, tc)
    per_task = []
    for i, task in enumerate(tasks):
        samples = episodes[i * k : (i + 1) * k]
        per_task.append(
            {
                "task_id": task.task_id,
                "answer": task.answer,
                "predictions": [e.final_answer for e in samples],
                "correct": [e.correct for e in samples],
            }
        )
    graded = [r["correct"] for r in per_task if r["answer"] is not None]
    metrics: dict[str, Any] = {
        "tasks": len(tasks),
        "samples": k,
        "temperature": tc.eval_temperature,
    }
    metrics.update(accuracy(graded, k))
    metrics.update(behaviour(episodes, cfg.agents, tc))
    if any(t.dsbench is not None for t in tasks):  # modeling tasks: success, fair metrics, blame
        from mappa.tasks.dsbench.report import dsbench_report

        metrics["dsbench"] = dsbench_report(episodes, cfg.agents)
    return metrics, episodes, per_task


def evaluate(
    cfg: RunConfig, adapters_dir: Path | None, tasks: Sequence[Task], out_dir: Path, source: str
) -> dict[str, Any]:
    """``mappa eval``: load the policies, evaluate, write ``eval.json`` and
    ``eval_episodes.jsonl`` (both replaced: one evaluation per directory)."""
    import torch

    from mappa.train import load_policies

    start = time.monotonic()
    torch.manual_seed(cfg.seed)  # sampled evaluations (eval_temperature > 0) are repeatable
    runner = eval_runner(cfg, load_policies(cfg, adapters_dir), out_dir / "eval_workspaces")
    metrics, episodes, per_task = run_heldout(cfg, runner, tasks)
    result = {
        "source": source,
        "adapters": str(adapters_dir) if adapters_dir else None,
        "answer_format": cfg.tasks.answer_format,
        **metrics,
        "wall_s": time.monotonic() - start,
        "per_task": per_task,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "eval_episodes.jsonl").unlink(missing_ok=True)
    append_episodes(out_dir / "eval_episodes.jsonl", episodes)
    (out_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


class TrainingEvaluator:
    """The training loop's view of evaluation: behaviour of each step's rollouts, and every
    ``tasks.eval_every`` steps (and after the last) the held-out metrics as ``eval/...``.

    Built before the model loads, so an overlapping held-out set stops the run at once.
    """

    def __init__(self, cfg: RunConfig, train_tasks: Sequence[Task], run_dir: Path) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.tasks = checked_heldout(cfg, train_tasks=train_tasks) if cfg.tasks.eval_every else []
        self._runner: PipelineRunner | None = None  # built at the first evaluation

    def due(self, step: int) -> bool:
        every = self.cfg.tasks.eval_every
        return bool(every) and ((step + 1) % every == 0 or step + 1 == self.cfg.train.steps)

    def after_step(
        self, step: int, episodes: Sequence[Episode], policies: AgentPolicies
    ) -> dict[str, Any]:
        """Metrics to add to the step's line in ``metrics.jsonl``."""
        out: dict[str, Any] = dict(behaviour(episodes, self.cfg.agents, self.cfg.tasks))
        if self.due(step):
            start = time.monotonic()
            if self._runner is None:
                self._runner = eval_runner(self.cfg, policies, self.run_dir / "heldout_workspaces")
            metrics, heldout, _ = run_heldout(self.cfg, self._runner, self.tasks, step)
            append_episodes(self.run_dir / "heldout_episodes.jsonl", heldout)
            out.update({f"eval/{key}": value for key, value in metrics.items()})
            out["eval_s"] = time.monotonic() - start
            log.info(
                "step %d held-out accuracy %.3f on %d tasks",
                step,
                metrics["accuracy"] or 0.0,
                len(self.tasks),
            )
        return out
