"""The training loop: rollout -> coach -> update -> held-out eval -> checkpoint.

Everything the loop uses is built by ``mappa.factory``; the update is ``mappa.rl``'s.
Episodes are appended to ``<run_dir>/episodes.jsonl`` (with coach scores and exact token
ids) *before* they are trained on, and one line per step goes to ``metrics.jsonl``. Every
``train.save_every`` steps and after the last, ``mappa.run.checkpoint`` writes a checkpoint that
``train(..., resume=run_dir)`` (``mappa train --resume``) continues from. Each step's metrics
also go to TensorBoard and the trackers of ``train.report_to`` (``mappa.run.trackers``).
With a ``cluster`` section the same loop drives Ray actors (``mappa.cluster``): only where
``RunModels`` live changes; a lost actor stops the run, pointing at the checkpoint.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import yaml
from tqdm import tqdm

from mappa.coach import CoachFatalError, CoachView, FallbackGuard, score_episodes
from mappa.coach.stats import NoSignalWatch
from mappa.config import RunConfig
from mappa.jsonl import append_jsonl, read_jsonl
from mappa.models.sync_probe import StaleAdapterError
from mappa.paths import expand_run_dir, fresh_run_dir_problem
from mappa.provenance import note_code
from mappa.records import append_episodes
from mappa.rl.kl import KLController
from mappa.rl.update import NonFiniteError, NonFiniteGuard
from mappa.run import build, checkpoint, preflight
from mappa.run.checkpoint import TrainState
from mappa.run.evaluation import TrainingEvaluator, training_tasks
from mappa.run.metrics import rollout_metrics, step_line
from mappa.run.models import RunModels, WorkerLost
from mappa.run.trackers import Trackers
from mappa.tasks import hf as hf_datasets
from mappa.tasks.batches import TaskBatches
from mappa.workflow.function import WorkflowFailed
from mappa.workflow.interface import RolloutInput

if TYPE_CHECKING:
    from mappa.models.policies import AgentPolicies

log = logging.getLogger(__name__)


def resolve_run_dir(run_dir: Path) -> tuple[Path, bool]:
    """Expand ``{time}`` in the configured run dir; refuse to mix two runs in one dir.
    Returns the directory and whether this call made it."""
    path = expand_run_dir(run_dir)
    problem = fresh_run_dir_problem(path)
    if problem:
        raise FileExistsError(problem)
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    return path, made


def _models(cfg: RunConfig, policies: AgentPolicies | None) -> RunModels:
    """This process's models (``policies``, if given), or Ray actors' (``cfg.cluster``)."""
    if cfg.cluster is None:
        return build.local_models(cfg, policies)
    if policies is not None:
        raise ValueError("a run with a cluster section loads its models in Ray actors; pass none")
    from mappa.cluster.launch import launch

    return launch(cfg)


def train(
    cfg: RunConfig,
    policies: AgentPolicies | None = None,
    resume: Path | None = None,
    stop_after: int | None = None,
) -> Path:
    """Run ``cfg.train.steps`` MAPPA steps; returns the run directory.

    ``policies`` may be passed in already loaded (notebooks, tests); by default they are
    built from ``cfg.model``. ``resume``: a run directory to continue from its newest
    checkpoint (``mappa.run.checkpoint``); ``cfg`` must match its config.yaml but for
    ``train.steps``. ``stop_after``: stop once that many steps are done (checkpointed
    there, so ``resume`` continues); the run stays the same run, its learning-rate schedule
    spanning all ``train.steps`` (``mappa experiment --reproduce`` reruns a run's first step
    this way).
    """
    preflight.check(cfg)
    preflight.check_coach_reachable(cfg)  # here, not in check: a coach server may start later
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    made = False
    if resume is None:
        run_dir, made = resolve_run_dir(cfg.run_dir)
        config_text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
        checkpoint.write_atomic(run_dir / "config.yaml", config_text)
    else:
        run_dir = checkpoint.open_run(resume, cfg)
    try:
        tasks = training_tasks(cfg)
        evaluator = TrainingEvaluator(cfg, tasks, run_dir)  # refuses overlapping held-out tasks
        if hf_datasets.READ:  # which rows of which revision this run read
            text = json.dumps(list(hf_datasets.READ.values()), indent=1)
            checkpoint.write_atomic(run_dir / "data.json", text + "\n")
        ckpt = None if resume is None else checkpoint.resumable_checkpoint(run_dir)
        start = 0 if ckpt is None else checkpoint.checkpoint_step(ckpt)
        # before the models load: a tracker that cannot start (no login, a bad URI) costs no
        # load
        live = Trackers(cfg, run_dir, resume_step=start)
    except BaseException:
        if made:  # a run that never started leaves no directory behind (one per {time})
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    log.info("run dir %s; %d tasks; loading %s", run_dir, len(tasks), cfg.model.path)
    try:
        models = _models(cfg, policies)
    except BaseException:
        live.close()
        raise
    adapters, engine, coach = models.policies, models.engine, models.coach
    names = [a.name for a in cfg.agents]
    roles = {a.name: a.role for a in cfg.agents}
    batches = TaskBatches(tasks, cfg.train.prompts_per_step, cfg.train.samples_per_prompt, cfg.seed)
    kl_ctl = KLController(cfg.rl.kl_beta, cfg.rl.kl_target, cfg.rl.kl_horizon)
    coach_guard = FallbackGuard(cfg.coach.max_fallback_steps)  # stops a run the coach fails
    guard = NonFiniteGuard(names, cfg.train.max_nonfinite_steps)
    signal_watch = NoSignalWatch(
        cfg.coach.warn_no_signal_steps, cfg.rl.min_reward_spread, w_process=cfg.rl.w_process
    )
    state = TrainState(
        adapters, models.optimizers, kl_ctl, batches, guard, coach_guard, models.samplers
    )
    try:
        runner = build.make_runner(cfg, engine, models.tokenizer, run_dir / "workspaces")
        probe = build.sync_probe(cfg, models)
    except BaseException:
        models.close()
        live.close()
        raise
    # the update makes the pass anyway wherever it needs the old log-probs before a step
    recompute_old = cfg.rl.recompute_old_logprobs == "always"
    try:
        if ckpt is not None:
            checkpoint.restore(run_dir, state, ckpt)  # RNG: last
        note_code(run_dir, start)
        if start:
            engine.sync(adapters, start)  # the restored adapters
            signal_watch.replay(read_jsonl(run_dir / "metrics.jsonl"))  # cut back to ``start``
        if probe is not None and start:  # the restored adapters, just synced; a fresh
            # start's adapters equal the base (LoRA B = 0), which no probe can tell apart
            log.info("sync probe before step %d: %s", start, probe.check(start))
        saved = start if resume is not None else -1
        before = evaluator.at_start(runner) if start == 0 else {}  # goes on step 0's line
        end = cfg.train.steps if stop_after is None else min(stop_after, cfg.train.steps)
        for step in tqdm(range(start, end), desc="train", unit="step"):
            rollout = runner.run(RolloutInput(next(batches), step, "train"))
            checkpoint.pause_point("rollout", step)
            episodes = rollout.episodes
            t0 = time.monotonic()
            scores = (
                []
                if coach is None
                else score_episodes(coach, episodes, roles, names[-1], CoachView.of(cfg))
            )
            t_coach = time.monotonic() - t0
            append_episodes(run_dir / "episodes.jsonl", episodes)  # before training on them
            coach_guard.observe(scores)

            metrics = rollout_metrics(step, episodes, scores, cfg, signal_watch)
            metrics.update(before)
            before = {}
            engine.release()  # e.g. vLLM sleeps: its memory is the update's until the sync
            metrics.update(models.update(episodes, step, kl_ctl, recompute_old))
            engine.sync(adapters, step + 1)  # the next rollout samples the new adapters
            checkpoint.pause_point("update", step)
            metrics.update(
                rollout_tokens_per_s=rollout.generated_tokens / max(rollout.wall_s, 1e-9),
                rollout_s=rollout.wall_s,
                coach_s=t_coach,
                update_s=time.monotonic() - t0 - t_coach,
            )
            if probe is not None:  # ... provably: a stale adapter stops the run here
                metrics.update(probe.check(step + 1))  # its time is not in update_s
            metrics.update(evaluator.after_step(step, runner))
            append_jsonl(run_dir / "metrics.jsonl", [metrics])
            live.write(metrics, episodes)
            tqdm.write(step_line(step, metrics, names))
            guard.check(step, metrics)  # too many non-finite updates in a row: stop
            if cfg.train.save_every and (step + 1) % cfg.train.save_every == 0:
                checkpoint.save_checkpoint(run_dir, step + 1, state)
                saved = step + 1
        if saved != max(start, end):  # before closing: Ray actors hold the state
            checkpoint.save_checkpoint(run_dir, max(start, end), state)
    except (CoachFatalError, NonFiniteError, StaleAdapterError, WorkerLost, WorkflowFailed) as err:
        err.add_note(checkpoint.resume_hint(run_dir))
        raise
    except KeyboardInterrupt as err:
        err.add_note(checkpoint.resume_hint(run_dir, then=""))
        raise
    finally:
        runner.close()
        models.close()
        live.close()
    log.info("adapters saved under %s", run_dir / "adapters")
    return run_dir
