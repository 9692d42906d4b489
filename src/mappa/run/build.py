"""Config -> live objects: policies, the rollout engine, the coach behind its cache, the
sandbox pool, the rollout runner, and ``local_models`` (a run's ``RunModels`` in this
process). The loop, evaluation and the CLI build everything here, so there is one way to
turn a ``RunConfig`` into a run; ``mappa.cluster.launch`` builds the same ``RunModels`` in
Ray actors from these builders.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mappa.config import RunConfig, SandboxConfig
from mappa.paths import cache_root
from mappa.run.models import RunModels
from mappa.run.preflight import coach_on_engine, coach_template
from mappa.sandbox import Limits, SandboxPool, make_backend
from mappa.sandbox.limits import MiB
from mappa.workflow.interface import Phase, SamplingParams

if TYPE_CHECKING:
    import torch

    from mappa.coach import CoachBackend
    from mappa.models.interface import RolloutEngine, SamplingPolicy
    from mappa.models.llamacpp_scorer import LlamaCppScoreDistribution
    from mappa.models.policies import AgentPolicies
    from mappa.models.scorer import ScoreDistributionModel
    from mappa.models.sync_probe import SyncProbe
    from mappa.records import Episode
    from mappa.rl.kl import KLController
    from mappa.workflow.chat import ChatFormat
    from mappa.workflow.function import FunctionRunner
    from mappa.workflow.interface import Rollout
    from mappa.workflow.team import WorkflowFn


def load_policies(
    cfg: RunConfig, adapters_dir: Path | None = None, agents: Sequence[str] | None = None
) -> AgentPolicies:
    """The base model with one LoRA adapter per agent (loaded from ``adapters_dir``, if given).

    ``agents``: only these agents' adapters (a Ray trainer actor holds one agent); each is
    initialised as in a process that holds them all (``AgentPolicies``' ``seed``).
    """
    from mappa.models.loading import load_base
    from mappa.models.policies import AgentPolicies

    base, tokenizer = load_base(cfg.model.path, cfg.model.dtype, cfg.model.device)
    names = [a.name for a in cfg.agents] if agents is None else list(agents)
    return AgentPolicies(
        base,
        tokenizer,
        names,
        cfg.model.lora,
        adapters_dir,
        cfg.model.path,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        seed=cfg.seed,
    )


def make_coach(
    cfg: RunConfig,
    policies: AgentPolicies | None,
    engine: RolloutEngine | None = None,
    *,
    backend: Callable[[], CoachBackend] | None = None,
) -> CoachBackend:
    """The configured coach, behind the score cache unless it is off.

    The default local coach reuses the policy base with adapters off (no extra memory): on
    the rollout's vLLM ``engine`` where ``coach_on_engine``, else on ``policies``' model. A
    command that builds no engine (``mappa coach-check``) scores ``auto`` with transformers.
    ``backend`` builds the backend instead (a Ray run's coach lives in actors; the cache
    stays with the driver). In replay mode no backend is built at all, so nothing can reach
    a server or load a model.
    """
    from mappa.coach.cache import CachedCoach, ScoreCache

    c = cfg.coach
    if not c.is_model:  # a rule is cheaper to run than to look up
        return (backend or (lambda: coach_backend(cfg, policies, engine)))()
    namespace = coach_namespace(cfg)
    build = backend or (lambda: coach_backend(cfg, policies, engine))
    if c.cache.mode == "off":
        return build()
    replay = c.cache.mode == "replay"
    inner = None if replay else build()
    path = Path(c.cache.path) if c.cache.path else cache_root() / "coach_cache.sqlite"
    return CachedCoach(inner, ScoreCache(path), namespace, replay=replay)


def coach_namespace(cfg: RunConfig) -> str:
    """The score cache's namespace: every setting besides the action's context (which the
    key hashes itself) that can change a model coach's score. The template's text; for
    ``http`` every request setting that changes a reply and the reading rule
    (``request_fingerprint``); for ``local`` the model, where the score is read
    (``at-digit``: scores read after the colon were noise), the weights' precision (the
    resolved ``model.dtype`` for transformers and vLLM, which both load the base with it;
    a GGUF's own for llama.cpp, with what it writes first, ``reply_tokens``) and
    ``min_digit_mass``, which decides whether a score is flagged. Batch sizes, threads and
    the engine between ``hf`` and ``vllm`` (the same distribution to about 1e-5) are left
    out, so tuning them keeps the cache. With ``self_solve`` its settings too: the worked
    answer is not in the context the key hashes."""
    c = cfg.coach
    if c.backend == "http":
        from mappa.coach.http import request_fingerprint

        model_id = request_fingerprint(c.http)
    else:
        local = c.local
        if local.engine == "llamacpp":
            weights = f"llamacpp|reply={local.reply_tokens}"
        else:
            from mappa.models.loading import resolve_device, resolve_dtype

            dtype = resolve_dtype(cfg.model.dtype, resolve_device(cfg.model.device))
            weights = f"dtype={str(dtype).removeprefix('torch.')}"
        model = local.model_path or cfg.model.path
        model_id = f"{model}|expected|at-digit|{weights}|min_mass={local.min_digit_mass}"
    if c.self_solve:  # the worked answer is not in the cached context: it is in the key here
        model_id += f"|self-solve={c.self_solve_tokens}|agree={c.agreement_weight}"
    return f"{coach_template(cfg).digest}|{c.backend}|{model_id}"


def coach_backend(
    cfg: RunConfig, policies: AgentPolicies | None, engine: RolloutEngine | None
) -> CoachBackend:
    """The configured coach itself, uncached (``make_coach`` puts the cache around it)."""
    if cfg.coach.backend == "rules":
        from mappa.coach.rules import RuleCoach, load_rule

        spec = cfg.coach.rules.function
        return RuleCoach(load_rule(spec), spec)
    template = coach_template(cfg)
    if cfg.coach.backend == "http":
        from mappa.coach.http import HttpCoach

        return HttpCoach(cfg.coach.http, template)
    from mappa.coach.local import LocalCoach
    from mappa.models.vllm_engine import VllmEngine, VllmScoreDistribution

    local = cfg.coach.local
    if coach_on_engine(cfg):
        if isinstance(engine, VllmEngine):
            return LocalCoach(VllmScoreDistribution(engine), template, local.min_digit_mass)
        if local.engine == "vllm":
            raise ValueError(
                "coach.local.engine: 'vllm' scores on the run's vLLM rollout engine, which "
                "this command does not start; use coach.local.engine: auto or hf"
            )
    if local.engine == "llamacpp":
        import torch

        from mappa.models.llamacpp_scorer import LlamaCppScoreDistribution
        from mappa.models.packages import gguf_path

        if local.model_path is None:
            raise ValueError(
                "coach.local.engine: llamacpp reads a GGUF: set coach.local.model_path to a "
                ".gguf file or a pypi: model package"
            )
        threads = torch.get_num_threads()  # the trainer's threads idle while the coach reads
        dist: LlamaCppScoreDistribution | ScoreDistributionModel = LlamaCppScoreDistribution(
            gguf_path(local.model_path), local.context_tokens, threads, local.reply_tokens
        )
    else:
        from mappa.models.scorer import ScoreDistributionModel

        if local.model_path is None:
            if policies is None:
                raise ValueError(
                    "the local coach without coach.local.model_path needs the policy model"
                )
            dist = ScoreDistributionModel(
                policies.model,
                policies.tokenizer,
                local.batch_size,
                local.batch_tokens,
                activate=lambda: policies.use(None),
            )
        else:
            from mappa.models.loading import load_base

            model, tokenizer = load_base(local.model_path, cfg.model.dtype, cfg.model.device)
            dist = ScoreDistributionModel(model, tokenizer, local.batch_size, local.batch_tokens)
    coach = LocalCoach(dist, template, local.min_digit_mass)
    if not cfg.coach.self_solve:
        return coach
    from mappa.coach.self_solve import SelfSolvingCoach, WorkedAnswers

    answers = WorkedAnswers(dist, cfg.coach.self_solve_tokens)
    return SelfSolvingCoach(coach, answers, cfg.coach.agreement_weight)


def make_optimizers(
    cfg: RunConfig, policies: AgentPolicies
) -> tuple[dict[str, list[torch.nn.Parameter]], dict[str, torch.optim.Adam]]:
    """Per agent of ``policies``: its adapter's parameters and an Adam over them (the lr is
    set every step from ``rl.lr_schedule``: ``mappa.rl.schedule.set_step_lr``)."""
    import torch

    r = cfg.rl
    params, optimizers = {}, {}
    for agent in policies.agents:
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


def make_engine(cfg: RunConfig, policies: AgentPolicies) -> RolloutEngine:
    """The rollout's sampler (``rollout.engine``), holding ``policies``' current adapters.

    ``hf`` samples from ``policies``' own modules. ``vllm`` is a separate in-process engine
    over the same base model, given the adapters now and by ``sync`` after every update.
    """
    if cfg.rollout.engine == "hf":
        from mappa.models.hf_engine import HfEngine

        return HfEngine(policies)
    from mappa.models.vllm_engine import VllmEngine

    engine = VllmEngine(
        cfg,
        policies.tokenizer,
        policies.stop_ids,
        agents=policies.agents,
        scores_coach=coach_on_engine(cfg),
    )
    try:
        engine.sync(policies, 0)
    except BaseException:
        engine.close()
        raise
    return engine


def sync_probe(cfg: RunConfig, models: RunModels) -> SyncProbe | None:
    """The check run after every sync of ``models.engine`` (``rollout.sync_check``; None when
    off): the engine's log-probs of the probe text against the trainer's, agent by agent."""
    if cfg.rollout.sync_check == "off":
        return None
    from mappa.models.loading import resolve_device, resolve_dtype
    from mappa.models.sync_probe import SyncProbe, default_tolerance

    dtype = resolve_dtype(cfg.model.dtype, resolve_device(cfg.model.device))
    tolerance = cfg.rollout.sync_tolerance or default_tolerance(dtype)
    return SyncProbe(
        models.engine,
        models.policies,
        [a.name for a in cfg.agents],
        models.tokenizer,
        tolerance,
        str(dtype).removeprefix("torch."),
    )


def make_runner(
    cfg: RunConfig, engine: RolloutEngine, tokenizer: object, workspace_root: Path
) -> Rollout:
    """The in-process rollout sampling from ``engine``; close it to end its sandboxes."""
    from mappa.workflow.chat import ChatFormat

    chat = ChatFormat(tokenizer, cfg.model.chat_template_kwargs)
    return runner_for(cfg, engine, chat, workspace_root)


def runner_for(
    cfg: RunConfig,
    policy: SamplingPolicy,
    chat: ChatFormat,
    workspace_root: Path,
    function: WorkflowFn | None = None,
) -> FunctionRunner:
    """The rollout of ``cfg`` over any sampling policy and chat format: of ``function`` when
    given, else of the config's workflow function (``workflow.function``), else of its
    preset pipeline written as one (``preset_workflow``)."""
    from mappa.workflow.function import FunctionRunner, load_workflow
    from mappa.workflow.preset import preset_workflow

    if function is None:
        function = (
            preset_workflow(cfg.agents, cfg.workflow)
            if cfg.workflow.function is None
            else load_workflow(cfg.workflow.function)
        )
    return FunctionRunner(
        function,
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


def local_models(cfg: RunConfig, policies: AgentPolicies | None = None) -> RunModels:
    """Everything in this process: ``policies`` (loaded from ``cfg.model`` unless given), an
    Adam per agent, the configured engine and coach; the update is ``update_agents``."""
    from mappa.rl.experience import shuffle_seed
    from mappa.rl.schedule import set_step_lr
    from mappa.rl.update import update_agents

    policies = policies or load_policies(cfg)
    params, optimizers = make_optimizers(cfg, policies)
    engine = make_engine(cfg, policies)
    # a reward without coach scores (outcome_only, w_process 0) asks no coach at all
    coach = make_coach(cfg, policies, engine) if cfg.rl.needs_coach else None
    names = [a.name for a in cfg.agents]

    def update(
        episodes: Sequence[Episode], step: int, kl_ctl: KLController, recompute_old: bool
    ) -> dict[str, Any]:
        lr = set_step_lr(optimizers.values(), cfg.rl, step, cfg.train.steps)
        metrics = update_agents(
            policies,
            episodes,
            names,
            optimizers,
            params,
            cfg.rl,
            kl_ctl,
            exclude_flagged=cfg.coach.exclude_flagged,
            temperature=cfg.rollout.temperature,
            recompute_old=recompute_old,
            seed=shuffle_seed(cfg.seed, step),
        )
        return {"lr": lr, **metrics}

    return RunModels(
        policies=policies,
        optimizers=optimizers,
        engine=engine,
        coach=coach,
        tokenizer=policies.tokenizer,
        update=update,
        close=engine.close,
    )
