"""Config -> live objects: policies, the coach behind its cache, the sandbox pool, the
rollout runner. ``train``, ``evaluation`` and the CLI build everything here, so there is one
way to turn a ``RunConfig`` into a run.

``check`` runs the checks that need more than the config schema (the coach template's
placeholders) and is called by the CLI before anything heavy is imported or loaded.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from mappa.coach.templates import CoachTemplate, load_template
from mappa.config import RunConfig, SandboxConfig
from mappa.paths import cache_root
from mappa.sandbox import Limits, SandboxPool, make_backend
from mappa.sandbox.limits import MiB
from mappa.workflow.interface import Phase, SamplingParams

if TYPE_CHECKING:
    import torch

    from mappa.coach import CoachBackend
    from mappa.models.interface import SamplingPolicy
    from mappa.models.policies import AgentPolicies
    from mappa.workflow.chat import ChatFormat
    from mappa.workflow.runner import PipelineRunner


LORA_MIN_LR = 1e-5
"""Below this a LoRA run barely learns (the paper's 1e-6 is a full-finetuning rate)."""


def check(cfg: RunConfig) -> None:
    """Everything about ``cfg`` that can fail before a model loads and needs other modules.

    Raises ``TemplateError`` (a ``ValueError``) naming the template problem; warns about a
    learning rate too small to move a LoRA adapter.
    """
    coach_template(cfg)
    if cfg.rl.lr < LORA_MIN_LR:
        warnings.warn(
            f"rl.lr={cfg.rl.lr:g} is a full-finetuning rate; LoRA adapters start at B=0 and "
            f"barely move below {LORA_MIN_LR:g} (try 1e-5..1e-4)",
            UserWarning,
            stacklevel=2,
        )


def coach_template(cfg: RunConfig) -> CoachTemplate:
    """The run's coach template, with the pipeline described from the run's agents."""
    return load_template(cfg.coach.template).for_pipeline(cfg.agents)


def load_policies(cfg: RunConfig, adapters_dir: Path | None = None) -> AgentPolicies:
    """The base model with one LoRA adapter per agent (loaded from ``adapters_dir``, if given)."""
    from mappa.models.loading import load_base
    from mappa.models.policies import AgentPolicies

    base, tokenizer = load_base(cfg.model.path, cfg.model.dtype, cfg.model.device)
    names = [a.name for a in cfg.agents]
    return AgentPolicies(base, tokenizer, names, cfg.model.lora, adapters_dir, cfg.model.path)


def make_coach(cfg: RunConfig, policies: AgentPolicies | None) -> CoachBackend:
    """The configured coach, behind the score cache unless it is off.

    The default local coach reuses the policy base with adapters off (no extra memory); in
    replay mode no backend is built at all, so nothing can reach a server or load a model.
    """
    from mappa.coach.cache import CachedCoach, ScoreCache

    c = cfg.coach
    template = coach_template(cfg)
    if c.backend == "http":
        model_id = f"{c.http.base_url}|{c.http.model}|{c.http.score_mode}|t={c.http.temperature}"
    else:
        model_id = f"{c.local.model_path or cfg.model.path}|expected"
    namespace = f"{template.digest}|{c.backend}|{model_id}"
    if c.cache.mode == "off":
        return _coach_backend(cfg, template, policies)
    replay = c.cache.mode == "replay"
    inner = None if replay else _coach_backend(cfg, template, policies)
    path = Path(c.cache.path) if c.cache.path else cache_root() / "coach_cache.sqlite"
    return CachedCoach(inner, ScoreCache(path), namespace, replay=replay)


def _coach_backend(
    cfg: RunConfig, template: CoachTemplate, policies: AgentPolicies | None
) -> CoachBackend:
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
        from mappa.models.loading import load_base

        model, tokenizer = load_base(local.model_path, cfg.model.dtype, cfg.model.device)
        dist = ScoreDistributionModel(model, tokenizer, local.batch_size)
    return LocalCoach(dist, template)


def make_optimizers(
    cfg: RunConfig, policies: AgentPolicies
) -> tuple[dict[str, list[torch.nn.Parameter]], dict[str, torch.optim.Adam]]:
    """Per agent: its adapter's parameters and an Adam over them (the lr is set every step
    from ``rl.lr_schedule``: ``mappa.rl.schedule.set_step_lr``)."""
    import torch

    r = cfg.rl
    params, optimizers = {}, {}
    for agent in (a.name for a in cfg.agents):
        params[agent] = policies.adapter_parameters(agent)
        optimizers[agent] = torch.optim.Adam(
            params[agent], lr=r.lr, betas=r.adam_betas, eps=r.adam_eps, weight_decay=r.weight_decay
        )
    return params, optimizers


def sandbox_limits(cfg: SandboxConfig) -> Limits:
    """The run's sandbox limits from its config (sizes there are in MiB)."""
    return Limits(
        wall_time_s=cfg.timeout_s,
        cpu_time_s=cfg.cpu_time_s if cfg.cpu_time_s is not None else 2 * cfg.timeout_s,
        memory_bytes=cfg.memory_mb * MiB,
        max_processes=cfg.max_processes,
        file_size_bytes=cfg.file_size_mb * MiB,
        tmp_bytes=cfg.tmp_size_mb * MiB,
        max_output_chars=cfg.max_output_chars,
        max_output_bytes=max(int(cfg.max_output_mb * MiB), cfg.max_output_chars),
    )


def make_sandbox_pool(cfg: SandboxConfig) -> SandboxPool:
    """The configured backend under the configured limits, ``pool_size`` blocks at once."""
    backend = make_backend(
        cfg.backend,
        python=cfg.python,
        uid_base=cfg.uid_base,
        sandboxfusion_url=cfg.sandboxfusion_url,
    )
    return SandboxPool(backend, sandbox_limits(cfg), cfg.pool_size, cfg.mode)


def sampling_params(cfg: RunConfig) -> dict[Phase, SamplingParams]:
    """Training samples at ``rollout.temperature``; evaluation at ``eval.temperature``
    (0: greedy, with log-probs recorded at the training temperature)."""
    r = cfg.rollout
    return {
        "train": SamplingParams(r.temperature, False, r.max_new_tokens, r.batch_size),
        "eval": SamplingParams(
            cfg.eval.temperature or r.temperature,
            cfg.eval.temperature == 0.0,
            r.max_new_tokens,
            r.batch_size,
        ),
    }


def make_runner(cfg: RunConfig, policies: AgentPolicies, workspace_root: Path) -> PipelineRunner:
    """The in-process rollout over ``policies``; close it to end its sandboxes."""
    from mappa.workflow.chat import ChatFormat

    return runner_for(cfg, policies, ChatFormat(policies.tokenizer), workspace_root)


def runner_for(
    cfg: RunConfig, policy: SamplingPolicy, chat: ChatFormat, workspace_root: Path
) -> PipelineRunner:
    """The pipeline runner of ``cfg`` over any sampling policy and chat format."""
    from mappa.workflow.runner import PipelineRunner

    return PipelineRunner(
        policy,
        chat,
        cfg.agents,
        cfg.workflow,
        sampling_params(cfg),
        cfg.rollout.max_prompt_tokens,
        make_sandbox_pool(cfg.sandbox),
        workspace_root,
        cfg.tasks.answer_format,
        cfg.tasks.grade_timeout_s,
    )
