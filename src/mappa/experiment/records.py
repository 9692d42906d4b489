"""Each finished run's small record, in a directory that can be committed, so an experiment
can outlast the machine it started on: a rerun anywhere skips the runs recorded there.

A record is what the results are computed from, without adapters, checkpoints, episodes or
workspaces (tens to hundreds of kB a run)::

    <records>/<arm>-s<seed>/config.yaml    the run's resolved config
    <records>/<arm>-s<seed>/metrics.jsonl  its step lines (held-out evals, coach health, rl/)
    <records>/<arm>-s<seed>/heldout.jsonl  every held-out answer: step, task_id, correct
    <records>/<arm>-s<seed>/actions.jsonl  every training action: who, its coach score, its
                                           tool status, the oracle's verdict (``action_rows``)
    <records>/<arm>-s<seed>/record.json    wall time, the code and environment that trained
                                           it, the format
    <records>/base/eval.json               the base model's held-out evaluation

A record is written only after its run finished, so a record is never half a run. A record
made with another config than the run it stands for now is refused, not reused. A config
does not say everything: a default's meaning can change with the code, so a record keeps
the commit(s) of the code that trained the run and the environment(s) it ran on (Python,
the numeric libraries, the CPU), as the run noted them (``mappa.provenance``), and a rerun
says which records other code or another environment made.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mappa.experiment.spec import ExperimentError, RunSpec
from mappa.jsonl import append_jsonl, iter_jsonl, read_jsonl
from mappa.provenance import run_code, run_environments

FORMAT = 2
"""1: config, metrics, held-out answers; 2: and actions.jsonl (a format-1 record has none)."""
MACHINE_KEYS = ("run_dir", "coach.http.base_url")
"""Config keys that say where a run ran, not what it did (an experiment's coach server
listens on a free port): two configs that differ only here are the same run."""


@dataclass
class StoredRun:
    """A run's record, read back."""

    metrics: list[dict[str, Any]]
    wall_s: float | None
    answers: dict[str, float] | None


def final_answers(rows: Iterable[Mapping[str, Any]]) -> dict[str, float] | None:
    """Per problem of the last held-out evaluation (the rows of the highest ``step``), the
    share of its samples answered right; ``None`` without held-out rows.

    >>> final_answers([{"step": -1, "task_id": "a", "correct": True},
    ...                {"step": 5, "task_id": "a", "correct": False},
    ...                {"step": 5, "task_id": "a", "correct": True},
    ...                {"step": 5, "task_id": "b", "correct": None}])
    {'a': 0.5, 'b': 0.0}
    """
    by_step: dict[int, dict[str, list[bool]]] = {}
    for row in rows:
        task = by_step.setdefault(int(row["step"]), {}).setdefault(str(row["task_id"]), [])
        task.append(bool(row["correct"]))
    if not by_step:
        return None
    last = by_step[max(by_step)]
    return {task: sum(right) / len(right) for task, right in last.items()}


def heldout_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Every held-out answer of a run directory (step, task id, right or wrong), from its
    held-out episodes; none when it has no evaluation."""
    path = run_dir / "heldout_episodes.jsonl"
    if not path.is_file():
        return []
    return [
        {"step": ep["step"], "task_id": ep["task_id"], "correct": ep["correct"]}
        for ep in iter_jsonl(path)
    ]


def action_rows(run_dir: Path) -> list[dict[str, Any]]:
    """One row per training action of a run directory, from its episodes: where it was
    (step, episode, task, agent, turn), its coach score (``score``, ``flagged``; None for a
    run that asks no coach), how its code ran (``tool_status``, None: no code), the answer
    oracle's verdict on its result (``oracle``, None: no reference or not recorded) and the
    episode's graded outcome (``correct``). Enough to check credit assignment per episode
    after the run, without its episodes: does the coach score the actions the oracle finds
    right above the ones it finds wrong? Empty when the run wrote no episodes."""
    path = run_dir / "episodes.jsonl"
    if not path.is_file():
        return []
    rows = []
    for ep in iter_jsonl(path):
        for a in ep.get("actions", []):
            coach = a.get("coach") or {}
            rows.append(
                {
                    "step": ep["step"],
                    "episode_id": ep["episode_id"],
                    "task_id": ep["task_id"],
                    "agent": a["agent"],
                    "turn": a["turn"],
                    "score": coach.get("value"),
                    "flagged": coach.get("flagged"),
                    "tool_status": a.get("tool_status"),
                    "oracle": a.get("oracle"),
                    "correct": ep.get("correct"),
                }
            )
    return rows


def run_dir_answers(run_dir: Path) -> dict[str, float] | None:
    """``final_answers`` of a run directory's held-out episodes."""
    return final_answers(heldout_rows(run_dir))


class Records:
    """The records directory of one experiment."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def base_eval(self) -> Path:
        return self.root / "base" / "eval.json"

    def keep_base(self, eval_json: Path) -> None:
        """Record the base model's evaluation (``mappa eval``'s ``eval.json``)."""
        self.base_eval().parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(eval_json, self.base_eval())

    def has(self, run: RunSpec) -> bool:
        """Whether ``run`` is recorded; ``ExperimentError`` when its record was made with a
        different config (rerunning would silently mix two experiments). Compared as a
        resume compares (``mappa.run.checkpoint.config_changes``): a key added since the
        record was made takes its default."""
        from mappa.run.checkpoint import config_changes

        folder = self.root / run.name
        if not (folder / "record.json").is_file():
            return False
        recorded = yaml.safe_load((folder / "config.yaml").read_text())
        changes = config_changes(recorded, run.config, MACHINE_KEYS)
        diff = [f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items()]
        if diff:
            shown = "; ".join(diff[:5]) + (f"; and {len(diff) - 5} more" if len(diff) > 5 else "")
            raise ExperimentError(
                f"{run.name}: its record {folder} was made with another config ({shown}); "
                "delete that folder to run it again with this one, or restore the config"
            )
        return True

    def keep(self, run: RunSpec, wall_s: float | None) -> Path:
        """Record a finished run from its run dir (written to a temporary folder first and
        renamed, so a crash leaves no partial record)."""
        run_dir = run.config.run_dir
        folder = self.root / run.name
        tmp = self.root / f".{run.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "config.yaml").write_text(
            yaml.safe_dump(run.config.model_dump(mode="json"), sort_keys=False)
        )
        shutil.copyfile(run_dir / "metrics.jsonl", tmp / "metrics.jsonl")
        append_jsonl(tmp / "heldout.jsonl", heldout_rows(run_dir))
        append_jsonl(tmp / "actions.jsonl", action_rows(run_dir))
        (tmp / "record.json").write_text(
            json.dumps(
                {
                    "format": FORMAT,
                    "run": run.name,
                    "wall_s": wall_s,
                    "code": run_code(run_dir),
                    "environment": run_environments(run_dir),
                },
                indent=2,
            )
            + "\n"
        )
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        return folder

    def _info(self, run: RunSpec) -> dict[str, Any]:
        """``run``'s record.json."""
        return dict(json.loads((self.root / run.name / "record.json").read_text()))

    def code(self, run: RunSpec) -> str | None:
        """The code that trained ``run``, as its record says (``run_code``; ``None``:
        unknown, e.g. a record older than this field)."""
        return self._info(run).get("code")

    def environment(self, run: RunSpec) -> dict[str, str] | None:
        """The environment that trained ``run``'s last steps, as its record says (``None``:
        unknown, a record older than this field)."""
        envs = self._info(run).get("environment")
        return dict(envs[-1]) if envs else None

    def has_actions(self, run: RunSpec) -> bool:
        """Whether ``run``'s record keeps its training actions (format 2 on)."""
        return (self.root / run.name / "actions.jsonl").is_file()

    def actions(self, run: RunSpec) -> list[dict[str, Any]] | None:
        """``run``'s training actions (``action_rows``); None for a record older than them."""
        return read_jsonl(self.root / run.name / "actions.jsonl") if self.has_actions(run) else None

    def read(self, run: RunSpec) -> StoredRun:
        folder = self.root / run.name
        info = self._info(run)
        answers = final_answers(read_jsonl(folder / "heldout.jsonl"))
        return StoredRun(read_jsonl(folder / "metrics.jsonl"), info.get("wall_s"), answers)
