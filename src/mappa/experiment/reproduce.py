"""Does this machine train a recorded run as its record says? An experiment that spans
machines resumes on whatever a new machine installs (a newer library release a range
admits, another CPU's kernels); before its runs sit beside the recorded ones, rerun one
run's first step here and compare it with the record, number for number.

The comparison is exact: a recorded step and its rerun on the same code, environment and
seed are bit-identical (sampling, the coach's scores and the update are seeded), so any
difference at all says the new machine's runs are not the old one's continued. What is
compared, for the first step:

- every training action's row (``action_rows``): its coach score, tool status, the
  oracle's verdict, the episode's outcome: these fingerprint the sampled text and the
  coach's read of it;
- the step's metrics line but for its timings (keys ending in ``_s``) and the coach's
  ``USAGE`` counters: loss, grad norm, KL, entropy and mean reward per agent fingerprint
  the update.

The rerun scores every action afresh, its coach cache off: a score read back from the cache
the recorded run filled would test nothing on this machine. So how often the coach was
called, its cache hits and tokens differ from the record by design, and are not compared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SHOWN = 5
"""Differences named in the verdict (the rest are counted)."""


USAGE = frozenset(
    f"coach/{k}"
    for k in ("calls", "cache_hits", "retries", "prompt_tokens", "completion_tokens", "cost_usd")
)
"""How the coach was called, not what it said: they follow the cache's state and the
network, so a rerun with its cache off differs here by design."""


def is_timing(key: str) -> bool:
    """A metrics key that measures time (``update_s``, ``coach/latency_p50_s``,
    ``rollout_tokens_per_s``): it differs between any two runs, so it is not compared.

    >>> is_timing("coach/latency_p95_s"), is_timing("rl/verifier/loss")
    (True, False)
    """
    return key.rsplit("/", 1)[-1].endswith("_s")


def compared(key: str) -> bool:
    """A metrics key the comparison holds to the record: not a timing, not ``USAGE``.

    >>> compared("rl/verifier/loss"), compared("coach/cache_hits"), compared("update_s")
    (True, False, False)
    """
    return not is_timing(key) and key not in USAGE


def same(a: Any, b: Any) -> bool:
    """Exactly equal, a NaN equal to a NaN (a recorded NaN loss reproduced is a match).

    >>> same(float("nan"), float("nan")), same(2.5, 2.5), same(1.0, 1.0000001), same(0, None)
    (True, True, False, False)
    """
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


@dataclass
class Comparison:
    """A rerun step against its record."""

    step: int
    actions: int
    """Training actions in the recorded step."""
    actions_same: int
    metrics: int
    """Metrics keys compared (the recorded line's, but for timings and ``USAGE``)."""
    metrics_same: int
    left_out: int
    """Timing and ``USAGE`` keys left out."""
    differences: list[str] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        return not self.differences


def _action_label(row: Mapping[str, Any]) -> str:
    return f"{row.get('episode_id')} {row.get('agent')} turn {row.get('turn')}"


def compare_step(
    step: int,
    recorded_actions: Sequence[Mapping[str, Any]],
    actions: Sequence[Mapping[str, Any]],
    recorded_metrics: Mapping[str, Any],
    metrics: Mapping[str, Any],
) -> Comparison:
    """Compare one step's actions and metrics line, rerun, with its record.

    Args:
        step: the step compared (its ``step`` in the records).
        recorded_actions: the record's action rows of the step, in the run's order.
        actions: the rerun's action rows of the same step.
        recorded_metrics: the record's metrics line of the step.
        metrics: the rerun's metrics line.

    Returns:
        What matched, and each difference as a line naming the action or key and both
        values (recorded first).
    """
    diffs: list[str] = []
    if len(actions) != len(recorded_actions):
        diffs.append(f"{len(recorded_actions)} actions recorded, {len(actions)} now")
    actions_same = 0
    for old, new in zip(recorded_actions, actions, strict=False):  # counted above
        keys = list(dict.fromkeys([*old, *new]))
        changed = [k for k in keys if not same(old.get(k), new.get(k))]
        if not changed:
            actions_same += 1
            continue
        diffs.append(
            f"action {_action_label(old)}: "
            + ", ".join(f"{k} {old.get(k)!r} recorded, {new.get(k)!r} now" for k in changed)
        )
    keys = [k for k in recorded_metrics if compared(k)]
    metrics_same = 0
    for key in keys:
        if same(recorded_metrics[key], metrics.get(key)):
            metrics_same += 1
        else:
            was, now = recorded_metrics[key], metrics.get(key)
            diffs.append(f"metric {key}: {was!r} recorded, {now!r} now")
    extra = [k for k in metrics if k not in recorded_metrics and compared(k)]
    if extra:
        diffs.append(f"metrics the record lacks: {', '.join(extra)}")
    return Comparison(
        step=step,
        actions=len(recorded_actions),
        actions_same=actions_same,
        metrics=len(keys),
        metrics_same=metrics_same,
        left_out=sum(not compared(k) for k in recorded_metrics),
        differences=diffs,
    )


def verdict_lines(name: str, comparison: Comparison, changes: list[str]) -> list[str]:
    """What ``mappa experiment --reproduce`` prints after the rerun; ``changes``: how the
    record's code and environment differ from this machine's (``environment_changes``)."""
    c = comparison
    lines = [
        f"{name}, step {c.step}: {c.actions_same} of {c.actions} training actions identical "
        "(coach score, tool status, oracle verdict, outcome); "
        f"{c.metrics_same} of {c.metrics} metrics identical ({c.left_out} timings and coach "
        "usage counters not compared)"
    ]
    lines += [f"  differs: {d}" for d in c.differences[:SHOWN]]
    if len(c.differences) > SHOWN:
        lines.append(f"  ... and {len(c.differences) - SHOWN} more differences")
    lines.append(
        "recorded on this code and environment"
        if not changes
        else "recorded on another code or environment: " + "; ".join(changes)
    )
    if c.reproduced:
        lines.append(f"reproduced: this machine trains {name}'s first step exactly as recorded")
    else:
        lines.append(
            "not reproduced: this machine's runs would not continue the recorded ones; "
            "record new runs here only as a new experiment (or restore the recording "
            "environment: the record's environment is in record.json)"
        )
    return lines
