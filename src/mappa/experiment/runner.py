"""``mappa experiment CONFIG``: every arm x seed as an ordinary run, one after another, each
in a child process, then the results table, the plot and the overlay report.

A child process per run returns its memory to the system between runs and keeps one run's
crash from taking the others with it unseen: a failing run stops the experiment, naming its
log. Rerunning the same command resumes: finished runs (their final checkpoint present) are
skipped, an interrupted one continues with ``mappa train --resume``, the base model's
evaluation is kept. Each finished run's small record goes to ``<records>``
(``mappa.experiment.records``; default ``<out>/records``): a directory to commit, so a
rerun on another machine skips what it holds. Layout of ``<out>``::

    configs/<arm>-s<seed>.yaml   each run's resolved config (`mappa train --config` reruns it)
    runs/<arm>-s<seed>/          each run's dir (metrics.jsonl, episodes, checkpoints, ...)
    base/eval.json               the base model on the held-out set: step 0 of every arm
    logs/<name>.log              each child process's output
    timings.jsonl                wall time of every child process
    results.json, results.md, heldout_accuracy.png, report/index.html
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from mappa.experiment.look import LOOK_FILE, read_look
from mappa.experiment.records import Records, action_rows, run_dir_answers
from mappa.experiment.reproduce import Comparison
from mappa.experiment.results import RunRecord, summarize
from mappa.experiment.spec import ExperimentError, RunSpec, load_experiment, plan_runs
from mappa.jsonl import append_jsonl, read_jsonl
from mappa.provenance import environment, environment_changes, source_revision

if TYPE_CHECKING:
    from mappa.coach.servers import LocalServer

log = logging.getLogger(__name__)

POLL_S = 2.0
"""How often the parent looks at a running child's metrics.jsonl for progress."""


def default_out(experiment_file: Path) -> Path:
    return Path("runs") / "experiments" / experiment_file.stem


def _clock(seconds: float) -> str:
    """``1h02m03s``-style wall time.

    >>> _clock(3723.4), _clock(59)
    ('1h02m03s', '0m59s')
    """
    minutes, s = divmod(int(seconds), 60)
    h, m = divmod(minutes, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def record_changes(
    code: str | None,
    now: str | None,
    env: dict[str, str] | None = None,
    env_now: dict[str, str] | None = None,
) -> list[str]:
    """What differs between the code and environment that made a record (``env``: ``None``
    when the record noted none) and those running now, one ``"X -> Y"`` each; the words
    both "recorded already" and ``--reproduce`` use.

    >>> record_changes("a", "b", {"torch": "2.13.0"}, {"torch": "2.14.1"})
    ['code a -> b', 'torch 2.13.0 -> 2.14.1']
    """
    changes = environment_changes(env, env_now or {}) if env is not None else []
    if code != now:
        changes.insert(0, f"code {code or 'not recorded'} -> {now or 'not a git checkout'}")
    return changes


def made_by(
    code: str | None,
    now: str | None,
    env: dict[str, str] | None = None,
    env_now: dict[str, str] | None = None,
) -> str:
    """What to add to "recorded already" when a record was made by other code than this, or
    on another environment (``record_changes``).

    >>> made_by("a", "a", {"torch": "2.13.0"}, {"torch": "2.14.1"})  # doctest: +ELLIPSIS
    '; recorded on another code or environment: torch 2.13.0 -> 2.14.1 (mappa ...)'
    """
    changes = record_changes(code, now, env, env_now)
    if not changes:
        return ""
    return (
        f"; recorded on another code or environment: {'; '.join(changes)} "
        "(mappa experiment --reproduce tells if it matters)"
    )


def run_state(run: RunSpec) -> str:
    """``done`` (its final checkpoint is there), ``resume`` (an earlier one is), or ``new``."""
    from mappa.run.checkpoint import checkpoint_step, latest_checkpoint

    ckpt = latest_checkpoint(run.config.run_dir)
    if ckpt is None:
        return "new"
    return "done" if checkpoint_step(ckpt) >= run.config.train.steps else "resume"


def _check_runnable(runs: Sequence[RunSpec]) -> None:
    """What ``mappa train`` would refuse, found before the first run starts: per arm the
    model-free checks (``preflight.check``), per started run that its config still resumes
    (``runs``: those not recorded already)."""
    from mappa.run import preflight
    from mappa.run.checkpoint import check_resumable

    for arm in dict.fromkeys(r.arm for r in runs):
        run = next(r for r in runs if r.arm == arm)
        try:
            preflight.check(run.config)
        except ValueError as err:
            raise ExperimentError(f"arm {arm!r}: {err}") from None
    for run in runs:
        if run_state(run) == "resume":
            try:
                check_resumable(run.config.run_dir, run.config)
            except ValueError as err:
                raise ExperimentError(f"{run.name} cannot resume: {err}") from None


class Experiment:
    """One invocation of an experiment: its runs, where they go, its coach server."""

    def __init__(
        self,
        experiment_file: Path,
        out: Path | None = None,
        overrides: list[str] | None = None,
        records: Path | None = None,
    ) -> None:
        from mappa.report.charts import require_matplotlib

        self.file = experiment_file
        self.spec = load_experiment(experiment_file, overrides)  # a wrong path named first
        require_matplotlib()  # the plot and report come last: fail before any run, not after
        self.out = out or default_out(experiment_file)
        self.server = self._server()
        url = None if self.server is None else self.server.base_url
        self.runs = plan_runs(self.spec, experiment_file, self.out, url)
        self.records = Records(records or self.out / "records")
        self.recorded = {r.name for r in self.runs if self.records.has(r)}
        _check_runnable([r for r in self.runs if r.name not in self.recorded])
        look = read_look(self.records.root)
        if look is not None and look.decided > len(self.spec.seeds):
            log.warning(
                "%s: the look in %s asks for %d seeds; the file runs %d",
                self.file,
                self.records.root / LOOK_FILE,
                look.decided,
                len(self.spec.seeds),
            )
        if len(self.spec.seeds) == 1:  # after every check: a refused experiment says only why
            log.warning(
                "%s: one seed per arm: no spread, so no difference can be called", self.file
            )

    @cached_property
    def here(self) -> tuple[str | None, dict[str, str]]:
        """The code and environment running now (``mappa.provenance``), which every
        record is held against: computed once (``source_revision`` runs git)."""
        return source_revision(), environment()

    def reproduce_dir(self, name: str) -> Path:
        """Where ``reproduce`` reruns run ``name``'s first step."""
        return self.out / "reproduce" / name

    def _start_server_for(self, run: RunSpec) -> None:
        """Start the experiment's coach server if ``run`` asks a model coach and it never
        started."""
        if run.config.asks_model_coach and self.server is not None and self.server.proc is None:
            print(f"coach server ({self.server.name}): starting; log {self.server.log}", flush=True)
            self.server.start()

    def _server(self) -> LocalServer | None:
        s = self.spec.coach_server
        if s is None:
            return None
        try:
            return s.build()
        except (ValueError, OSError) as err:
            raise ExperimentError(f"{self.file}: coach_server: {err}") from None

    def config_path(self, run: RunSpec) -> Path:
        return self.out / "configs" / f"{run.name}.yaml"

    def write_configs(self) -> None:
        for run in self.runs:
            path = self.config_path(run)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(run.config.model_dump(mode="json"), sort_keys=False))

    def run(self) -> Path:
        """Everything, from nothing (or from where the last invocation stopped) to the
        results; returns ``results.md``. Raises ``ExperimentError`` for a failed run."""
        start = time.monotonic()
        self.write_configs()
        try:
            self.evaluate_base()
            for i, run in enumerate(self.runs, 1):
                self.train(run, f"[{i}/{len(self.runs)}] {run.name}")
                if self.server is not None and not any(
                    r.config.asks_model_coach for r in self.runs[i:]
                ):
                    self.server.stop()  # no later run asks it: its memory is theirs
        finally:
            if self.server is not None:
                self.server.stop()
        page = self.write_results()
        print(f"experiment done in {_clock(time.monotonic() - start)}: {page}", flush=True)
        return page

    def evaluate_base(self) -> None:
        """The base model on the held-out set, greedy or sampled exactly as the runs' eval."""
        recorded, base = self.records.base_eval(), self.out / "base"
        if recorded.is_file():
            print(f"base model: recorded already ({recorded})", flush=True)
            return
        if not (base / "eval.json").is_file():
            print("base model: held-out evaluation", flush=True)
            args = ["eval", "--config", str(self.config_path(self.runs[0])), "--out", str(base)]
            self._child("base", "eval", args, "base model")
        self.records.keep_base(base / "eval.json")

    def train(self, run: RunSpec, label: str) -> None:
        """Train one run (or resume it, or skip it when finished or recorded), then record it."""
        if run.name in self.recorded:
            code, env = self.here
            other = made_by(self.records.code(run), code, self.records.environment(run), env)
            print(f"{label}: recorded already ({self.records.root / run.name}{other})", flush=True)
            return
        state = run_state(run)
        if state == "done":
            print(f"{label}: finished already", flush=True)
            self.records.keep(run, self._wall(run.name))
            return
        run_dir = run.config.run_dir
        if state == "new" and run_dir.exists():  # started, but no step was checkpointed
            log.warning("%s: no checkpoint in %s; starting it over", run.name, run_dir)
            shutil.rmtree(run_dir)
        self._start_server_for(run)
        args = ["train", "--config", str(self.config_path(run))]
        if state == "resume":
            args += ["--resume", str(run_dir)]
        action = "resume" if state == "resume" else "train"
        self._child(
            run.name, action, args, label, (run_dir / "metrics.jsonl", run.config.train.steps)
        )
        self.records.keep(run, self._wall(run.name))

    def recorded_run(self, name: str) -> RunSpec:
        """The run ``name``, which must be recorded with its actions (what ``reproduce``
        compares)."""
        run = next((r for r in self.runs if r.name == name), None)
        if run is None:
            arms = ", ".join(dict.fromkeys(r.arm for r in self.runs))
            seeds = ", ".join(str(s) for s in self.spec.seeds)
            raise ExperimentError(
                f"--reproduce {name}: no such run in {self.file}; a run is <arm>-s<seed>, its "
                f"arms {arms}, its seeds {seeds}"
            )
        if name not in self.recorded:
            raise ExperimentError(
                f"--reproduce {name}: not recorded yet in {self.records.root}; only a "
                "recorded run can be compared"
            )
        if not self.records.has_actions(run):
            raise ExperimentError(
                f"--reproduce {name}: its record {self.records.root / name} is older than "
                "the training actions a rerun is compared with (record format 1)"
            )
        return run

    def reproduce(self, run: RunSpec) -> tuple[Comparison, list[str]]:
        """Rerun recorded ``run``'s first step on this machine (``mappa train --stop-after
        1`` on its own config, in ``<out>/reproduce/<name>``) and compare it with its record
        (``mappa.experiment.reproduce``). Returns the comparison and what differs between
        the record's code and environment and this one's. The rerun's dir is removed when
        it matches, kept for a look when it does not."""
        from mappa.experiment.reproduce import compare_step

        name = run.name
        recorded = self.records.actions(run) or []
        run_dir = self.reproduce_dir(name)
        shutil.rmtree(run_dir, ignore_errors=True)
        path = self.out / "configs" / f"{name}.reproduce.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        config = run.config.model_copy(deep=True)
        config.run_dir = run_dir  # a machine key only
        config.coach.cache.mode = "off"  # scored afresh: a cached score tests nothing here
        path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        self._start_server_for(run)
        try:
            args = ["train", "--config", str(path), "--stop-after", "1"]
            label = f"{name} (its first step again)"
            progress = (run_dir / "metrics.jsonl", 1)
            self._child(f"{name}.reproduce", "reproduce", args, label, progress)
        finally:
            if self.server is not None:
                self.server.stop()
        first = self.records.read(run).metrics[0]
        step = int(first["step"])
        comparison = compare_step(
            step,
            [r for r in recorded if r["step"] == step],
            [r for r in action_rows(run_dir) if r["step"] == step],
            first,
            read_jsonl(run_dir / "metrics.jsonl")[0],
        )
        env, (now, env_now) = self.records.environment(run), self.here
        changes = record_changes(self.records.code(run), now, env, env_now)
        if env is None:
            changes.append("environment not recorded (a record older than that field)")
        if comparison.reproduced:
            shutil.rmtree(run_dir)
        return comparison, changes

    def _child(
        self,
        name: str,
        action: str,
        args: list[str],
        label: str,
        progress: tuple[Path, int] | None = None,
    ) -> None:
        """Run ``mappa <args>`` in a child process, showing its progress; record its wall
        time; raise ``ExperimentError`` with its log when it fails. ``progress``: the run's
        metrics.jsonl and its step count, to show each step as it ends."""
        logfile = self.out / "logs" / f"{name}.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with logfile.open("a") as fh:
            fh.write(f"\n$ mappa {' '.join(args)}\n")
            fh.flush()
            proc = subprocess.Popen(
                [sys.executable, "-m", "mappa.cli", *args], stdout=fh, stderr=subprocess.STDOUT
            )
            try:
                self._watch(proc, label, start, progress)
            except BaseException:  # Ctrl-C: the child is in our process group; make sure
                proc.terminate()
                proc.wait()
                raise
        wall = time.monotonic() - start
        append_jsonl(
            self.out / "timings.jsonl",
            [{"run": name, "action": action, "wall_s": wall, "rc": proc.returncode}],
        )
        if proc.returncode != 0:
            tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-15:])
            raise ExperimentError(
                f"{label} failed (exit {proc.returncode}) after {_clock(wall)}; log: {logfile}\n"
                f"{tail}"
            )
        print(f"{label}: done in {_clock(wall)}", flush=True)

    @staticmethod
    def _watch(
        proc: subprocess.Popen[bytes],
        label: str,
        start: float,
        progress: tuple[Path, int] | None,
    ) -> None:
        """Wait for ``proc``, printing a line for each step the run finishes."""
        seen, done = 0, False
        while not done:
            try:
                proc.wait(timeout=POLL_S)
                done = True
            except subprocess.TimeoutExpired:
                pass
            if progress is None or not progress[0].is_file():
                continue
            lines = read_jsonl(progress[0])
            for line in lines[seen:]:  # every step, even when several end between two looks
                seen += 1
                acc, heldout = line.get("accuracy"), line.get("eval/accuracy")
                shown = "" if heldout is None else f" held-out {heldout:.3f}"
                print(
                    f"{label}: step {seen}/{progress[1]} accuracy "
                    f"{'-' if acc is None else f'{acc:.3f}'}{shown} "
                    f"({_clock(time.monotonic() - start)})",
                    flush=True,
                )

    def _wall(self, name: str) -> float | None:
        """A run's wall time here, summed over its child processes."""
        path = self.out / "timings.jsonl"
        walls = (
            [t["wall_s"] for t in read_jsonl(path) if t["run"] == name] if path.is_file() else []
        )
        return sum(walls) if walls else None

    def run_records(self) -> list[RunRecord]:
        """Each run's metrics lines, wall time and final held-out answers: from its record
        when it was recorded before this invocation, else from its run dir (an unfinished
        run's steps so far)."""
        out = []
        for run in self.runs:
            if run.name in self.recorded:
                stored = self.records.read(run)
                metrics, wall, answers = stored.metrics, stored.wall_s, stored.answers
            else:
                path = run.config.run_dir / "metrics.jsonl"
                metrics = read_jsonl(path) if path.is_file() else []
                wall, answers = self._wall(run.name), run_dir_answers(run.config.run_dir)
            agents = [a.name for a in run.config.agents]
            actions = (
                self.records.actions(run)
                if run.name in self.recorded
                else action_rows(run.config.run_dir)
            )
            out.append(RunRecord(run.arm, run.seed, metrics, wall, agents, answers, actions))
        return out

    def write_results(self) -> Path:
        """``results.json``, ``results.md``, the plot and the overlay report."""
        from mappa.experiment.markdown import results_markdown
        from mappa.experiment.plot import plot_heldout
        from mappa.report.html import write_report

        base_file = self.records.base_eval()
        base = json.loads(base_file.read_text()) if base_file.is_file() else None
        plan = self.spec.analysis
        results = summarize(self.run_records(), base, plan.primary, plan.secondary)
        look = read_look(self.records.root)
        results["look"] = None if look is None else asdict(look)
        title = f"Experiment {self.file.stem}"
        (self.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        page = self.out / "results.md"
        page.write_text(results_markdown(results, title) + "\n")
        plot_heldout(results, self.out / "heldout_accuracy.png", title)
        here = [
            r.config.run_dir for r in self.runs if (r.config.run_dir / "metrics.jsonl").is_file()
        ]
        if here:  # runs recorded elsewhere have no run dir on this machine
            write_report(here, self.out / "report")
        return page
