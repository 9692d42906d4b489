"""``mappa report``: one static HTML page for one or more runs (curves, coach statistics,
episode viewer) that opens from disk with no server and no network.

Layout of the output directory::

    <out>/index.html            the page: CSS, JS and every chart inlined (charts are SVG)
    <out>/steps/rR-sNNNNN.js    episode set R's episodes of step N (R: the runs' training
                                episodes, then their held-out ones), loaded when shown

The episodes are kept out of the page so it opens fast however long the run: the viewer
injects ``<script src>`` for the step it shows (``fetch`` is refused on ``file://`` pages).
Everything a run wrote reaches the page as text: server-side through ``html.escape``, in
the browser through ``textContent`` (``static/report.js``); JSON embedded in a script has
``<`` written as ``\\u003c``, so no agent output can close the script element.

The report can be regenerated at any time during a run: it reads what is on disk, skipping
a line still being written.
"""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from mappa.report.charts import (
    LINESTYLES,
    Series,
    histogram_chart,
    line_chart,
    require_matplotlib,
)
from mappa.report.coachstats import (
    GOOD_SCORE,
    AgentHealthSummary,
    CoachSummary,
    coach_summary,
    spread,
)
from mappa.report.rundata import RunData, check_run_dir, load_run, run_labels


@dataclass(frozen=True)
class Curve:
    """One chart of the curves view: a per-agent key (``{agent}`` in it) or run-level keys,
    each with the label its line gets."""

    title: str
    ylabel: str
    keys: tuple[tuple[str, str], ...]  # (metric key, line label)
    start: str | None = None
    """A key whose value in a run's first line is its state before any step (the untrained
    team's held-out evaluation, ``eval.at_start``): drawn at 0 steps done, and the curve's
    own points at the steps done when they were taken (a line's step + 1)."""

    @property
    def per_agent(self) -> bool:
        return "{agent}" in self.keys[0][0]


def _curve(
    title: str, ylabel: str, *keys: str | tuple[str, str], start: str | None = None
) -> Curve:
    return Curve(title, ylabel, tuple((k, k) if isinstance(k, str) else k for k in keys), start)


CURVES: tuple[tuple[str, tuple[Curve, ...]], ...] = (
    (
        "Outcome and coach",
        (
            _curve("coach score per agent", "mean score (0-10)", "coach/{agent}"),
            _curve(
                "coach score spread per agent", "max - min (points)", "coach_health/{agent}/spread"
            ),
            _curve(
                "coach probability on a score per agent",
                "mean digit mass",
                "coach_health/{agent}/digit_mass",
            ),
            _curve("outcome accuracy (training rollouts)", "accuracy", "accuracy"),
            _curve("held-out accuracy", "accuracy", "eval/accuracy", start="eval_start/accuracy"),
            _curve("answer format per agent", "share of episodes", "format_rate/{agent}"),
        ),
    ),
    (
        "Update",
        (
            _curve("KL to the reference per agent", "mean KL", "rl/{agent}/mean_kl"),
            _curve("clip fraction per agent", "share of tokens", "rl/{agent}/clip_frac"),
            _curve("entropy per agent", "nats / token", "rl/{agent}/entropy"),
            _curve("trained actions per agent", "actions", "rl/{agent}/actions"),
            _curve("policy loss per agent", "loss", "rl/{agent}/loss"),
            _curve("gradient norm per agent", "norm (before clipping)", "rl/{agent}/grad_norm"),
        ),
    ),
    (
        "Behaviour",
        (
            _curve("response length per agent", "tokens / action", "response_tokens/{agent}"),
            _curve("tool-call rate per agent", "share of episodes", "tool_call_rate/{agent}"),
            _curve(
                "execution-error rate per agent", "share of code runs", "exec_error_rate/{agent}"
            ),
            _curve("truncation per agent", "share of actions", "truncation_rate/{agent}"),
        ),
    ),
    (
        "Time and cost",
        (
            _curve(
                "phase times",
                "seconds per step",
                ("rollout_s", "rollout"),
                ("coach_s", "coach"),
                ("update_s", "update"),
            ),
            _curve("rollout speed", "generated tokens / s", "rollout_tokens_per_s"),
            _curve("coach cost", "USD per step", "coach/cost_usd"),
        ),
    ),
)
"""The curves view, section by section; a chart no run has data for is left out."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def _points(run: RunData, key: str, start: str | None = None) -> tuple[list[float], list[float]]:
    """The run's values of ``key`` by step; with ``start``, by steps done, its value before
    any step first (``Curve.start``)."""
    xs, ys = [], []
    first = _number(run.metrics[0].get(start)) if start and run.metrics else None
    if first is not None:
        xs.append(0.0)
        ys.append(first)
    for row in run.metrics:
        y = _number(row.get(key))
        if y is not None and "step" in row:
            xs.append(float(row["step"]) + (1.0 if start else 0.0))
            ys.append(y)
    return xs, ys


def curve_series(curve: Curve, runs: Sequence[RunData], agents: Sequence[str]) -> list[Series]:
    """The lines of one chart. Per-agent charts colour by agent; run-level charts with
    several keys colour by key; the line style tells runs apart (so arms of an experiment
    overlay), and labels name the run only when there are several."""
    many = len(runs) > 1
    out = []
    for ri, run in enumerate(runs):
        prefix = f"{run.label} · " if many else ""
        if curve.per_agent:
            for agent in run.agents:
                xs, ys = _points(run, curve.keys[0][0].format(agent=agent))
                if xs:
                    out.append(Series(prefix + agent, xs, ys, agents.index(agent), ri))
        else:
            several = len(curve.keys) > 1
            for ki, (key, label) in enumerate(curve.keys):
                xs, ys = _points(run, key, curve.start)
                if xs and several:
                    out.append(Series(prefix + label, xs, ys, ki, ri))
                elif xs:
                    out.append(Series(run.label, xs, ys, ri, ri))
    return out


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="stats"><tr>{head}</tr>{body}</table>'


def _chart(svg: str) -> str:
    return f'<div class="chart">{svg}</div>'


def curves_view(runs: Sequence[RunData], agents: Sequence[str]) -> str:
    """Every chart of ``CURVES`` that has data, grouped in its sections."""
    parts, n = [], 0
    for section, curves in CURVES:
        charts = []
        for curve in curves:
            series = curve_series(curve, runs, agents)
            if series:
                xlabel = "steps done" if curve.start else "step"
                charts.append(
                    _chart(line_chart(curve.title, curve.ylabel, series, f"c{n}", xlabel))
                )
                n += 1
        if charts:
            parts.append(f'<h2>{_esc(section)}</h2><div class="charts">{"".join(charts)}</div>')
    if not parts:
        return '<p class="muted">no step has finished yet: metrics.jsonl holds no line</p>'
    if len(runs) > 1:
        styles = ", ".join(
            f"{r.label}: {LINESTYLES[i % len(LINESTYLES)][1]}" for i, r in enumerate(runs)
        )
        parts.insert(0, f'<p class="muted">line style per run: {_esc(styles)}</p>')
    return "".join(parts)


def _confusion_table(title: str, counts: dict[str, int], says: tuple[str, str]) -> str:
    rows = [
        ("right answer", counts["right/good"], counts["right/bad"]),
        ("wrong answer", counts["wrong/good"], counts["wrong/bad"]),
    ]
    return f"<h3>{_esc(title)}</h3>" + _table(("true outcome", *says), rows)


def _latest_mean(h: AgentHealthSummary, stat: str) -> str:
    return f"{_fmt(h.latest[stat])} / {_fmt(h.mean[stat])}"


def health_table(summary: CoachSummary) -> str:
    """Per agent: can its coach scores teach it (``coach_health/...``, latest / run mean)."""
    if not summary.health:
        return ""
    rows = [
        (
            agent,
            f"{h.signal_steps} / {h.steps}",
            _latest_mean(h, "spread"),
            _latest_mean(h, "tie_rate"),
            _latest_mean(h, "mode_share"),
            _latest_mean(h, "digit_mass"),
            h.longest_streak,
        )
        for agent, h in summary.health.items()
    ]
    return "<h3>coach health per agent: latest step / mean over the run</h3>" + _table(
        (
            "agent",
            "steps with signal / scored",
            "score spread (points)",
            "tie rate",
            "mode share",
            "digit mass",
            "longest no-signal streak",
        ),
        rows,
    )


def coach_block(run: RunData, summary: CoachSummary, chart_prefix: str) -> str:
    """One run's coach statistics: accounting, the separation and coach-health warnings,
    tables, charts."""
    sep = summary.separation
    parts = []
    if sep.warning:
        parts.append(f'<div class="warning">{_esc(sep.warning)}</div>')
    for warning in summary.health_warnings:
        parts.append(f'<div class="warning">{_esc(warning)}</div>')
    t = summary.totals
    flagged = ", ".join(f"{k}: {v}" for k, v in sorted(summary.flagged_by_reason.items()))
    parts.append(
        _table(
            (
                "scored actions",
                "flagged (fallbacks)",
                "coach calls",
                "cache hits",
                "retries",
                "failures",
                "tokens (prompt / completion)",
                "cost (USD)",
                "latency p50 / p95 (s)",
            ),
            [
                (
                    summary.scored,
                    f"{sum(summary.flagged_by_reason.values())}"
                    + (f" ({flagged})" if flagged else ""),
                    int(t["calls"]),
                    int(t["cache_hits"]),
                    int(t["retries"]),
                    int(t["failures"]),
                    f"{int(t['prompt_tokens'])} / {int(t['completion_tokens'])}",
                    f"{t['cost_usd']:.4f}",
                    f"{_fmt(summary.latency_p50_s)} / {_fmt(summary.latency_p95_s)}",
                )
            ],
        )
    )
    parts.append(health_table(summary))
    parts.append("<h3>final agent's score vs the true outcome</h3>")
    parts.append(
        _table(
            ("graded (right / wrong)", "correlation r", "mean score right", "mean score wrong"),
            [
                (
                    f"{sep.n_correct} / {sep.n_wrong}",
                    _fmt(sep.r),
                    _fmt(sep.mean_correct),
                    _fmt(sep.mean_wrong),
                )
            ],
        )
    )
    parts.append(
        _confusion_table(
            f"confusion: final score >= {GOOD_SCORE:g} counts as the coach saying right",
            sep.confusion,
            (f"score >= {GOOD_SCORE:g}", f"score < {GOOD_SCORE:g}"),
        )
    )
    if sep.verdict_confusion:
        parts.append(
            _confusion_table(
                "confusion: the coach's ANSWER_CORRECT verdict",
                sep.verdict_confusion,
                ("coach: correct", "coach: wrong"),
            )
        )
    rows = [
        (agent, task_type, s.n, _fmt(s.mean), _fmt(s.std))
        for (agent, task_type), s in summary.by_agent_type.items()
    ]
    parts.append("<h3>score per agent and task type (flagged left out)</h3>")
    parts.append(_table(("agent", "task type", "actions", "mean", "std"), rows))
    charts = []
    if summary.by_agent:
        ordered = {a: summary.by_agent[a].histogram for a in run.agents if a in summary.by_agent}
        charts.append(histogram_chart("score distribution per agent", ordered, f"{chart_prefix}a"))
    final = [s for s in run.scores if s.final and not s.flagged and s.correct is not None]
    if final:
        groups = {
            label: spread(vals).histogram
            for label, vals in (
                ("right answers", [s.value for s in final if s.correct]),
                ("wrong answers", [s.value for s in final if not s.correct]),
            )
            if vals
        }
        charts.append(
            histogram_chart(
                f"final agent ({run.final_agent}) score by outcome", groups, f"{chart_prefix}f"
            )
        )
    if len(summary.task_types) > 1:
        for i, agent in enumerate(run.agents):
            groups = {tt: s.histogram for (a, tt), s in summary.by_agent_type.items() if a == agent}
            if groups:
                charts.append(
                    histogram_chart(f"{agent}: score by task type", groups, f"{chart_prefix}t{i}")
                )
    xs, ys = _points(run, "coach_bias/final_vs_outcome_r")
    if xs:
        charts.append(
            line_chart(
                "final score vs outcome, per step",
                "correlation r",
                [Series(run.label, xs, ys)],
                f"{chart_prefix}r",
            )
        )
    xs, ys = _points(run, "coach/flagged")
    if xs:
        charts.append(
            line_chart(
                "flagged fallbacks per step",
                "actions",
                [Series(run.label, xs, ys, 1)],
                f"{chart_prefix}g",
            )
        )
    parts.append('<div class="charts">' + "".join(_chart(c) for c in charts) + "</div>")
    return "".join(parts)


def coach_view(runs: Sequence[RunData]) -> str:
    """The coach statistics of every run, one block each."""
    blocks = []
    for i, run in enumerate(runs):
        summary = coach_summary(run.scores, run.metrics, run.agents, run.warn_no_signal_steps)
        body = (
            coach_block(run, summary, f"k{i}")
            if run.scores
            else ('<p class="muted">no scored action yet</p>')
        )
        blocks.append(f'<div class="run-block"><h2>{_esc(run.label)}</h2>{body}</div>')
    return "".join(blocks)


VIEWER = """
<div class="controls">
  <label>episodes of <select id="f-run"></select></label>
  <label>step <button id="f-prev" title="previous step">&#9664;</button>
    <select id="f-step"></select><button id="f-next" title="next step">&#9654;</button></label>
  <label>agent <select id="f-agent"></select></label>
  <label>coach score <input id="f-min" type="number" min="0" max="10" step="0.5" value="0">
    to <input id="f-max" type="number" min="0" max="10" step="0.5" value="10"></label>
  <label>outcome <select id="f-outcome"><option value="">all</option>
    <option value="right">right</option><option value="wrong">wrong</option>
    <option value="ungraded">not graded</option></select></label>
  <label>flagged <select id="f-flagged"><option value="">all</option>
    <option value="yes">with a flagged score</option><option value="no">none flagged</option>
    </select></label>
  <label>task <input id="f-text" type="search" placeholder="id or text"></label>
</div>
<div id="compare-panel" hidden></div>
<div id="ep-summary"></div>
<div id="ep-list"></div>
"""


def _static(name: str) -> str:
    return (resources.files("mappa.report") / "static" / name).read_text(encoding="utf-8")


def _script_json(data: Any) -> str:
    """JSON that is safe inside a ``<script>`` element or a script file: ``<`` is escaped,
    so no string in it can end the element (``</script>``) or open a comment."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def _write(path: Path, text: str) -> None:
    """Write beside, then rename: a browser reloading mid-regeneration never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_steps(runs: Sequence[RunData], out: Path) -> list[dict[str, Any]]:
    """One script per episode set and step under ``out/steps`` (stale ones from an earlier
    report are removed); returns the viewer's index of sets, steps and tasks.

    A run's training episodes are one set and its held-out episodes (``eval.every``), if
    any, another, named "<run> (held-out)": the viewer offers each set like a run.
    """
    steps_dir = out / "steps"
    steps_dir.mkdir(parents=True, exist_ok=True)
    sets = [(run.label, run.agents, run.steps) for run in runs]
    sets += [(f"{run.label} (held-out)", run.agents, run.heldout) for run in runs if run.heldout]
    index: list[dict[str, Any]] = []
    written: set[str] = set()
    for vi, (label, agents, by_step) in enumerate(sets):
        entries: list[dict[str, Any]] = []
        tasks: dict[str, list[int]] = {}  # task id -> the steps it was drawn in
        for step in sorted(by_step):
            episodes = by_step[step]
            name = f"r{vi}-s{step:05d}.js"
            _write(steps_dir / name, f"mappaStep({vi},{step},{_script_json(episodes)});\n")
            written.add(name)
            entries.append({"step": step, "n": len(episodes), "file": f"steps/{name}"})
            for ep in episodes:
                seen = tasks.setdefault(str(ep["task_id"]), [])
                if not seen or seen[-1] != step:
                    seen.append(step)
        index.append({"label": label, "agents": agents, "steps": entries, "tasks": tasks})
    for stale in steps_dir.glob("r*-s*.js"):
        if stale.name not in written:
            stale.unlink()
    return index


def render_page(runs: Sequence[RunData], index: list[dict[str, Any]], command: str) -> str:
    """The whole ``index.html``."""
    agents = list(dict.fromkeys(a for r in runs for a in r.agents))
    labels = ", ".join(r.label for r in runs)
    steps = ", ".join(f"{r.label}: {len(r.metrics)} step(s) logged" for r in runs)
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>mappa report: {_esc(labels)}</title>
<style>{_static("report.css")}</style>
</head>
<body>
<header>
<h1>mappa report: {_esc(labels)}</h1>
<div class="meta">{_esc(steps)}; generated {_esc(generated)}; regenerate with
<code>{_esc(command)}</code></div>
<nav><button data-view="curves">Curves</button><button data-view="coach">Coach</button>
<button data-view="episodes">Episodes</button></nav>
</header>
<main>
<section class="view" id="view-curves">{curves_view(runs, agents)}</section>
<section class="view" id="view-coach">{coach_view(runs)}</section>
<section class="view" id="view-episodes">{VIEWER}</section>
</main>
<script type="application/json" id="mappa-data">{_script_json({"runs": index})}</script>
<script>{_static("report.js")}</script>
</body>
</html>
"""


def write_report(run_dirs: Sequence[Path], out: Path) -> Path:
    """Read the runs, write the report into ``out``; returns the path of ``index.html``."""
    for run_dir in run_dirs:  # a wrong path is named even without matplotlib installed
        check_run_dir(run_dir)
    require_matplotlib()  # fail before reading a large run
    labels = run_labels(list(run_dirs))
    runs = [load_run(path, label) for path, label in zip(run_dirs, labels, strict=True)]
    out.mkdir(parents=True, exist_ok=True)
    index = write_steps(runs, out)
    command = " ".join(["mappa report", *map(str, run_dirs), "--out", str(out)])
    page = out / "index.html"
    _write(page, render_page(runs, index, command))
    return page
