"""The few lines a person reads when a run ends: did the coach's view of each agent move,
did accuracy move, how much was trained on, and where everything is."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mappa.jsonl import read_jsonl


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.2f}"


def _first_last(rows: Sequence[dict[str, Any]], key: str) -> tuple[Any, Any]:
    values = [r.get(key) for r in rows if r.get(key) is not None]
    return (values[0], values[-1]) if values else (None, None)


def _right(acc: float, graded: int) -> str:
    return f"{round(acc * graded)}/{graded}"


def heldout_change(rows: Sequence[dict[str, Any]]) -> str | None:
    """One line on what training changed on the held-out set: the untrained team's accuracy
    (``eval.at_start``) against the last evaluation's, and whether the gap is beyond the
    noise of the set's size: larger than two standard errors of the difference of two
    proportions, ``2 * sqrt(p0 (1 - p0) / n0 + p1 (1 - p1) / n1)``. None without both."""
    start = next((r for r in rows if r.get("eval_start/accuracy") is not None), None)
    end = next((r for r in reversed(rows) if r.get("eval/accuracy") is not None), None)
    if start is None or end is None:
        return None
    p0, n0 = float(start["eval_start/accuracy"]), int(start["eval_start/graded"])
    p1, n1 = float(end["eval/accuracy"]), int(end["eval/graded"])
    noise = 2 * math.sqrt(p0 * (1 - p0) / n0 + p1 * (1 - p1) / n1)
    gap = p1 - p0
    verdict = "beyond" if abs(gap) > noise else "within"
    return (
        f"held-out accuracy, untrained -> after step {int(end['step'])}: {p0:.2f} -> {p1:.2f} "
        f"({_right(p0, n0)} -> {_right(p1, n1)} right, {gap:+.2f}; {verdict} the noise of "
        f"{n1} problems, two standard errors {noise:.2f})"
    )


def run_summary(run_dir: Path, agents: Sequence[str]) -> str:
    """A ten-second summary of a finished run, from its ``metrics.jsonl``.

    Per agent: coach score at the first and the last step, and the actions trained on;
    training accuracy, first and last; held-out accuracy, the untrained team's against the
    last (``heldout_change``) or else the first evaluation's against the last; in how many
    (step, agent) pairs the coach's scores carried signal and the mean probability it put on
    a score where it was read (digit mass; ~1 for a coach that follows its template); where
    the run's files are.
    """
    rows = read_jsonl(run_dir / "metrics.jsonl")
    steps = len(rows)
    width = max(len(a) for a in agents)
    lines = [f"mappa: {steps} step(s) done in {run_dir}"]
    lines.append(f"  coach score 0-10, step 0 -> step {steps - 1}, and actions trained:")
    for agent in agents:
        first, last = _first_last(rows, f"coach/{agent}")
        trained = sum(int(r.get(f"rl/{agent}/actions") or 0) for r in rows)
        skipped = sum(bool(r.get(f"rl/{agent}/skipped")) for r in rows)
        note = f" ({skipped} step(s) skipped)" if skipped else ""
        lines.append(
            f"    {agent:<{width}}  {_num(first)} -> {_num(last)}   {trained} trained{note}"
        )
    change = heldout_change(rows)
    accuracies = [("accuracy (training rollouts)", "accuracy")]
    if change is None:  # else the change line says it, from the untrained team on
        accuracies.append(("held-out", "eval/accuracy"))
    for label, key in accuracies:
        first, last = _first_last(rows, key)
        if first is not None:
            lines.append(f"  {label}: {_num(first)} -> {_num(last)}")
    if change is not None:
        lines.append(f"  {change}")
    scored = sum(int(r.get("coach_health/agents") or 0) for r in rows)
    if scored:
        signal = sum(int(r.get("coach_health/signal_agents") or 0) for r in rows)
        masses = [m for r in rows if (m := r.get("coach_health/digit_mass")) is not None]
        mass = (
            f"; digit mass {sum(masses) / len(masses):.3f} (lowest step {min(masses):.3f})"
            if masses
            else ""
        )
        lines.append(f"  coach signal: {signal} of {scored} agent-steps{mass}")
    lines.append(
        f"  written: episodes.jsonl, metrics.jsonl, adapters/ ({', '.join(agents)}) in {run_dir}"
    )
    lines.append(f"  evaluate: mappa eval --adapters {run_dir}")
    return "\n".join(lines)
