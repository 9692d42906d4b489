"""How often the experiment's primary test calls a difference, by simulation: its
false-positive rate when the arms are equal, and its power at given true gaps, for a number
of seeds. The test is the one `mappa experiment` applies (``mappa.experiment.verdicts``:
seed-paired t on final held-out accuracy, 95 % CI excluding 0).

The model of one experiment, with the spreads measured in round 2 (docs/results.md):
each held-out problem has its own difficulty (a logit drawn once per problem, shared by all
arms and seeds); each seed moves every arm alike (a shared seed effect on the logit scale);
each run adds its own effect (the run-to-run spread that pairing cannot remove); each
problem is then answered right or wrong on that run. An arm's true gap is a shift of its
mean accuracy, set on the logit scale so that the expected accuracies differ by ``gap``.
The run-to-run logit SD is chosen so that a paired seed's difference has the SD measured in
round 2 (``--pair-sd``, 0.065) at the base accuracy given; the script prints what it got.

    .venv/bin/python benchmarks/verdict_power.py [--seeds 4 6 8 10] [--gaps 0 0.08 0.1 0.15]

With ``--look-from EXPERIMENT.yaml`` it simulates that experiment's whole design instead: the
one look of its ``analysis.look`` (the SD of the first seeds' paired differences, read by
``mappa.experiment.look.decide``) picks how many seeds run, and the primary test is made on
those. Choosing the seed count from the spread is known to move a t test's level a little in
small samples; this measures how much, under the model above.
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import optimize, special

from mappa.experiment.markdown import fmt
from mappa.experiment.verdicts import paired_t, significant


def accuracies(
    rng: np.random.Generator,
    experiments: int,
    seeds: int,
    problems: int,
    base: float,
    gap: float,
    seed_sd: float,
    run_sd: float,
    problem_sd: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Final held-out accuracies of arms A and B, shape (experiments, seeds) each."""
    difficulty = rng.normal(0.0, problem_sd, (experiments, 1, problems))
    seed = rng.normal(0.0, seed_sd, (experiments, seeds, 1))
    centre_b = _logit_for_mean(base, problem_sd)
    centre_a = _logit_for_mean(base + gap, problem_sd)

    def arm(centre: float) -> np.ndarray:
        run = rng.normal(0.0, run_sd, (experiments, seeds, 1))
        p = special.expit(centre + difficulty + seed + run)
        right = rng.random(p.shape) < p
        return np.asarray(right.mean(axis=-1))

    return arm(centre_a), arm(centre_b)


def _logit_for_mean(mean: float, problem_sd: float) -> float:
    """The logit centre whose problems, spread by ``problem_sd``, average ``mean`` right."""
    z = np.random.default_rng(1).normal(0.0, problem_sd, 20000)
    return float(optimize.brentq(lambda c: special.expit(c + z).mean() - mean, -12.0, 12.0))


def calibrated_run_sd(args: argparse.Namespace) -> float:
    """The run-to-run logit SD at which a paired seed's difference has SD ``--pair-sd``."""
    rng = np.random.default_rng(2)

    def excess(run_sd: float) -> float:
        a, b = accuracies(
            rng, 400, 2, args.problems, args.base, 0.0, args.seed_sd, run_sd, args.problem_sd
        )
        return float((a - b).std()) - args.pair_sd

    return float(optimize.brentq(excess, 0.0, 3.0, xtol=1e-3))


def adaptive_calls(
    a: np.ndarray, b: np.ndarray, after: int, rule: dict[float, int], planned: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per simulated experiment (rows of ``a``, ``b``: seeds in order, at least the rule's
    largest count), the seeds the look decides and whether the primary test then calls a
    difference on that many seeds."""
    from mappa.experiment.look import decide

    diffs = a - b
    spread = diffs[:, :after].std(axis=1, ddof=1)
    seeds = np.array([decide(float(sd), rule, planned) for sd in spread])
    calls = np.zeros(len(seeds), dtype=bool)
    for n in np.unique(seeds):
        rows = seeds == n
        calls[rows] = significant(paired_t(a[rows, :n], b[rows, :n]).p)
    return seeds, calls


def look_design(path: str) -> tuple[int, dict[float, int], int]:
    """``analysis.look``'s seeds looked at and rule, and the seeds the file plans."""
    from pathlib import Path

    from mappa.experiment.spec import load_experiment

    spec = load_experiment(Path(path))
    look = spec.analysis.look
    if look is None:
        raise SystemExit(f"{path}: no analysis.look to simulate")
    return look.after_seeds, dict(look.seeds_if_sd_above), len(spec.seeds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[4, 6, 8, 10])
    parser.add_argument("--gaps", type=float, nargs="+", default=[0.0, 0.08, 0.10, 0.15])
    parser.add_argument("--problems", type=int, default=128, help="held-out problems")
    parser.add_argument("--base", type=float, default=0.40, help="arm B's mean accuracy")
    parser.add_argument("--pair-sd", type=float, default=0.065)
    parser.add_argument("--seed-sd", type=float, default=0.3, help="shared, logit scale")
    parser.add_argument("--problem-sd", type=float, default=1.5, help="logit scale")
    parser.add_argument("--experiments", type=int, default=4000)
    parser.add_argument(
        "--look-from", default=None, help="an experiment file whose analysis.look to simulate"
    )
    args = parser.parse_args()
    run_sd = calibrated_run_sd(args)
    rng = np.random.default_rng(0)
    a, b = accuracies(
        rng, 4000, 2, args.problems, args.base, 0.0, args.seed_sd, run_sd, args.problem_sd
    )
    print(
        f"{args.problems} problems, arm B at {args.base:.2f}; run-to-run logit SD {run_sd:.3f} "
        f"gives a paired seed's difference SD {float((a - b).std()):.3f}; "
        f"{args.experiments} simulated experiments a cell"
    )
    if args.look_from:
        return _simulate_look(args, rng, run_sd)
    print("P(the primary test calls A > B or A < B):")
    print(f"{'seeds':>6}" + "".join(f"{'gap ' + format(g, '.2f'):>11}" for g in args.gaps))
    for seeds in args.seeds:
        cells = []
        for gap in args.gaps:
            a, b = _simulate(args, rng, run_sd, seeds, gap)
            cells.append(float(significant(paired_t(a, b).p).mean()))
        print(f"{seeds:>6}" + "".join(f"{c:>11.3f}" for c in cells))
    return 0


def _simulate(
    args: argparse.Namespace, rng: np.random.Generator, run_sd: float, seeds: int, gap: float
) -> tuple[np.ndarray, np.ndarray]:
    """``--experiments`` simulated experiments of ``seeds`` seeds at a true ``gap``."""
    return accuracies(
        rng,
        args.experiments,
        seeds,
        args.problems,
        args.base,
        gap,
        args.seed_sd,
        run_sd,
        args.problem_sd,
    )


def _simulate_look(args: argparse.Namespace, rng: np.random.Generator, run_sd: float) -> int:
    after, rule, planned = look_design(args.look_from)
    most = max([planned, *rule.values()])
    counts = sorted({planned, *rule.values()})
    print(
        f"the design of {args.look_from}: look after {after} seeds, rule {rule}, "
        f"{planned} seeds planned"
    )
    header = "".join(
        f"{'P(' + str(n) + ' seeds)':>14}{'P(call|' + str(n) + ')':>13}" for n in counts
    )
    print(f"{'gap':>6}{'P(call)':>10}{'mean seeds':>12}{header}")
    for gap in args.gaps:
        a, b = _simulate(args, rng, run_sd, most, gap)
        seeds, calls = adaptive_calls(a, b, after, rule, planned)
        shares = "".join(
            f"{float((seeds == n).mean()):>14.3f}{_share(calls[seeds == n]):>13}" for n in counts
        )
        print(f"{gap:>6.2f}{float(calls.mean()):>10.3f}{float(seeds.mean()):>12.2f}{shares}")
    return 0


def _share(calls: np.ndarray) -> str:
    """The share of ``calls`` that called a difference; ``-`` when no simulated experiment
    ended at that seed count (no share to give, rather than numpy's nan and warning)."""
    return fmt(float(calls.mean()) if calls.size else None)


if __name__ == "__main__":
    raise SystemExit(main())
