"""Where a run's step metrics go as it trains: TensorBoard (``train.tensorboard``) and the
experiment trackers of ``train.report_to`` (wandb, MLflow, trackio).

Each tracker is its own library's client, configured by that library's environment
(``WANDB_MODE=offline``, ``MLFLOW_TRACKING_URI``, ``TRACKIO_DIR``), so a user's setup for
TRL or verl works here unchanged. Every step sends the numeric metrics of ``metrics.jsonl``
(under TensorBoard's tags) and, where the tracker has tables, the actions of the step's
first ``train.sample_episodes`` episodes: input, output, tool output, coach score and
rationale. The trackers' run ids are kept in ``<run_dir>/trackers.json``, so ``mappa train
--resume`` goes on in the same tracker runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from mappa.config import RunConfig
from mappa.records import Episode
from mappa.run.tensorboard import ScalarLog, scalars
from mappa.text import first_line

SAMPLE_COLUMNS = [
    "step",
    "episode",
    "agent",
    "turn",
    "input",
    "output",
    "tool_output",
    "coach_score",
    "coach_rationale",
    "correct",
]
"""The sample table's columns: one row per action."""

INPUT_CHARS = 4000
"""How much of an action's input a table cell keeps (its end: the part the agent answers)."""

HINTS = {
    "wandb": "log in with `wandb login`, or set WANDB_MODE=offline",
    "mlflow": "set MLFLOW_TRACKING_URI to a tracking server (or a store your MLflow install "
    "supports: the full `mlflow` package has the local sqlite one)",
    "trackio": "set TRACKIO_DIR to a writable folder",
}


class TrackerError(ValueError):
    """A tracker of ``train.report_to`` could not start: one line naming it and the fix."""


def sample_rows(episodes: Sequence[Episode], n: int) -> list[list[Any]]:
    """The sample table of a step: a row (``SAMPLE_COLUMNS``) per action of the first ``n``
    episodes, in the order they acted.

    >>> from mappa.records import Action, Score
    >>> act = Action("e0", "solver", 0, [1], [2], [-0.1], "Problem: 2+2", "4", False,
    ...              coach=Score(9.0, rationale="right"))
    >>> sample_rows([Episode("e0", "t0", "2+2", "4", step=3, actions=[act], correct=True)], 1)
    [[3, 'e0', 'solver', 0, 'Problem: 2+2', '4', '', 9.0, 'right', True]]
    """
    return [
        [
            ep.step,
            ep.episode_id,
            a.agent,
            a.turn,
            a.prompt_text[-INPUT_CHARS:],
            a.completion_text,
            a.tool_observation or "",
            None if a.coach is None else a.coach.value,
            "" if a.coach is None else a.coach.rationale,
            ep.correct,
        ]
        for ep in episodes[:n]
        for a in ep.actions
    ]


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow parameters: dotted keys, values as text (MLflow keeps
    parameters flat and as strings).

    >>> flat_params({"rl": {"lr": 1e-4, "kl": None}, "agents": [{"name": "a"}]})
    {'rl.lr': '0.0001', 'rl.kl': 'None', 'agents': '[{"name": "a"}]'}
    """
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flat_params(value, f"{prefix}{key}."))
        else:
            text = json.dumps(value) if isinstance(value, list) else str(value)
            out[f"{prefix}{key}"] = text
    return out


class Tracker(Protocol):
    """One destination of a run's step metrics."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_samples(self, rows: list[list[Any]], step: int) -> None: ...

    def close(self) -> None: ...


class _TensorBoard:
    def __init__(self, run_dir: Path, resume_step: int) -> None:
        self.log_ = ScalarLog(run_dir / "tb", resume_step=resume_step)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.log_.write(metrics, step)

    def log_samples(self, rows: list[list[Any]], step: int) -> None:
        """TensorBoard has no tables; ``mappa report`` shows the episodes."""

    def close(self) -> None:
        self.log_.close()


class _Wandb:
    def __init__(self, cfg: RunConfig, run_dir: Path, run_id: str | None) -> None:
        import wandb

        from mappa.hub import unreachable

        settings = wandb.setup().settings  # with WANDB_MODE, WANDB_BASE_URL and the rest
        if settings.mode not in ("offline", "disabled", "dryrun"):
            # wandb would wait out its init timeout (90 s) before it says so
            problem = unreachable(settings.base_url)
            if problem:
                raise ConnectionError(f"the server cannot be reached ({problem})")
        self.wandb = wandb
        self.run = wandb.init(
            project=cfg.train.tracker_project,
            name=run_dir.name,
            id=run_id,
            resume="allow" if run_id else None,
            config=cfg.model_dump(mode="json"),
            dir=str(run_dir),
        )
        self.id = self.run.id

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_samples(self, rows: list[list[Any]], step: int) -> None:
        self.run.log({"samples": self.wandb.Table(columns=SAMPLE_COLUMNS, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class _Mlflow:
    def __init__(self, cfg: RunConfig, run_dir: Path, run_id: str | None) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.set_experiment(cfg.train.tracker_project)
        self.run = mlflow.start_run(run_id=run_id, run_name=None if run_id else run_dir.name)
        if run_id is None:
            mlflow.log_params(flat_params(cfg.model_dump(mode="json")))
        self.id = self.run.info.run_id

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.mlflow.log_metrics(dict(metrics), step=step)

    def log_samples(self, rows: list[list[Any]], step: int) -> None:
        columns = {c: [r[i] for r in rows] for i, c in enumerate(SAMPLE_COLUMNS)}
        self.mlflow.log_table(columns, artifact_file=f"samples/step_{step:04d}.json")

    def close(self) -> None:
        self.mlflow.end_run()


class _Trackio:
    def __init__(self, cfg: RunConfig, run_dir: Path, run_id: str | None) -> None:
        import trackio

        self.trackio = trackio
        self.run = trackio.init(
            project=cfg.train.tracker_project,
            name=run_id or run_dir.name,
            config=cfg.model_dump(mode="json"),
            resume="allow" if run_id else "never",
            auto_log_cpu=False,
            auto_log_gpu=False,
        )
        self.id = run_id or run_dir.name

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.trackio.log(dict(metrics), step=step)

    def log_samples(self, rows: list[list[Any]], step: int) -> None:
        self.trackio.log({"samples": self.trackio.Table(columns=SAMPLE_COLUMNS, data=rows)}, step)

    def close(self) -> None:
        self.trackio.finish()


_KINDS: dict[str, type[_Wandb | _Mlflow | _Trackio]] = {
    "wandb": _Wandb,
    "mlflow": _Mlflow,
    "trackio": _Trackio,
}


class Trackers:
    """Every destination of a run's step metrics, opened before its models load.

    Args:
        cfg: the run's config (``train.tensorboard``, ``train.report_to``, ...).
        run_dir: the run directory; its ``trackers.json`` keeps the tracker runs' ids.
        resume_step: the step a resumed run goes on from (0: a fresh run); TensorBoard
            drops its events from there on.
    """

    def __init__(self, cfg: RunConfig, run_dir: Path, resume_step: int = 0) -> None:
        self.sample_episodes = cfg.train.sample_episodes
        self.open: list[Tracker] = []
        ids_file = run_dir / "trackers.json"
        ids = json.loads(ids_file.read_text()) if resume_step and ids_file.exists() else {}
        try:
            if cfg.train.tensorboard:
                self.open.append(_TensorBoard(run_dir, resume_step))
            for name in cfg.train.report_to:
                try:
                    tracker = _KINDS[name](cfg, run_dir, ids.get(name))
                except Exception as err:  # any library's own failure: one line, its fix
                    raise TrackerError(
                        f"train.report_to: {name} could not start ({type(err).__name__}: "
                        f"{first_line(err)}); {HINTS[name]}"
                    ) from None
                self.open.append(tracker)
                ids[name] = tracker.id
        except BaseException:
            self.close()
            raise
        if cfg.train.report_to:
            ids_file.write_text(json.dumps(ids, indent=1) + "\n")

    def write(self, metrics: Mapping[str, Any], episodes: Sequence[Episode]) -> None:
        """One step's metrics (a ``metrics.jsonl`` line) and its sample table."""
        step = int(metrics["step"])
        values = scalars(metrics)
        rows = sample_rows(episodes, self.sample_episodes)
        for tracker in self.open:
            tracker.log(values, step)
            if rows:
                tracker.log_samples(rows, step)

    def close(self) -> None:
        for tracker in self.open:
            tracker.close()
        self.open = []
