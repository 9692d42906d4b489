"""The few lines a person reads when a run ends: did the coach's view of each agent move,
did accuracy move, how much was trained on, and where everything is."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mappa.jsonl import read_jsonl


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.2f}"


def _first_last(rows: Sequence[dict[str, Any]], key: str) -> tuple[Any, Any]:
    values = [r.get(key) for r in rows if r.get(key) is not None]
    return (values[0], values[-1]) if values else (None, None)


def run_summary(run_dir: Path, agents: Sequence[str]) -> str:
    """A ten-second summary of a finished run, from its ``metrics.jsonl``.

    Per agent: coach score at the first and the last step, and the actions trained on;
    training and held-out accuracy, first and last; in how many (step, agent) pairs the
    coach's scores carried signal and the mean probability it put on a score where it was
    read (digit mass; ~1 for a coach that follows its template); where the run's files are.
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
    for label, key in (("accuracy (training rollouts)", "accuracy"), ("held-out", "eval/accuracy")):
        first, last = _first_last(rows, key)
        if first is not None:
            lines.append(f"  {label}: {_num(first)} -> {_num(last)}")
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
