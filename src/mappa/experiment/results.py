"""The results table of an experiment: pure functions of the runs' metrics lines.

Every number is a statistic over seeds: ``n`` (seeds that have the value), ``mean``,
``min``, ``max`` and ``std`` (sample standard deviation; null below 2 seeds). Whether one
arm beats another is ``mappa.experiment.verdicts``' call, on the comparisons the experiment
file named before the runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import mean, stdev
from typing import Any

from mappa.experiment.credit import by_tool_outcome, first_wrong_blame, oracle_auc
from mappa.experiment.verdicts import RULE, ArmFinals, Pair, verdicts

TRAIN_WINDOW = 5
"""Training-rollout accuracy and coach scores are averaged over this many steps (the first
and the last), so one lucky batch does not make the number."""

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
    actions: Sequence[Mapping[str, Any]] | None = None
    """Its training actions (``records.action_rows``); None where they were not recorded."""


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
    by steps done (the eval after step index ``i`` is at ``i + 1``), with the training
    episodes sampled by then (``episodes``: the most any run had; None where the metrics
    do not count them), so that sample efficiency reads as accuracy against episodes."""
    points: dict[int, list[float | None]] = {}
    seen: dict[int, int] = {}
    for run in runs:
        total = 0
        for m in run.metrics:
            total += int(m.get("episodes") or 0)
            if m.get("eval/accuracy") is not None:
                step = int(m["step"]) + 1
                points.setdefault(step, []).append(m["eval/accuracy"])
                seen[step] = max(seen.get(step, 0), total)
    curve = (
        [{"step": 0, "episodes": 0, **spread([base_accuracy])}] if base_accuracy is not None else []
    )
    return curve + [
        {"step": s, "episodes": seen.get(s) or None, **spread(v)} for s, v in sorted(points.items())
    ]


def _final(run: RunRecord) -> Metrics | None:
    lines = eval_lines(run.metrics)
    return lines[-1] if lines else None


ANSWERED = "accuracy_given_answer"
"""The held-out accuracy among problems the team answered in the answer format."""


def accuracy_given_answer(m: Metrics, final_agent: str, prefix: str = "") -> float | None:
    """Accuracy among the problems whose final answer was in the format (a boxed one):
    ``accuracy`` over the final agent's ``format_rate``. A right answer is always one in the
    format (the grader reads only what the format marks), so this is P(right | answered): it
    separates getting the arithmetic right from stating a result the grader can read. None
    where nothing was answered.

    >>> accuracy_given_answer({"accuracy": 0.25, "format_rate/v": 0.5}, "v")
    0.5
    """
    rate, acc = m.get(f"{prefix}format_rate/{final_agent}"), m.get(f"{prefix}accuracy")
    return None if not rate or acc is None else float(acc) / float(rate)


def behaviour(runs: Sequence[RunRecord], base: Metrics | None) -> dict[str, Stats]:
    """Each numeric held-out behaviour metric (``agent_metrics``' keys, pass@k) at the final
    evaluation, over seeds, with the base model's value beside it; and the accuracy given
    an answer in the format (``accuracy_given_answer``; the final agent is a team's last)."""
    keys: list[str] = []
    finals = [(r, f) for r in runs if (f := _final(r)) is not None]
    for _, f in finals:
        for key, value in f.items():
            name = key.removeprefix("eval/")
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if key.startswith("eval/") and numeric and not _bookkeeping(name) and name not in keys:
                keys.append(name)
    out = {
        k: {"base": (base or {}).get(k), **spread([f.get(f"eval/{k}") for _, f in finals])}
        for k in keys
    }
    answered = [accuracy_given_answer(f, r.agents[-1], "eval/") for r, f in finals if r.agents]
    if any(a is not None for a in answered):
        final_agent = next(r.agents[-1] for r, _ in finals if r.agents)
        at_base = None if base is None else accuracy_given_answer(base, final_agent)
        out[ANSWERED] = {"base": at_base, **spread(answered)}
    return out


def _bookkeeping(name: str) -> bool:
    return name in NOT_BEHAVIOUR or name.startswith("avg@")


def optimizer_steps(run: RunRecord) -> dict[str, int]:
    """Optimizer steps each agent took in the run: per training step its ``rl/<agent>/steps``
    (one per mini-batch, ``rl.mini_batch_size``); in records made before that was logged,
    one per step whose update was not skipped (``rl/<agent>/skipped`` empty; no actions, no
    reward signal or a non-finite loss skip it). Arms with the same rollout budget can differ
    here, and so does what they learned.

    >>> optimizer_steps(RunRecord("a", 0, [{"rl/v/skipped": ""}, {"rl/v/skipped": "no actions"},
    ...     {"rl/v/skipped": ""}, {}], agents=["v"]))
    {'v': 2}
    >>> optimizer_steps(RunRecord("a", 0, [{"rl/v/skipped": "", "rl/v/steps": 3},
    ...     {"rl/v/skipped": "no actions", "rl/v/steps": 0}], agents=["v"]))
    {'v': 3}
    """

    def taken(m: Metrics, agent: str) -> int:
        steps = m.get(f"rl/{agent}/steps")
        return int(steps) if steps is not None else int(m.get(f"rl/{agent}/skipped") == "")

    return {a: sum(taken(m, a) for m in run.metrics) for a in run.agents}


def starved_steps(run: RunRecord) -> int:
    """Training steps whose batch held no right episode (training accuracy 0): an outcome
    reward gives every action of such a step the same reward, nothing to learn from.

    >>> starved_steps(RunRecord("a", 0, [{"accuracy": 0.0}, {"accuracy": 0.25}, {}]))
    1
    """
    return sum(1 for m in run.metrics if m.get("accuracy") == 0)


def _all_actions(runs: Sequence[RunRecord]) -> list[Mapping[str, Any]]:
    """The recorded training actions of all ``runs``, in order (none for a record made
    before actions were kept)."""
    return [a for r in runs for a in (r.actions or [])]


def credit(runs: Sequence[RunRecord], agents: Sequence[str]) -> dict[str, Any] | None:
    """The arm's training actions over all its seeds against the oracle's verdicts
    (``mappa.experiment.credit``); None where no action carries a score and a verdict."""
    rows = _all_actions(runs)
    aucs = oracle_auc(rows, agents)
    if not any(a.right + a.wrong for a in aucs):
        return None
    blame = first_wrong_blame(rows, agents)
    return {
        "oracle_auc": {a.agent: {"auc": a.auc, "right": a.right, "wrong": a.wrong} for a in aucs},
        "first_wrong_lowest": {"hits": blame.hits, "episodes": blame.episodes},
    }


def tool_outcomes(runs: Sequence[RunRecord], agents: Sequence[str]) -> list[dict[str, Any]]:
    """The arm's training actions of each tool-using agent over all its seeds, by how the
    code run ended (``mappa.experiment.credit.by_tool_outcome``): what the reward paid a
    reply that ran no program against one whose program ran."""
    rows = _all_actions(runs)
    return [vars(t) for t in by_tool_outcome(rows, agents)]


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
        "starved_steps": spread([starved_steps(r) for r in runs]),
        "credit": credit(runs, agents),
        "tool_outcomes": tool_outcomes(runs, agents),
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


def arm_finals(arm: str, runs: Sequence[RunRecord]) -> ArmFinals:
    """What the verdicts read of an arm's runs: each seed's final held-out accuracy and
    answers, and the seeds whose run has no final evaluation."""
    finals = {r.seed: _final(r) for r in runs}
    return ArmFinals(
        arm,
        {s: float(f["eval/accuracy"]) for s, f in finals.items() if f is not None},
        {r.seed: r.answers for r in runs if finals[r.seed] is not None},
        [s for s, f in finals.items() if f is None],
    )


def summarize(
    runs: Sequence[RunRecord],
    base: Metrics | None,
    primary: Pair | None = None,
    secondary: Sequence[Pair] | None = None,
) -> dict[str, Any]:
    """``results.json``: per arm (in the order first seen) its summary, then the comparisons
    of final held-out accuracy (``verdicts.plan``: ``primary``, then ``secondary``; ``None``:
    every other pair). ``base``: the base model's held-out metrics (``eval.json``), the
    step-0 point of every arm; ``None`` if it was not evaluated."""
    arms: dict[str, list[RunRecord]] = {}
    for run in runs:
        arms.setdefault(run.arm, []).append(run)
    finals = {arm: arm_finals(arm, rs) for arm, rs in arms.items()}
    return {
        "base": None if base is None else {"accuracy": base.get("accuracy")},
        "train_window": TRAIN_WINDOW,
        "verdict_rule": RULE,
        "analysis": {
            "primary": None if primary is None else list(primary),
            "secondary": "every other pair" if secondary is None else [list(p) for p in secondary],
        },
        "arms": {arm: arm_summary(rs, base) for arm, rs in arms.items()},
        "comparisons": verdicts(finals, primary, secondary),
    }
