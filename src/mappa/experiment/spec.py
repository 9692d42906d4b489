"""An experiment file, validated, and the runs it stands for.

An experiment compares *arms* (lists of ``key=value`` overrides of one base run config) over
*seeds*. Every arm x seed is an ordinary run, so its whole config is resolved here, before
anything runs: a typo in any arm fails at once, naming the arm, and the comparison's
fairness is checked on the resolved configs (same tasks, same held-out evaluation, same
rollout budget) rather than trusted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from mappa.config import ConfigError, RunConfig, load_config
from mappa.config.loading import format_errors, read_yaml
from mappa.config.schema import Strict

if TYPE_CHECKING:
    from mappa.coach.servers import LocalServer

OWNED_KEYS = ("seed", "run_dir", "tasks.seed")
"""Keys the experiment sets for every run; an arm or the common overrides may not."""


class ExperimentError(ValueError):
    """An experiment that cannot run (bad file, unfair arms) or a run of it that failed."""


class CoachServerSpec(Strict):
    """A local OpenAI-compatible coach server the experiment starts once for the arms that
    ask a coach (``mappa.coach.servers``; the same options as ``mappa coach-serve``)."""

    server: Literal["llamacpp", "vllm"] = Field(
        "llamacpp", description="llamacpp: a GGUF, one request at a time; vllm: batches."
    )
    model: str = Field(
        ..., description="pypi:<package>, a GGUF file (llamacpp) or a model directory (vllm)."
    )
    max_model_len: int = Field(4096, ge=256, description="The server's context length.")
    threads: int = Field(1, ge=1, description="llamacpp: decoding threads.")
    kv_cache_gib: float = Field(1.0, gt=0.0, description="vllm: KV cache size, GiB.")
    port: int | None = Field(None, ge=1, le=65535, description="null: a free port.")

    def build(self) -> LocalServer:
        """This server, not started (``make_server``: raises ``ValueError``/``OSError`` when
        it is not installed or the model is not what it reads)."""
        from mappa.coach.servers import make_server

        return make_server(
            self.server, self.model, self.max_model_len, self.threads, self.kv_cache_gib, self.port
        )


class LookSpec(Strict):
    """One look part way, at the spread only, stated before the runs: after the first
    ``after_seeds`` complete seed blocks, the sample SD of the primary comparison's per-seed
    differences decides how many seeds the experiment runs (``mappa experiment --look``).
    The differences' mean is not read: a look that saw it could stop on a lucky gap."""

    after_seeds: int = Field(
        ..., ge=2, description="Complete seed blocks (the file's first seeds) before the look."
    )
    seeds_if_sd_above: dict[float, int] = Field(
        ...,
        min_length=1,
        description="SD threshold -> seeds to run when the SD is above it (the largest count "
        "whose threshold it exceeds); not above any: the file's seeds. A look never cuts "
        "the seeds the file lists.",
    )

    @field_validator("seeds_if_sd_above")
    @classmethod
    def _positive(cls, rule: dict[float, int]) -> dict[float, int]:
        bad = [f"{t}: {n}" for t, n in rule.items() if t <= 0 or n < 2]
        if bad:
            raise ValueError(f"{', '.join(bad)}: thresholds are SDs > 0, counts >= 2 seeds")
        return rule


class AnalysisSpec(Strict):
    """The comparisons of final held-out accuracy, named before any run
    (``mappa.experiment.verdicts``): the primary is tested alone, the secondary ones are
    Holm-corrected together."""

    primary: tuple[str, str] | None = Field(
        None, description="[A, B]: the comparison the experiment is for; null: none."
    )
    secondary: list[tuple[str, str]] | None = Field(
        None,
        description="[[A, B], ...]: the other comparisons; null: every pair of arms but the "
        "primary.",
    )

    look: LookSpec | None = Field(
        None, description="One look at the primary's spread part way; null: none."
    )

    def pairs(self) -> list[tuple[str, str]]:
        return ([self.primary] if self.primary else []) + list(self.secondary or [])


class ExperimentConfig(Strict):
    """The experiment file: a base run config, overrides common to all arms, seeds, arms."""

    base: str = Field(
        ...,
        description="The run config every arm starts from: a path relative to the experiment "
        "file, or the name of a config shipped with mappa (e.g. `mathchat_cpu`).",
    )
    overrides: list[str] = Field(
        default_factory=list, description="`key=value` overrides applied to every arm."
    )
    seeds: list[int] = Field(..., min_length=1, description="Each arm runs once per seed.")
    arms: dict[str, list[str]] = Field(
        ..., min_length=1, description="Arm name -> its `key=value` overrides."
    )
    coach_server: CoachServerSpec | None = Field(
        None, description="Start this coach server for the arms that ask a coach."
    )
    analysis: AnalysisSpec = Field(
        default_factory=AnalysisSpec,
        description="The primary and secondary comparisons; absent: no primary, every pair "
        "secondary.",
    )

    @field_validator("overrides")
    @classmethod
    def _common_overrides(cls, overrides: list[str]) -> list[str]:
        _refuse_owned(overrides, "overrides")
        return overrides

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds repeat: {seeds}")
        return seeds

    @field_validator("arms")
    @classmethod
    def _arm_names(cls, arms: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, overrides in arms.items():
            if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", name):
                raise ValueError(f"arm {name!r}: names are lower case, digits, _ . -")
            _refuse_owned(overrides, f"arm {name!r}")
        return arms

    @field_validator("analysis")
    @classmethod
    def _compared_arms(cls, analysis: AnalysisSpec, info: ValidationInfo) -> AnalysisSpec:
        arms = list(info.data.get("arms") or {})
        if not arms:  # the arms failed their own validation, which says so
            return analysis
        seen: list[set[str]] = []
        for a, b in analysis.pairs():
            for name in (a, b):
                if name not in arms:
                    raise ValueError(f"{name!r} is not an arm (arms: {', '.join(arms)})")
            if a == b:
                raise ValueError(f"[{a}, {b}] compares an arm with itself")
            if {a, b} in seen:
                raise ValueError(f"[{a}, {b}] is named twice")
            seen.append({a, b})
        return analysis

    @model_validator(mode="after")
    def _look_fits(self) -> ExperimentConfig:
        look = self.analysis.look
        if look is None:
            return self
        planned = len(self.seeds)
        if self.analysis.primary is None:
            raise ValueError("analysis.look reads the primary comparison's spread: name one")
        if look.after_seeds >= planned:
            raise ValueError(
                f"analysis.look.after_seeds={look.after_seeds}: the look comes part way, "
                f"before the last of the {planned} seeds"
            )
        fewer = [n for n in look.seeds_if_sd_above.values() if n <= look.after_seeds]
        if fewer:
            raise ValueError(
                f"analysis.look.seeds_if_sd_above: {fewer} seeds is not more than the "
                f"{look.after_seeds} looked at; a look adds seeds"
            )
        return self


def _refuse_owned(overrides: list[str], where: str) -> None:
    owned = [o for o in overrides if o.split("=", 1)[0].strip() in OWNED_KEYS]
    if owned:
        raise ValueError(f"{where}: {owned} are set by the experiment")


@dataclass(frozen=True)
class RunSpec:
    """One arm x seed: its name (``<arm>-s<seed>``) and its fully resolved config."""

    arm: str
    seed: int
    config: RunConfig

    @property
    def name(self) -> str:
        return f"{self.arm}-s{self.seed}"


def shipped_configs() -> Path:
    """The configs shipped inside the package (``configs/`` in the repo links to it)."""
    return Path(str(resources.files("mappa") / "configs"))


def shipped_config_names() -> list[str]:
    return sorted(p.stem for p in shipped_configs().glob("*.yaml"))


def shipped_config(name: str) -> Path | None:
    """The config shipped with mappa called ``name`` (``smoke``, or ``smoke.yaml``), if any."""
    path = shipped_configs() / f"{name.removesuffix('.yaml')}.yaml"
    return path if path.is_file() else None


def base_config_path(base: str, experiment_file: Path) -> Path:
    """``base`` relative to the experiment file, else a shipped config by name."""
    relative = experiment_file.parent / base
    if relative.is_file():
        return relative
    shipped = shipped_config(base)
    if shipped is not None:
        return shipped
    raise ExperimentError(
        f"{experiment_file}: base {base!r} is neither a file next to it ({relative}) nor a "
        f"shipped config {shipped_config_names()}"
    )


def experiment_keys(raw: object) -> list[str]:
    """The top-level keys of a YAML document that only an experiment file has (``base``,
    ``seeds``, ``arms``): none for a run config."""
    fields = ExperimentConfig.model_fields
    own = [k for k, f in fields.items() if f.is_required() and k not in RunConfig.model_fields]
    return [k for k in own if k in raw] if isinstance(raw, dict) else []


def run_config_keys(raw: object) -> list[str]:
    """The top-level keys of a YAML document that only a run config has (``model``,
    ``train``, ...): none for an experiment file."""
    own = [k for k in RunConfig.model_fields if k not in ExperimentConfig.model_fields]
    return [k for k in own if k in raw] if isinstance(raw, dict) else []


def load_experiment(path: Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read and validate an experiment file; errors name the file and the key.

    ``overrides`` (``key=value``, e.g. from the command line) are added to the file's common
    ``overrides``, after them.
    """
    if not path.is_file():
        raise ExperimentError(f"{path}: experiment file not found")
    try:
        raw = read_yaml(path)
    except ConfigError as err:
        raise ExperimentError(str(err)) from None
    if raw is None:
        raise ExperimentError(
            f"{path}: the file is empty; an experiment names its base, seeds and arms "
            "(docs/experiments.md)"
        )
    if not experiment_keys(raw) and (keys := run_config_keys(raw)):
        raise ExperimentError(
            f"{path} is a run config (it has {', '.join(keys)}); run it with: mappa train "
            f"--config {path}"
        )
    if overrides and isinstance(raw, dict):
        raw["overrides"] = [*(raw.get("overrides") or []), *overrides]
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        problems = format_errors(err, str(path), root=ExperimentConfig, kind="experiment")
        raise ExperimentError(problems) from None


def _load(path: Path, overrides: list[str], arm: str) -> RunConfig:
    try:
        return load_config(path, overrides)
    except ConfigError as err:
        raise ExperimentError(f"arm {arm!r}: {err}") from None


def plan_runs(
    spec: ExperimentConfig, experiment_file: Path, out: Path, coach_url: str | None = None
) -> list[RunSpec]:
    """Every arm x seed's resolved config, seed by seed: every arm of a seed before the next
    seed, so an experiment stopped or looked at part way holds complete blocks (each seed's
    arms ran under the same code and machine state, and pair with one another). Raises
    ``ExperimentError`` naming the arm for an override the run config refuses, and for arms
    that are not comparable.

    Each run gets ``seed``, ``run_dir = <out>/runs/<arm>-s<seed>`` and ``tasks.seed`` (the
    base's task seed, so every seed sees the same problems). With ``coach_url`` (a coach
    server the experiment runs), arms that ask a coach are pointed at it.
    """
    base = base_config_path(spec.base, experiment_file)
    task_seed = _load(base, spec.overrides, "(common overrides)").task_seed
    runs = []
    for seed in spec.seeds:
        for arm, arm_overrides in spec.arms.items():
            overrides = [
                *spec.overrides,
                f"tasks.seed={task_seed}",
                *arm_overrides,
                f"seed={seed}",
                f"run_dir={out / 'runs' / f'{arm}-s{seed}'}",
            ]
            cfg = _load(base, overrides, arm)
            if coach_url is not None and cfg.asks_model_coach:
                cfg = _load(base, [*overrides, *http_coach_overrides(coach_url)], arm)
            runs.append(RunSpec(arm, seed, cfg))
    check_comparable(runs)
    return runs


def http_coach_overrides(base_url: str) -> list[str]:
    """What points a run's coach at an experiment's coach server."""
    from mappa.coach.servers import SERVED_MODEL

    return [
        "coach.backend=http",
        f"coach.http.base_url={base_url}",
        f"coach.http.model={SERVED_MODEL}",
    ]


def budget(cfg: RunConfig) -> int:
    """Episodes a run samples for training: steps x prompts_per_step x samples_per_prompt."""
    t = cfg.train
    return t.steps * t.prompts_per_step * t.samples_per_prompt


def heldout_signature(cfg: RunConfig) -> dict[str, Any]:
    """What makes two runs' held-out evaluations the same: the problems, how they are
    sampled and graded, and when."""
    from mappa.run.evaluation import heldout_tasks

    e = cfg.eval
    return {
        "tasks": [(t.task_id, t.prompt, t.answer) for t in heldout_tasks(cfg)],
        "samples": e.samples,
        "temperature": e.temperature,
        "every": e.every,
        "answer_format": cfg.tasks.answer_format,
    }


def check_comparable(runs: list[RunSpec]) -> None:
    """Refuse arms that are not a fair comparison: held-out eval off, different held-out
    evaluations, different training problems, or different rollout budgets."""
    from mappa.run.evaluation import training_tasks

    off = sorted({r.arm for r in runs if not r.config.eval.every})
    if off:
        raise ExperimentError(f"arms {off}: held-out eval is off; set eval.every > 0")
    budgets = {r.arm: budget(r.config) for r in runs}
    if len(set(budgets.values())) > 1:
        raise ExperimentError(
            "arms differ in rollout budget (train.steps x prompts_per_step x "
            f"samples_per_prompt): {budgets}"
        )
    first = runs[0]
    try:
        reference = heldout_signature(first.config)
        train_ids = [t.prompt for t in training_tasks(first.config)]
    except (ValueError, OSError) as err:  # a task file missing or malformed
        raise ExperimentError(f"arm {first.arm!r}: {err}") from None
    for run in runs[1:]:
        try:
            signature = heldout_signature(run.config)
        except (ValueError, OSError) as err:
            raise ExperimentError(f"arm {run.arm!r}: {err}") from None
        if signature != reference:
            diff = sorted(k for k in reference if reference[k] != signature[k])
            raise ExperimentError(
                f"runs {first.name} and {run.name} differ in their held-out evaluation ({diff})"
            )
        if [t.prompt for t in training_tasks(run.config)] != train_ids:
            raise ExperimentError(f"runs {first.name} and {run.name} train on different problems")
