"""Seeded synthetic tabular tasks with the DSBench file contract.

Each task has an id column, numeric and categorical features, missing values, and a target
from a formula plus noise: binary or multi-class classification (optionally with string
labels) or regression. Small enough that a CPU agent's scikit-learn code runs in seconds,
hard enough that a constant prediction scores badly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mappa.tasks.dsbench.spec import DSBenchTask, TaskType, write_task

KINDS = ("binary", "multiclass", "regression")
_CATEGORIES = {
    "color": ["red", "green", "blue", "grey"],
    "region": ["north", "south", "east", "west", "center"],
}


def _frame(rng: np.random.Generator, n: int, n_numeric: int) -> tuple[pd.DataFrame, np.ndarray]:
    """Features and the latent score they determine (before noise)."""
    cols: dict[str, np.ndarray] = {}
    latent = np.zeros(n)
    for j in range(n_numeric):
        x = rng.normal(0, 1 + j % 3, n)
        w = rng.normal(0, 1) if j < max(2, n_numeric // 2) else 0.0  # some features are noise
        latent += w * x / (1 + j % 3)
        cols[f"num_{j}"] = x
    for name, levels in _CATEGORIES.items():
        codes = rng.integers(0, len(levels), n)
        effects = rng.normal(0, 0.8, len(levels))
        latent += effects[codes]
        cols[name] = np.array(levels, dtype=object)[codes]
    frame = pd.DataFrame(cols)
    for col in ["num_0", "color"]:  # missing values the Data Engineer must handle
        frame.loc[rng.random(n) < 0.08, col] = np.nan
    return frame, latent


def make_task(
    folder: Path,
    kind: str,
    seed: int,
    n_train: int = 400,
    n_test: int = 150,
    string_labels: bool = True,
) -> DSBenchTask:
    """Write one task into ``folder`` and return its record."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    frame, latent = _frame(rng, n, n_numeric=int(rng.integers(4, 8)))
    noisy = latent + rng.normal(0, 0.5, n)
    task_type: TaskType = "regression" if kind == "regression" else "classification"
    if kind == "regression":
        target = pd.Series(np.round(50 + 10 * noisy, 3))
        metric = "RMSE (lower is better)"
    elif kind == "binary":
        labels = np.array(["no", "yes"] if string_labels else [0, 1], dtype=object)
        target = pd.Series(labels[(noisy > np.median(noisy)).astype(int)])
        metric = "accuracy (higher is better)"
    else:
        cuts = np.quantile(noisy, [1 / 3, 2 / 3])
        labels = np.array(["low", "medium", "high"] if string_labels else [0, 1, 2], dtype=object)
        target = pd.Series(labels[np.digitize(noisy, cuts)])
        metric = "macro F1 (higher is better)"
    ids = rng.permutation(np.arange(1000, 1000 + n))
    frame.insert(0, "id", ids)
    frame["target"] = target.values
    train, test = frame.iloc[:n_train], frame.iloc[n_train:]
    description = (
        f"## Overview\nPredict `target` for each row of test.csv ({task_type}, {kind}).\n\n"
        f"## Evaluation\nSubmissions are evaluated by {metric}.\n\n"
        "## Submission format\nA CSV with a header and one row per test id:\n"
        f"```\nid,target\n{test['id'].iloc[0]},{target.iloc[n_train]}\n...\n```\n\n"
        "## Data\n- train.csv: features and the `target` column\n"
        "- test.csv: the same features without `target`\n"
        "- Columns: `id` (row identifier), `num_*` (numeric), `color` and `region` "
        "(categorical); some values are missing."
    )
    return write_task(folder, f"synthetic-{kind}-{seed}", task_type, description, train, test)


def generate(root: Path, per_kind: int = 3, seed: int = 0) -> list[DSBenchTask]:
    """``per_kind`` tasks of each kind under ``root`` (identical for the same seed)."""
    return [
        make_task(
            root / f"{kind}-{i}", kind, seed=seed * 1000 + 10 * i + k, string_labels=i % 2 == 0
        )
        for i in range(per_kind)
        for k, kind in enumerate(KINDS)
    ]
