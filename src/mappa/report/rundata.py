"""A run directory read back for the report: its agents, its step metrics and its episodes
in the compact form the episode viewer shows.

Built to be read while the run is still writing: a torn last line of either JSONL file is
skipped (``mappa.jsonl.iter_jsonl``), and episodes whose step has no metrics line
yet are shown all the same. ``episodes.jsonl`` is streamed line by line and each action's
token ids and log-probs are dropped as it is read: they are most of the file and the report
shows text, so a long run's episodes fit in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mappa.jsonl import iter_jsonl, read_jsonl

EpisodeView = dict[str, Any]
"""One episode as the viewer reads it (keys documented in ``compact_episode``)."""


@dataclass
class ScoreRecord:
    """One coach score with what the coach statistics group it by."""

    step: int
    agent: str
    task_type: str
    value: float
    flagged: bool
    flag_reason: str
    cached: bool
    final: bool  # the final agent's last action of its episode
    correct: bool | None  # the episode's graded outcome
    answer_correct: bool | None  # the coach's own verdict (ANSWER_CORRECT), if it gave one


@dataclass
class RunData:
    """Everything the report needs from one run directory."""

    path: Path
    label: str
    agents: list[str]
    metrics: list[dict[str, Any]]
    steps: dict[int, list[EpisodeView]] = field(default_factory=dict)
    heldout: dict[int, list[EpisodeView]] = field(default_factory=dict)  # eval.every episodes
    scores: list[ScoreRecord] = field(default_factory=list)  # training episodes' only
    warn_no_signal_steps: int = 3  # the run's ``coach.warn_no_signal_steps`` (0: never)

    @property
    def final_agent(self) -> str | None:
        return self.agents[-1] if self.agents else None


def _config(run_dir: Path) -> dict[str, Any]:
    """The run's ``config.yaml`` (empty when there is none)."""
    config = run_dir / "config.yaml"
    if not config.is_file():
        return {}
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _agent_names(config: dict[str, Any], metrics: list[dict[str, Any]]) -> list[str]:
    """The pipeline's agents in order: from ``config.yaml``, else from the metric keys."""
    names = [a["name"] for a in config.get("agents") or [] if isinstance(a, dict)]
    if names:
        return names
    seen: dict[str, None] = {}
    for row in metrics:
        for key in row:
            if key.startswith("actions/"):
                seen.setdefault(key.removeprefix("actions/"), None)
    return list(seen)


def compact_episode(raw: dict[str, Any]) -> EpisodeView:
    """The fields the viewer shows, under short keys (the step files stay small):

    ``id task_id task answer type final correct metrics ref missing`` for the episode and,
    per action in ``acts``: ``agent turn prompt out tool status files trunc ntok`` and the
    coach's ``score`` (``v`` value, ``why`` rationale, ``flag`` flagged, ``reason``, ``ac``
    its ANSWER_CORRECT verdict, ``cached``), or ``None`` when it was not scored.
    """
    acts = []
    for a in raw.get("actions") or []:
        coach = a.get("coach")
        acts.append(
            {
                "agent": a.get("agent"),
                "turn": a.get("turn"),
                "prompt": a.get("prompt_text") or "",
                "out": a.get("completion_text") or "",
                "tool": a.get("tool_observation"),
                "status": a.get("tool_status"),
                "files": a.get("workspace_files"),
                "trunc": bool(a.get("truncated")),
                "ntok": len(a.get("completion_ids") or []),
                "score": None
                if not coach
                else {
                    "v": coach.get("value"),
                    "why": coach.get("rationale") or "",
                    "flag": bool(coach.get("flagged")),
                    "reason": coach.get("flag_reason") or "",
                    "ac": coach.get("answer_correct"),
                    "cached": bool(coach.get("cached")),
                },
            }
        )
    return {
        "id": raw.get("episode_id"),
        "task_id": raw.get("task_id"),
        "task": raw.get("task") or "",
        "answer": raw.get("answer"),
        "type": raw.get("task_type") or "default",
        "final": raw.get("final_answer"),
        "correct": raw.get("correct"),
        "metrics": raw.get("metrics") or {},
        "ref": raw.get("coach_reference"),
        "missing": {k: v for k, v in (raw.get("missing_artifacts") or {}).items() if v},
        "acts": acts,
    }


def _score_records(ep: EpisodeView, step: int, final_agent: str | None) -> list[ScoreRecord]:
    last_final = max(
        (i for i, a in enumerate(ep["acts"]) if a["agent"] == final_agent), default=None
    )
    out = []
    for i, a in enumerate(ep["acts"]):
        s = a["score"]
        if s is None or s["v"] is None:
            continue
        out.append(
            ScoreRecord(
                step=step,
                agent=a["agent"],
                task_type=ep["type"],
                value=float(s["v"]),
                flagged=s["flag"],
                flag_reason=s["reason"],
                cached=s["cached"],
                final=i == last_final,
                correct=ep["correct"],
                answer_correct=s["ac"],
            )
        )
    return out


def check_run_dir(run_dir: Path) -> None:
    """Raise ``FileNotFoundError`` naming ``run_dir`` unless it is a run directory (it holds
    metrics.jsonl or episodes.jsonl): cheap, so a report checks every path first."""
    fix = "give a run directory `mappa train` wrote (its run_dir)"
    if run_dir.is_file():
        raise FileNotFoundError(f"{run_dir}: is a file; {fix}")
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory; {fix}")
    if not (run_dir / "metrics.jsonl").exists() and not (run_dir / "episodes.jsonl").exists():
        raise FileNotFoundError(
            f"{run_dir}: not a run (no metrics.jsonl or episodes.jsonl); {fix}, after its "
            "first step"
        )


def load_run(run_dir: Path, label: str | None = None) -> RunData:
    """Read one run directory (finished or still running)."""
    check_run_dir(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    episodes_path = run_dir / "episodes.jsonl"
    metrics = read_jsonl(metrics_path) if metrics_path.exists() else []
    config = _config(run_dir)
    run = RunData(run_dir, label or run_dir.name, _agent_names(config, metrics), metrics)
    coach = config.get("coach")
    if isinstance(coach, dict) and isinstance(coach.get("warn_no_signal_steps"), int):
        run.warn_no_signal_steps = coach["warn_no_signal_steps"]
    for raw in iter_jsonl(episodes_path) if episodes_path.exists() else ():
        step = int(raw.get("step") or 0)
        ep = compact_episode(raw)
        run.steps.setdefault(step, []).append(ep)
        run.scores.extend(_score_records(ep, step, run.final_agent))
    heldout_path = run_dir / "heldout_episodes.jsonl"
    for raw in iter_jsonl(heldout_path) if heldout_path.exists() else ():
        run.heldout.setdefault(int(raw.get("step") or 0), []).append(compact_episode(raw))
    if not run.agents:  # neither config nor metrics: the order the episodes show
        run.agents = list(
            dict.fromkeys(a["agent"] for eps in run.steps.values() for e in eps for a in e["acts"])
        )
    return run


def run_labels(run_dirs: list[Path]) -> list[str]:
    """Short distinct names for the runs of one report: the directory names, with their
    parent's name in front where two would otherwise read the same."""
    names = [p.resolve().name for p in run_dirs]
    return [
        f"{p.resolve().parent.name}/{n}" if names.count(n) > 1 else n
        for p, n in zip(run_dirs, names, strict=True)
    ]
