"""The results table of an experiment: pure functions of the runs' metrics lines.

Every number is a statistic over seeds: ``n`` (seeds that have the value), ``mean``,
``min``, ``max`` and ``std`` (sample standard deviation; null below 2 seeds). A gap between
two arms is called a difference only when it is larger than the seeds' spread (``VERDICT_RULE``):
with a handful of seeds a min-max range is the honest yardstick, and anything inside it is
noise as far as this experiment can tell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from math import sqrt
from statistics import mean, stdev
from typing import Any

TRAIN_WINDOW = 5
"""Training-rollout accuracy and coach scores are averaged over this many steps (the first
and the last), so one lucky batch does not make the number."""

VERDICT_RULE = (
    "a gap counts as a difference only when |mean A - mean B| of the final held-out accuracy "
    "is larger than the larger of the two arms' seed ranges (max - min over seeds) and than "
    "twice the standard error the held-out set's size alone puts on it "
    "(sqrt(pA(1-pA)/N + pB(1-pB)/N), N graded answers per run), and each arm has at least "
    "2 seeds with a final evaluation"
)

PAIRED_RULE = (
    "paired on the same held-out problems: per problem, each arm's share of its runs that "
    "answered it right (final evaluation); d = the mean over the N problems of A's share minus "
    "B's; its standard error combines the problems' (the standard deviation of the per-problem "
    "differences / sqrt(N)) and the seeds' (each arm's sample variance of its runs' accuracies "
    "/ its runs) as sqrt(SE_problems^2 + SE_seeds^2); A > B when |d| > 2 SE, with at least 2 "
    "runs per arm, every one graded on the same problems"
)

NOT_BEHAVIOUR = frozenset({"accuracy", "tasks", "samples", "temperature", "graded"})
"""Held-out keys that are not behaviour: accuracy (reported as such) and bookkeeping."""

Metrics = Mapping[str, Any]
Stats = dict[str, Any]


@dataclass
class RunRecord:
    """One run of an arm: its seed, its ``metrics.jsonl`` lines, its wall time."""

    arm: str
    seed: int
    metrics: Sequence[Metrics]
    wall_s: float | None = None
    agents: Sequence[str] = field(default_factory=tuple)
    answers: Mapping[str, float] | None = None
    """The final held-out evaluation per problem: task id -> share of its samples right."""


def spread(values: Sequence[float | None]) -> Stats:
    """n, mean, min, max and sample std of the values present (``None`` ones left out).

    >>> spread([0.25, None, 0.5])
    {'n': 2, 'mean': 0.375, 'min': 0.25, 'max': 0.5, 'std': 0.1767766952966369}
    >>> spread([0.5])["std"], spread([])["mean"]
    (None, None)
    """
    present = [float(v) for v in values if v is not None]
    if not present:
        return {"n": 0, "mean": None, "min": None, "max": None, "std": None}
    return {
        "n": len(present),
        "mean": mean(present),
        "min": min(present),
        "max": max(present),
        "std": stdev(present) if len(present) > 1 else None,
    }


def eval_lines(metrics: Sequence[Metrics]) -> list[Metrics]:
    """The step lines that carry a held-out evaluation."""
    return [m for m in metrics if m.get("eval/accuracy") is not None]


def _window_mean(metrics: Sequence[Metrics], key: str, last: bool) -> float | None:
    values = [m[key] for m in metrics if m.get(key) is not None]
    window = values[-TRAIN_WINDOW:] if last else values[:TRAIN_WINDOW]
    return mean(window) if window else None


def heldout_curve(runs: Sequence[RunRecord], base_accuracy: float | None) -> list[Stats]:
    """Held-out accuracy at each eval point: the base model at step 0, then each eval,
    by steps done (the eval after step index ``i`` is at ``i + 1``)."""
    points: dict[int, list[float | None]] = {}
    for run in runs:
        for m in eval_lines(run.metrics):
            points.setdefault(int(m["step"]) + 1, []).append(m["eval/accuracy"])
    curve = [{"step": 0, **spread([base_accuracy])}] if base_accuracy is not None else []
    return curve + [{"step": s, **spread(v)} for s, v in sorted(points.items())]


def _final(run: RunRecord) -> Metrics | None:
    lines = eval_lines(run.metrics)
    return lines[-1] if lines else None


def behaviour(runs: Sequence[RunRecord], base: Metrics | None) -> dict[str, Stats]:
    """Each numeric held-out behaviour metric (``agent_metrics``' keys, pass@k) at the final
    evaluation, over seeds, with the base model's value beside it."""
    keys: list[str] = []
    finals = [f for f in map(_final, runs) if f is not None]
    for f in finals:
        for key, value in f.items():
            name = key.removeprefix("eval/")
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if key.startswith("eval/") and numeric and not _bookkeeping(name) and name not in keys:
                keys.append(name)
    return {
        k: {"base": (base or {}).get(k), **spread([f.get(f"eval/{k}") for f in finals])}
        for k in keys
    }


def _bookkeeping(name: str) -> bool:
    return name in NOT_BEHAVIOUR or name.startswith("avg@")


def optimizer_steps(run: RunRecord) -> dict[str, int]:
    """Optimizer steps each agent took in the run: its steps whose update was not skipped
    (``rl/<agent>/skipped`` empty; no actions, no reward signal or a non-finite loss skip it).
    Arms with the same rollout budget can differ here, and so does what they learned.

    >>> optimizer_steps(RunRecord("a", 0, [{"rl/v/skipped": ""}, {"rl/v/skipped": "no actions"},
    ...     {"rl/v/skipped": ""}, {}], agents=["v"]))
    {'v': 2}
    """
    return {a: sum(m.get(f"rl/{a}/skipped") == "" for m in run.metrics) for a in run.agents}


def arm_summary(runs: Sequence[RunRecord], base: Metrics | None) -> dict[str, Any]:
    """One arm's numbers over its seeds (``runs``: its runs, one per seed)."""
    agents = list(dict.fromkeys(a for r in runs for a in r.agents))
    finals = [_final(r) for r in runs]
    coach = {
        agent: {
            "start": spread([_window_mean(r.metrics, f"coach/{agent}", last=False) for r in runs]),
            "end": spread([_window_mean(r.metrics, f"coach/{agent}", last=True) for r in runs]),
        }
        for agent in agents
        if any(m.get(f"coach/{agent}") is not None for r in runs for m in r.metrics)
    }
    return {
        "seeds": [r.seed for r in runs],
        "heldout": heldout_curve(runs, None if base is None else base.get("accuracy")),
        "final": spread([None if f is None else f["eval/accuracy"] for f in finals]),
        "train_accuracy": spread([_window_mean(r.metrics, "accuracy", last=True) for r in runs]),
        "coach": coach,
        "behaviour": behaviour(runs, base),
        "optimizer_steps": {a: spread([optimizer_steps(r).get(a) for r in runs]) for a in agents},
        "wall_s": spread([r.wall_s for r in runs]),
        "runs": {
            f"{r.arm}-s{r.seed}": {
                "steps": len(r.metrics),
                "final": None if f is None else f["eval/accuracy"],
                "train_accuracy": _window_mean(r.metrics, "accuracy", last=True),
                "optimizer_steps": optimizer_steps(r),
                "wall_s": r.wall_s,
            }
            for r, f in zip(runs, finals, strict=True)
        },
    }


def verdict(a: str, sa: Stats, b: str, sb: Stats, graded: int | None = None) -> dict[str, Any]:
    """Arm ``a``'s final accuracy minus ``b``'s, and whether that is a difference
    (``VERDICT_RULE``). ``graded``: answers graded in one run's final evaluation (``None``:
    unknown, the sampling-error test is skipped).

    Two seeds can agree by chance (a range of 0), so the seeds' range alone would call a
    one-problem gap on a small held-out set a difference; the binomial standard error of
    the gap is the floor the set's size puts under any honest verdict.

    >>> v = verdict("p", spread([0.5, 0.6]), "o", spread([0.2, 0.25]), graded=100)
    >>> round(v["diff"], 3), round(v["spread"], 3), round(v["two_se"], 3), v["verdict"]
    (0.325, 0.1, 0.13, 'p > o')
    >>> verdict("p", spread([0.5, 0.6]), "o", spread([0.45, 0.5]))["verdict"]
    'no difference within the seeds spread'
    >>> verdict("p", spread([0.5, 0.5]), "o", spread([0.25, 0.25]), graded=16)["verdict"]
    "no difference within the held-out set's sampling error"
    >>> verdict("p", spread([0.5]), "o", spread([0.1]))["verdict"]
    'undecided: fewer than 2 seeds'
    """
    out: dict[str, Any] = {"a": a, "b": b, "diff": None, "spread": None, "two_se": None}
    if sa["n"] == 0 or sb["n"] == 0:
        return out | {"verdict": "undecided: no final held-out accuracy"}
    out["diff"] = sa["mean"] - sb["mean"]
    out["spread"] = max(sa["max"] - sa["min"], sb["max"] - sb["min"])
    if graded:
        pa, pb = sa["mean"], sb["mean"]
        out["two_se"] = 2 * sqrt((pa * (1 - pa) + pb * (1 - pb)) / graded)
    if sa["n"] < 2 or sb["n"] < 2:
        return out | {"verdict": "undecided: fewer than 2 seeds"}
    if abs(out["diff"]) <= out["spread"]:
        return out | {"verdict": "no difference within the seeds spread"}
    if out["two_se"] is not None and abs(out["diff"]) <= out["two_se"]:
        return out | {"verdict": "no difference within the held-out set's sampling error"}
    return out | {"verdict": f"{a} > {b}" if out["diff"] > 0 else f"{a} < {b}"}


def paired(
    a: str, runs_a: Sequence[RunRecord], b: str, runs_b: Sequence[RunRecord]
) -> dict[str, Any]:
    """Arm ``a`` against ``b`` on the same held-out problems (``PAIRED_RULE``).

    Pairing by problem removes what the draw of the held-out problems does to both arms
    alike; the seeds' variance is added back because a verdict must hold for another seed.

    >>> ra = [RunRecord("a", s, [], answers={"p1": 1.0, "p2": 1.0, "p3": x}) for s, x in
    ...       enumerate([0.0, 1.0])]
    >>> rb = [RunRecord("b", s, [], answers={"p1": 0.0, "p2": 1.0, "p3": 0.0}) for s in (0, 1)]
    >>> v = paired("a", ra, "b", rb)
    >>> round(v["diff"], 3), v["problems"], round(v["se_problems"], 3), round(v["se_seeds"], 3)
    (0.5, 3, 0.289, 0.167)
    >>> v["verdict"]
    'no difference within 2 SE of the paired gap'
    """
    out: dict[str, Any] = {"a": a, "b": b, "diff": None, "problems": 0}
    out |= {"se_problems": None, "se_seeds": None, "two_se": None}
    answers = [r.answers for r in (*runs_a, *runs_b)]
    if any(x is None for x in answers):
        return out | {"verdict": "undecided: a run has no per-problem answers"}
    problems = set(answers[0] or {})
    if not problems or any(set(x or {}) != problems for x in answers):
        return out | {"verdict": "undecided: the runs were not graded on the same problems"}
    if len(runs_a) < 2 or len(runs_b) < 2:
        return out | {"verdict": "undecided: fewer than 2 seeds"}

    def share(runs: Sequence[RunRecord], task: str) -> float:
        return mean((r.answers or {})[task] for r in runs)

    def seed_var(runs: Sequence[RunRecord]) -> float:
        return stdev(mean((r.answers or {}).values()) for r in runs) ** 2 / len(runs)

    diffs = [share(runs_a, t) - share(runs_b, t) for t in sorted(problems)]
    n = len(diffs)
    se_problems = stdev(diffs) / sqrt(n) if n > 1 else 0.0
    se_seeds = sqrt(seed_var(runs_a) + seed_var(runs_b))
    two_se = 2 * sqrt(se_problems**2 + se_seeds**2)
    out |= {"diff": mean(diffs), "problems": n, "se_problems": se_problems}
    out |= {"se_seeds": se_seeds, "two_se": two_se}
    if abs(out["diff"]) <= two_se:
        return out | {"verdict": "no difference within 2 SE of the paired gap"}
    return out | {"verdict": f"{a} > {b}" if out["diff"] > 0 else f"{a} < {b}"}


def graded_per_run(runs: Sequence[RunRecord]) -> int | None:
    """Answers graded in a final held-out evaluation (the same in every run: an experiment
    refuses runs whose held-out sets differ); ``None`` if no run says."""
    counts = [f.get("eval/graded") for f in map(_final, runs) if f is not None]
    return min((int(c) for c in counts if c is not None), default=None)


def summarize(runs: Sequence[RunRecord], base: Metrics | None) -> dict[str, Any]:
    """``results.json``: per arm (in the order first seen) its summary, then every pair of
    arms compared on final held-out accuracy. ``base``: the base model's held-out metrics
    (``eval.json``), the step-0 point of every arm; ``None`` if it was not evaluated."""
    arms: dict[str, list[RunRecord]] = {}
    for run in runs:
        arms.setdefault(run.arm, []).append(run)
    summary = {arm: arm_summary(rs, base) for arm, rs in arms.items()}
    return {
        "base": None if base is None else {"accuracy": base.get("accuracy")},
        "train_window": TRAIN_WINDOW,
        "verdict_rule": VERDICT_RULE,
        "paired_rule": PAIRED_RULE,
        "arms": summary,
        "comparisons": [
            verdict(a, summary[a]["final"], b, summary[b]["final"], graded_per_run(runs))
            for a, b in combinations(summary, 2)
        ],
        "paired": [paired(a, arms[a], b, arms[b]) for a, b in combinations(summary, 2)],
    }
