"""The training loop: rollout -> coach -> advantages -> per-agent update -> checkpoint.

Episodes are appended to ``<run_dir>/episodes.jsonl`` (with coach scores and exact token
ids) *before* they are trained on, and one line per step goes to ``metrics.jsonl``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from statistics import mean
from typing import Any

import torch
import yaml
from tqdm import tqdm

from mappa.coach import CoachBackend, score_episodes
from mappa.coach.stats import accounting, bias
from mappa.config import RunConfig
from mappa.evaluation import TrainingEvaluator
from mappa.jsonl import append_jsonl
from mappa.models.loading import load_base
from mappa.models.policies import AgentPolicies
from mappa.paths import cache_root
from mappa.rl.core import KLController, masked_mean
from mappa.rl.update import build_batch, compute_advantages, policy_step, reference_logprobs
from mappa.tasks import Task, load_tasks
from mappa.workflow.chat import ChatFormat
from mappa.workflow.records import Episode, append_episodes
from mappa.workflow.runner import PipelineRunner

log = logging.getLogger(__name__)


def resolve_run_dir(run_dir: Path) -> Path:
    """Expand ``{time}`` in the configured run dir; refuse to mix two runs in one dir."""
    path = Path(str(run_dir).format(time=datetime.now().strftime("%Y%m%d-%H%M%S")))
    if (path / "metrics.jsonl").exists() or (path / "episodes.jsonl").exists():
        raise FileExistsError(f"{path} already holds a run; choose another run_dir")
    path.mkdir(parents=True, exist_ok=True)
    return path


def make_coach(cfg: RunConfig, policies: AgentPolicies | None) -> CoachBackend:
    """The configured coach, behind the score cache unless it is off.

    The default local coach reuses the policy base with adapters off (no extra memory); in
    replay mode no backend is built at all, so nothing can reach a server or load a model.
    """
    from mappa.coach.cache import CachedCoach, ScoreCache
    from mappa.coach.templates import load_template

    c = cfg.coach
    template = load_template(c.template)
    if c.backend == "http":
        model_id = f"{c.http.base_url}|{c.http.model}|{c.http.score_mode}|t={c.http.temperature}"
    else:
        model_id = f"{c.local.model_path or cfg.model.path}|expected"
    namespace = f"{template.digest}|{c.backend}|{model_id}"
    replay = c.cache.mode == "replay"
    inner: CoachBackend | None = None
    if not replay:
        inner = _backend(cfg, template, policies)
    if c.cache.mode == "off":
        assert inner is not None
        return inner
    path = Path(c.cache.path) if c.cache.path else cache_root() / "coach_cache.sqlite"
    return CachedCoach(inner, ScoreCache(path), namespace, replay=replay)


def _backend(cfg: RunConfig, template: Any, policies: AgentPolicies | None) -> CoachBackend:
    if cfg.coach.backend == "http":
        from mappa.coach.http import HttpCoach

        return HttpCoach(cfg.coach.http, template)
    from mappa.coach.local import LocalCoach
    from mappa.models.scorer import ScoreDistributionModel

    local = cfg.coach.local
    if local.model_path is None:
        if policies is None:
            raise ValueError(
                "the local coach without coach.local.model_path needs the policy model"
            )
        dist = ScoreDistributionModel(
            policies.model,
            policies.tokenizer,
            local.batch_size,
            activate=lambda: policies.use(None),
        )
    else:
        model, tokenizer = load_base(local.model_path, cfg.model.dtype, cfg.model.device)
        dist = ScoreDistributionModel(model, tokenizer, local.batch_size)
    return LocalCoach(dist, template)


def task_batches(
    tasks: Sequence[Task], per_step: int, samples: int, seed: int
) -> Iterator[list[Task]]:
    """Endless batches: ``per_step`` distinct tasks (reshuffled each epoch), each repeated."""
    rng = random.Random(seed)
    order: list[Task] = []
    while True:
        batch: list[Task] = []
        while len(batch) < per_step:
            if not order:
                order = list(tasks)
                rng.shuffle(order)
            batch.append(order.pop())
        yield [t for t in batch for _ in range(samples)]


def build_runner(cfg: RunConfig, policies: AgentPolicies, workspace_root: Path) -> PipelineRunner:
    return PipelineRunner(
        policies,
        ChatFormat(policies.tokenizer),
        cfg.agents,
        cfg.workflow,
        cfg.rollout,
        cfg.sandbox,
        workspace_root,
        cfg.coach.observation_chars,
    )


def load_policies(cfg: RunConfig, adapters_dir: Path | None = None) -> AgentPolicies:
    base, tokenizer = load_base(cfg.model.path, cfg.model.dtype, cfg.model.device)
    return AgentPolicies(
        base, tokenizer, [a.name for a in cfg.agents], cfg.model.lora, adapters_dir
    )


def step_metrics(step: int, episodes: list[Episode], agents: Sequence[str]) -> dict[str, Any]:
    """Per-agent coach scores and outcome accuracy of one rollout batch."""
    out: dict[str, Any] = {"step": step, "episodes": len(episodes)}
    graded = [e.correct for e in episodes if e.correct is not None]
    out["accuracy"] = mean(graded) if graded else None
    for agent in agents:
        acts = [a for e in episodes for a in e.agent_actions(agent)]
        scores = [a.coach.value for a in acts if a.coach is not None and not a.coach.flagged]
        out[f"coach/{agent}"] = mean(scores) if scores else None
        out[f"actions/{agent}"] = len(acts)
        out[f"truncated/{agent}"] = sum(a.truncated for a in acts)
        out[f"tool_calls/{agent}"] = sum(a.tool_observation is not None for a in acts)
    return out


def _update(
    policies: AgentPolicies,
    episodes: list[Episode],
    names: Sequence[str],
    optimizers: dict[str, torch.optim.Optimizer],
    params: dict[str, list[torch.nn.Parameter]],
    cfg: RunConfig,
    kl_ctl: KLController,
) -> dict[str, Any]:
    """Advantages over the whole batch, then one optimizer step per agent."""
    items = [
        (e, a)
        for e in episodes
        for a in e.actions
        if a.coach is not None and not (cfg.coach.exclude_flagged and a.coach.flagged)
    ]
    out: dict[str, Any] = {"kl_beta": kl_ctl.beta, "trained_actions": len(items)}
    if not items:
        out["mean_kl"] = None
        return out
    batch = build_batch(items, cfg.rl)
    temperature = cfg.rollout.temperature
    ref = reference_logprobs(
        policies, batch.actions, batch.old.shape[1], cfg.rl.micro_batch_size, temperature
    )
    advantages, _, kl = compute_advantages(batch, ref, cfg.rl, kl_ctl.beta)
    for name in names:
        stats = policy_step(
            policies,
            name,
            batch,
            advantages,
            ref,
            optimizers[name],
            params[name],
            cfg.rl,
            kl_ctl.beta,
            temperature,
        )
        out.update({f"rl/{name}/{k}": v for k, v in asdict(stats).items()})
    out["mean_kl"] = float(masked_mean(kl, batch.valid))
    kl_ctl.update(out["mean_kl"], int(batch.valid.sum()))
    return out


def _fmt(x: Any) -> str:
    return "-" if x is None else (f"{x:.3g}" if isinstance(x, float) else str(x))


def train(cfg: RunConfig, policies: AgentPolicies | None = None) -> Path:
    """Run ``cfg.train.steps`` MAPPA steps; returns the run directory.

    ``policies`` may be passed in already loaded (notebooks, tests); by default they are
    built from ``cfg.model``.
    """
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    run_dir = resolve_run_dir(cfg.run_dir)
    (run_dir / "config.yaml").write_text(
        yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    )
    tasks = load_tasks(cfg.tasks.source, cfg.tasks.num_tasks, cfg.tasks.difficulty, cfg.seed)
    evaluator = TrainingEvaluator(
        cfg, tasks, run_dir
    )  # refuses a held-out set overlapping training
    log.info("run dir %s; %d tasks; loading %s", run_dir, len(tasks), cfg.model.path)

    policies = policies or load_policies(cfg)
    coach = make_coach(cfg, policies)
    runner = build_runner(cfg, policies, run_dir / "workspaces")
    names = [a.name for a in cfg.agents]
    roles = {a.name: a.role for a in cfg.agents}
    params = {n: policies.adapter_parameters(n) for n in names}
    optimizers = {
        n: torch.optim.Adam(params[n], lr=cfg.rl.lr, weight_decay=cfg.rl.weight_decay)
        for n in names
    }
    batches = task_batches(
        tasks, cfg.train.prompts_per_step, cfg.train.samples_per_prompt, cfg.seed
    )
    kl_ctl = KLController(cfg.rl.kl_beta, cfg.rl.kl_target, cfg.rl.kl_horizon)

    for step in tqdm(range(cfg.train.steps), desc="train", unit="step"):
        t0 = time.monotonic()
        episodes = runner.run(next(batches), step=step)
        t_roll = time.monotonic() - t0
        gen_tokens = sum(len(a.completion_ids) for e in episodes for a in e.actions)
        scores = score_episodes(
            coach,
            episodes,
            roles,
            names[-1],
            cfg.coach.observation_chars,
            cfg.coach.show_ground_truth,
            cfg.rollout.max_new_tokens,
        )
        t_coach = time.monotonic() - t0 - t_roll
        append_episodes(run_dir / "episodes.jsonl", episodes)  # before training on them

        metrics = step_metrics(step, episodes, names)
        prices = cfg.coach.price_per_mtok
        metrics.update(accounting(scores, prices.prompt, prices.completion))
        metrics.update(bias(episodes, names[-1]))
        metrics.update(_update(policies, episodes, names, optimizers, params, cfg, kl_ctl))
        metrics.update(
            rollout_tokens_per_s=gen_tokens / max(t_roll, 1e-9),
            rollout_s=t_roll,
            coach_s=t_coach,
            update_s=time.monotonic() - t0 - t_roll - t_coach,
        )
        metrics.update(evaluator.after_step(step, episodes, policies))
        append_jsonl(run_dir / "metrics.jsonl", [metrics])
        coach_txt = " ".join(f"{n}={_fmt(metrics[f'coach/{n}'])}" for n in names)
        tqdm.write(
            f"step {step}: coach[{coach_txt}] acc={_fmt(metrics['accuracy'])} "
            f"kl={_fmt(metrics['mean_kl'])} tok/s={metrics['rollout_tokens_per_s']:.1f} "
            f"flagged={metrics['coach/flagged']}"
        )
        if cfg.train.save_every and (step + 1) % cfg.train.save_every == 0:
            policies.save(run_dir / "adapters")
    policies.save(run_dir / "adapters")
    log.info("adapters saved under %s", run_dir / "adapters")
    return run_dir
