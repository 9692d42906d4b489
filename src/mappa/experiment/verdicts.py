"""Verdicts on final held-out accuracy: is arm A better than arm B, by a rule fixed before
the runs, with the uncertainty a handful of seeds leaves.

The unit of replication is the run. A run's final held-out accuracy already carries the
held-out set's sampling noise (each problem answered right or wrong, on this run), so a test
over runs counts that noise once, through the runs' spread, with the degrees of freedom the
runs give: a handful. Arms that share seeds start each seed from the same training problems
and the same first batch, and seeds move all arms together (round 2: SD ~0.06 shared, against
~0.04 per run), so they are compared seed-paired: the per-seed differences A - B, a t test
with S - 1 degrees of freedom. Arms without two common seeds are compared by Welch's t
(Satterthwaite's degrees of freedom). One comparison, the primary, is named before the runs
and tested alone at ``ALPHA``; the others (secondary) are Holm-corrected as a family, so ten
pairs do not buy ten chances at a false "A > B".

A two-level bootstrap over seeds and held-out problems is reported beside each test as a
sensitivity analysis (``bootstrap_gap``); it does not decide.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats
from statsmodels.stats.multitest import multipletests

ALPHA = 0.05
"""The primary test's level, and the Holm family's for the secondary ones."""

BOOTSTRAP_REPLICATES = 4000
BOOTSTRAP_SEED = 0
"""A fixed generator seed: the same records give the same sensitivity interval."""

TIE = 1e-12
"""Differences closer than this are the same number (accuracies are k/N; float subtraction
leaves ~1e-16)."""

RULE = (
    "final held-out accuracy (each run's last evaluation); arms that share at least 2 seeds "
    "are compared seed-paired (per common seed A - B; t test with S - 1 degrees of freedom, "
    "its 95 % CI), otherwise by Welch's t (Satterthwaite degrees of freedom, its 95 % CI); "
    "the primary comparison is tested alone at 0.05, the secondary ones are Holm-corrected "
    "together; a verdict 'A > B' needs the 95 % CI to exclude 0 (and, for a secondary one, "
    "its Holm-adjusted p < 0.05), otherwise it is 'undecided'; fewer than 2 seeds, or seeds "
    "without spread, are undecided; the bootstrap CI (seeds and held-out problems resampled) "
    "is a sensitivity analysis beside it and decides nothing"
)

Pair = tuple[str, str]
Floats = NDArray[np.float64]


@dataclass(frozen=True)
class TTest:
    """A t test of A - B, vectorised over the leading axes of its inputs.

    ``low``/``high`` (the 95 % CI of the mean difference) and ``p`` are nan where the test
    has nothing to stand on (``no_spread``)."""

    test: str
    diff: Floats
    low: Floats
    high: Floats
    df: Floats
    p: Floats
    no_spread: NDArray[np.bool_]


def _flat(x: Floats) -> NDArray[np.bool_]:
    """Rows (last axis) whose values are all the same number."""
    return np.asarray(np.ptp(x, axis=-1) <= TIE)


def _ttest(test: str, result: Any, diff: Floats, no_spread: NDArray[np.bool_]) -> TTest:
    ci = result.confidence_interval(1 - ALPHA)
    nan = np.float64(np.nan)
    return TTest(
        test,
        diff,
        np.where(no_spread, nan, ci.low),
        np.where(no_spread, nan, ci.high),
        np.asarray(result.df, dtype=np.float64),
        np.where(no_spread, nan, result.pvalue),
        no_spread,
    )


def paired_t(a: ArrayLike, b: ArrayLike) -> TTest:
    """Seed-paired t test of A - B; the last axis is the seeds (the same seed at the same
    index in ``a`` and ``b``), leading axes are independent experiments.

    Where every seed's difference is the same, scipy divides by a zero spread and calls any
    nonzero gap certain (t = inf, p = 0): with a handful of seeds that is a coincidence, not
    evidence, so the test reports no p and no CI there (``no_spread``).

    >>> t = paired_t([0.70, 0.60, 0.75], [0.65, 0.50, 0.72])
    >>> round(float(t.diff), 3), float(t.df), round(float(t.p), 3)
    (0.06, 2.0, 0.102)
    >>> bool(paired_t([0.7, 0.6], [0.6, 0.5]).no_spread)
    True
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = x - y
    with warnings.catch_warnings():  # rows without spread: handled below, not warned about
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ttest_rel(x, y, axis=-1)
        return _ttest("paired t", result, d.mean(axis=-1), _flat(d))


def welch_t(a: ArrayLike, b: ArrayLike) -> TTest:
    """Welch's t test of mean A - mean B (unequal variances, Satterthwaite degrees of
    freedom); the last axis is each arm's runs. No p and no CI when neither arm's runs
    spread (``no_spread``; see ``paired_t``).

    >>> t = welch_t([0.70, 0.60, 0.75], [0.40, 0.45])
    >>> round(float(t.diff), 3), round(float(t.df), 2), round(float(t.p), 3)
    (0.258, 2.89, 0.016)
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ttest_ind(x, y, axis=-1, equal_var=False)
        diff = x.mean(axis=-1) - y.mean(axis=-1)
        return _ttest("Welch t", result, diff, _flat(x) & _flat(y))


def significant(p: ArrayLike) -> NDArray[np.bool_]:
    """Whether a (Holm-adjusted, for a secondary comparison) p is below ``ALPHA``; a
    missing p (nan) never is. For a t test the 95 % CI excludes 0 exactly when p < 0.05."""
    q = np.asarray(p, dtype=np.float64)
    return np.asarray(np.nan_to_num(q, nan=1.0) < ALPHA)


def holm(p: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p values (statsmodels' ``multipletests``) of the comparisons that were
    tested; ``None`` stays ``None``. A comparison that could not be tested (too few seeds)
    cannot be called falsely, so the family is the tested ones.

    >>> holm([0.01, None, 0.04, 0.02])
    [0.03, None, 0.04, 0.04]
    """
    tested = [i for i, x in enumerate(p) if x is not None]
    if not tested:
        return [None] * len(p)
    adjusted = multipletests([p[i] for i in tested], alpha=ALPHA, method="holm")[1]
    out: list[float | None] = [None] * len(p)
    for i, q in zip(tested, adjusted, strict=True):
        out[i] = float(q)
    return out


def bootstrap_gap(
    a: ArrayLike,
    b: ArrayLike,
    paired: bool,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """95 % percentile interval of mean A - mean B with seeds and held-out problems both
    resampled.

    Args:
        a, b: per-problem answers, shape (runs, problems), the share of samples right; row
            i of ``a`` and of ``b`` is the same seed when ``paired``; the columns are the
            same problems in the same order.
        paired: resample seeds together (one draw for both arms), else each arm's runs on
            their own. Problems are always one draw for both arms: every run answered them.

    Written here because a run's accuracy is a mean over problems that every run shares
    (seeds x problems crossed): ``scipy.stats.bootstrap`` resamples one level of
    independent observations, which is either the runs (problems fixed) or the problems
    (seeds fixed). Resampling with replacement is a multinomial weighting, so each replicate
    is one weighted mean, all of them at once.

    It asks a wider question than the t test (other seeds *and* other problems from the same
    generator), and with 3 seeds a resample of seeds has only 10 distinct draws and
    understates their spread by (S - 1)/S: read it as a check on the t test's interval,
    not as a test.

    >>> a = [[1, 1, 0, 1], [1, 0, 0, 1], [1, 1, 1, 1]]
    >>> b = [[1, 0, 0, 0], [0, 0, 0, 1], [1, 1, 0, 0]]
    >>> low, high = bootstrap_gap(a, b, paired=True)
    >>> 0 < low < 0.5 < high <= 1
    True
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    rng = np.random.default_rng(seed)
    problems = rng.multinomial(x.shape[1], np.full(x.shape[1], 1 / x.shape[1]), replicates)

    def weights(runs: int) -> NDArray[np.int64]:
        return rng.multinomial(runs, np.full(runs, 1 / runs), replicates)

    if paired:
        ws = weights(x.shape[0])
        total = np.einsum("rs,sp,rp->r", ws, x - y, problems) / (x.shape[0] * x.shape[1])
    else:
        wa, wb = weights(x.shape[0]), weights(y.shape[0])
        total = np.einsum("rs,sp,rp->r", wa, x, problems) / (x.shape[0] * x.shape[1])
        total -= np.einsum("rs,sp,rp->r", wb, y, problems) / (y.shape[0] * y.shape[1])
    low, high = np.percentile(total, [100 * ALPHA / 2, 100 * (1 - ALPHA / 2)])
    return float(low), float(high)


@dataclass(frozen=True)
class ArmFinals:
    """An arm's runs as the verdicts read them: seed -> final held-out accuracy (runs that
    have one), seed -> that evaluation's per-problem answers (``None``: not kept), and the
    seeds whose run has no final evaluation."""

    name: str
    accuracy: Mapping[int, float]
    answers: Mapping[int, Mapping[str, float] | None]
    missing: Sequence[int] = ()


def plan(
    arms: Sequence[str], primary: Pair | None, secondary: Sequence[Pair] | None
) -> list[tuple[str, Pair]]:
    """The comparisons to make, ``(role, (A, B))``, the primary first. ``secondary=None``
    (not stated): every pair of arms that is not the primary, in the arms' order.

    >>> plan(["p", "o", "g"], ("p", "o"), None)
    [('primary', ('p', 'o')), ('secondary', ('p', 'g')), ('secondary', ('o', 'g'))]
    >>> plan(["p", "o", "g"], None, [("g", "o")])
    [('secondary', ('g', 'o'))]
    """
    rest = (
        [p for p in combinations(arms, 2) if primary is None or set(p) != set(primary)]
        if secondary is None
        else list(secondary)
    )
    return ([("primary", primary)] if primary else []) + [("secondary", p) for p in rest]


def _matrix(answers: Sequence[Mapping[str, float] | None]) -> Floats | None:
    """Per-problem answers as a (runs, problems) array, problems sorted by id; ``None`` when
    a run has none or the runs were not graded on the same problems."""
    if not answers or any(not x for x in answers):
        return None
    problems = sorted(answers[0] or {})
    if any(sorted(x or {}) != problems for x in answers):
        return None
    return np.array([[(x or {})[t] for t in problems] for x in answers], dtype=np.float64)


def compare(a: ArmFinals, b: ArmFinals) -> dict[str, Any]:
    """``a`` against ``b``: which test, on which seeds, the gap, its CI, p, and the
    bootstrap interval beside it (no verdict: ``verdicts`` gives it, after Holm).

    Seed-paired over the seeds both arms have a final evaluation for when there are at
    least 2 (a run without a partner is left out and named); otherwise Welch over every
    run. ``test`` is ``None`` when no test could be made (an arm without a final
    evaluation, or fewer than 2 runs); ``ci`` and ``p`` are ``None`` also when the runs
    had no spread (``paired_t``)."""
    common = sorted(set(a.accuracy) & set(b.accuracy))
    paired = len(common) >= 2
    seeds_a = common if paired else sorted(a.accuracy)
    seeds_b = common if paired else sorted(b.accuracy)
    left_out = [f"{x.name}-s{s} (no final evaluation)" for x in (a, b) for s in x.missing]
    left_out += [
        f"{x.name}-s{s} (no partner seed)"
        for x, kept in ((a, seeds_a), (b, seeds_b))
        for s in sorted(x.accuracy)
        if s not in kept
    ]
    out: dict[str, Any] = {"a": a.name, "b": b.name, "test": None}
    out |= {"seeds_a": seeds_a, "seeds_b": seeds_b, "left_out": left_out}
    out |= {"diff": None, "ci": None, "df": None, "p": None, "bootstrap_ci": None}
    if not seeds_a or not seeds_b:
        return out
    xa, xb = [a.accuracy[s] for s in seeds_a], [b.accuracy[s] for s in seeds_b]
    out["diff"] = float(np.mean(xa) - np.mean(xb))
    if len(xa) < 2 or len(xb) < 2:
        return out
    t = paired_t(xa, xb) if paired else welch_t(xa, xb)
    out["test"] = t.test
    if bool(t.no_spread):
        return out
    out |= {"ci": [float(t.low), float(t.high)], "p": float(t.p), "df": float(t.df)}
    answers = _matrix([a.answers.get(s) for s in seeds_a] + [b.answers.get(s) for s in seeds_b])
    if answers is not None:
        out["bootstrap_ci"] = list(bootstrap_gap(answers[: len(xa)], answers[len(xa) :], paired))
    return out


def verdict(c: dict[str, Any]) -> str:
    """The verdict on one comparison (``compare``'s, with ``role`` and ``p_holm``)."""
    if c["diff"] is None:
        return "undecided: no final held-out accuracy"
    if c["test"] is None:
        return "undecided: fewer than 2 seeds"
    if c["ci"] is None:
        same = "every seed's difference" if c["test"] == "paired t" else "every run"
        return f"undecided: {same} is the same, no spread to test against"
    low, high = c["ci"]
    ci = f"95 % CI {low:+.3f} to {high:+.3f}"
    if low <= 0 <= high:
        return f"undecided: {ci} covers 0"
    if not significant(c["p_holm"]):
        return f"undecided: Holm-adjusted p {c['p_holm']:.3f} >= {ALPHA} ({ci})"
    return f"{c['a']} {'>' if c['diff'] > 0 else '<'} {c['b']} ({ci})"


def verdicts(
    arms: Mapping[str, ArmFinals], primary: Pair | None, secondary: Sequence[Pair] | None
) -> list[dict[str, Any]]:
    """Every planned comparison (``plan``) with its verdict, the primary first; the
    secondary ones' p Holm-adjusted together (``p_holm``; the primary's is its own p)."""
    out = [
        {
            "role": role,
            **compare(arms.get(x) or ArmFinals(x, {}, {}), arms.get(y) or ArmFinals(y, {}, {})),
        }
        for role, (x, y) in plan(list(arms), primary, secondary)
    ]
    second = [c for c in out if c["role"] == "secondary"]
    for c, q in zip(second, holm([c["p"] for c in second]), strict=True):
        c["p_holm"] = q
    for c in out:
        if c["role"] == "primary":
            c["p_holm"] = c["p"]
        c["verdict"] = verdict(c)
    return out
