"""Real tabular datasets that ship inside scikit-learn, as DSBench-style tasks.

breast_cancer (binary), wine and digits (multi-class), diabetes (regression): real data
beats synthetic where we can have it offline (docs/design.md §3). The ``fetch_*`` datasets need
the network and are not used.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mappa.tasks.dsbench.spec import DSBenchTask, TaskType, write_task

DATASETS: dict[str, tuple[str, TaskType]] = {
    "breast_cancer": ("load_breast_cancer", "classification"),
    "wine": ("load_wine", "classification"),
    "digits": ("load_digits", "classification"),
    "diabetes": ("load_diabetes", "regression"),
}


def make_task(folder: Path, name: str, seed: int = 0, test_fraction: float = 0.3) -> DSBenchTask:
    import sklearn.datasets

    loader, task_type = DATASETS[name]
    bunch = getattr(sklearn.datasets, loader)(as_frame=True)
    frame: pd.DataFrame = bunch.frame.rename(columns={bunch.target.name: "target"})
    frame.columns = [str(c).replace(" ", "_") for c in frame.columns]
    if task_type == "classification" and name != "digits":
        names = np.asarray(bunch.target_names, dtype=object)
        frame["target"] = names[frame["target"].to_numpy()]  # string labels, as on Kaggle
    rng = np.random.default_rng(seed)
    frame.insert(0, "id", rng.permutation(len(frame)) + 1)
    order = rng.permutation(len(frame))
    n_test = int(len(frame) * test_fraction)
    test, train = frame.iloc[order[:n_test]], frame.iloc[order[n_test:]]
    features = ", ".join(c for c in frame.columns if c not in ("id", "target"))
    first_line = (bunch.DESCR.strip().splitlines() or [name])[0]
    description = (
        f"## Overview\n{first_line}. Predict `target` for each row of test.csv ({task_type}).\n\n"
        "## Submission format\nid,target — one row per id in test.csv.\n\n"
        f"## Data\ntrain.csv has {len(train)} rows with `target`; test.csv has {len(test)} rows. "
        f"Feature columns: {features[:400]}."
    )
    return write_task(folder, f"sklearn-{name}", task_type, description, train, test)


def generate(
    root: Path, names: tuple[str, ...] = tuple(DATASETS), seed: int = 0
) -> list[DSBenchTask]:
    return [make_task(root / name, name, seed) for name in names]
