"""The one look an experiment may take part way: the spread of the primary comparison's
per-seed differences, and how many seeds that spread asks for.

Seeds are costly, so an experiment may plan a few and add more if the runs turn out noisier
than its power arithmetic assumed. Looking is safe only if the look cannot see the answer:
it reads the sample SD of the per-seed differences A - B, never their mean, and applies a
rule written in the experiment file before the runs (``analysis.look``). It is taken once;
its result is kept beside the records (``look.json``), so the decision is on file with the
runs it was made from, and a second call shows it instead of looking again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from statistics import stdev

from mappa.experiment.records import Records
from mappa.experiment.results import RunRecord, arm_finals
from mappa.experiment.spec import ExperimentConfig, ExperimentError, RunSpec

LOOK_FILE = "look.json"


@dataclass(frozen=True)
class Look:
    """A look taken: what it read and what it decided."""

    pair: tuple[str, str]
    seeds: list[int]
    """The seeds whose differences were read (the file's first ``after_seeds``)."""
    sd: float
    """Sample SD (n - 1) of the per-seed differences A - B of final held-out accuracy."""
    rule: dict[float, int]
    planned: int
    """The file's seed count when the look was taken."""
    decided: int
    taken: str
    """When (UTC, ISO 8601)."""


def decide(sd: float, rule: Mapping[float, int], planned: int) -> int:
    """Seeds to run: the largest count whose SD threshold ``sd`` is above, else ``planned``;
    never fewer than ``planned`` (a look that could cut seeds would stop on a lucky spread).

    >>> rule = {0.08: 8, 0.10: 10}
    >>> decide(0.07, rule, 6), decide(0.09, rule, 6), decide(0.12, rule, 6)
    (6, 8, 10)
    >>> decide(0.08, rule, 6), decide(0.09, rule, 9)  # above, not at; never fewer
    (6, 9)
    """
    return max([planned, *(n for threshold, n in rule.items() if sd > threshold)])


def take_look(spec: ExperimentConfig, runs: Sequence[RunSpec], records: Records) -> Look:
    """The look ``spec.analysis.look`` states, read from ``records``: the one on file when it
    was taken before, else a new one, written to ``<records>/look.json``.

    Raises ``ExperimentError`` when the file states no look, or when a run of the first
    ``after_seeds`` seed blocks (any arm: the blocks must be complete) is not recorded.
    """
    stated = spec.analysis.look
    if stated is None or spec.analysis.primary is None:
        raise ExperimentError(
            "the experiment file states no look (analysis.look); a look must be stated "
            "before the runs (docs/experiments.md)"
        )
    seeds = spec.seeds[: stated.after_seeds]
    kept = read_look(records.root)
    if kept is not None:
        stated_now = (spec.analysis.primary, seeds, dict(stated.seeds_if_sd_above))
        if (kept.pair, kept.seeds, kept.rule) != stated_now:
            raise ExperimentError(
                f"the look in {records.root / LOOK_FILE} (taken {kept.taken}) read "
                f"{' - '.join(kept.pair)} on seeds {kept.seeds} under the rule {kept.rule}; "
                "the file now states another; a look is taken once, so restore the file's "
                "analysis.look"
            )
        return kept
    block = [r for r in runs if r.seed in seeds]
    missing = [r.name for r in block if not records.has(r)]
    if missing:
        raise ExperimentError(
            f"the look comes after seed blocks {seeds} are complete; not recorded yet in "
            f"{records.root}: {', '.join(missing)}"
        )
    a, b = spec.analysis.primary
    finals = {
        arm: arm_finals(
            arm, [RunRecord(arm, r.seed, records.read(r).metrics) for r in block if r.arm == arm]
        )
        for arm in (a, b)
    }
    lacking = [f"{f.name}-s{s}" for f in finals.values() for s in f.missing]
    if lacking:
        raise ExperimentError(f"no final held-out accuracy in the records of {', '.join(lacking)}")
    diffs = [finals[a].accuracy[s] - finals[b].accuracy[s] for s in seeds]
    sd = stdev(diffs)
    look = Look(
        (a, b),
        list(seeds),
        sd,
        dict(stated.seeds_if_sd_above),
        len(spec.seeds),
        decide(sd, stated.seeds_if_sd_above, len(spec.seeds)),
        datetime.now(UTC).isoformat(timespec="seconds"),
    )
    path = records.root / LOOK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(look), indent=2) + "\n")
    return look


def read_look(root: Path) -> Look | None:
    """The look kept in the records directory ``root``, if one was taken."""
    path = root / LOOK_FILE
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    raw["pair"] = tuple(raw["pair"])
    raw["rule"] = {float(t): int(n) for t, n in raw["rule"].items()}
    return Look(**raw)


def look_lines(look: Look, spec: ExperimentConfig, experiment_file: Path) -> list[str]:
    """What ``mappa experiment --look`` prints: the spread, the rule, the decision; never
    the differences' mean."""
    a, b = look.pair
    rule = ", ".join(f"SD > {t:g}: {n} seeds" for t, n in sorted(look.rule.items()))
    lines = [
        f"look taken {look.taken}: {a} - {b}, final held-out accuracy, seeds "
        f"{look.seeds}: SD of the per-seed differences {look.sd:.3f} (their mean is not read)",
        f"rule (analysis.look): {rule}; otherwise the {look.planned} seeds planned",
    ]
    if look.decided == look.planned:
        lines.append(f"decision: {look.decided} seeds; the file's seeds stand")
    elif len(spec.seeds) >= look.decided:
        lines.append(f"decision: {look.decided} seeds; {experiment_file} runs them already")
    else:
        after = max(spec.seeds) + 1
        wanted = [*spec.seeds, *range(after, after + look.decided - len(spec.seeds))]
        lines.append(
            f"decision: {look.decided} seeds; set seeds: {wanted} in {experiment_file} and "
            "rerun the experiment to go on"
        )
    return lines
