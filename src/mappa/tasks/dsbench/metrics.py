"""Score a submission.csv against held-out answers, joined by id.

The reference code compared rows in file order, so a shuffled but correct submission
scored as noise; here rows are matched by id. Success means a valid submission that covers
every test id. "Fair" metrics count a failed run as accuracy 0.5, F1 0 and RMSE 50 % of the
target range, so success rate and quality can be averaged over all runs honestly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from mappa.tasks.dsbench.spec import DSBenchTask


@dataclass
class SubmissionScore:
    """The outcome of one run's submission."""

    task_type: str
    success: bool
    reason: str = ""  # why it failed, for the report and the coach
    missing_ids: int = 0
    extra_ids: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    def fair(self) -> dict[str, float]:
        """Metrics with a failed run counted as chance/worst (docs/design.md §1)."""
        if self.success:
            return dict(self.metrics)
        if self.task_type == "classification":
            return {"accuracy": 0.5, "f1_macro": 0.0, "f1_weighted": 0.0}
        return {"rmse_pct_range": 50.0}

    def summary(self) -> str:
        """One line for the Analyst's coach context."""
        if not self.success:
            return f"no valid submission: {self.reason}"
        return ", ".join(f"{k}={v:.4g}" for k, v in self.metrics.items())


def _target_column(answers: pd.DataFrame, task: DSBenchTask) -> str:
    if task.target_column in answers.columns:
        return task.target_column
    others = [c for c in answers.columns if c != task.id_column]
    if len(others) != 1:
        raise ValueError(f"{task.answers_csv}: cannot tell the target column among {others}")
    return others[0]


def _norm_label(values: pd.Series) -> pd.Series:
    """Labels compared as text, so 1, 1.0 and "1" agree and "yes" stays "yes"."""

    def one(v: object) -> str:
        if isinstance(v, float) and v.is_integer():
            return str(int(v))
        return str(v).strip()

    return values.map(one)


def score_submission(submission: Path, task: DSBenchTask) -> SubmissionScore:
    """Validate and score ``submission`` for ``task`` (never raises for a bad submission)."""

    def fail(reason: str, missing_ids: int = 0, extra_ids: int = 0) -> SubmissionScore:
        return SubmissionScore(task.task_type, False, reason, missing_ids, extra_ids)

    if submission.is_symlink():  # planted by sandboxed code: never follow it on the host
        return fail("submission.csv is a symlink, not a file")
    if not submission.is_file():
        return fail("submission.csv was not written")
    try:
        sub = pd.read_csv(submission)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        return fail(f"submission.csv is not a readable CSV: {err}")
    answers = pd.read_csv(task.answers_csv)
    target = _target_column(answers, task)
    if task.id_column not in sub.columns:
        return fail(
            f"submission.csv has no {task.id_column!r} column (columns: {list(sub.columns)[:8]})"
        )
    if sub[task.id_column].duplicated().any():
        return fail("submission.csv repeats some ids")
    sub_ids, ans_ids = set(sub[task.id_column]), set(answers[task.id_column])
    missing, extra = len(ans_ids - sub_ids), len(sub_ids - ans_ids)
    if missing:
        return fail(
            f"{missing} of {len(ans_ids)} test ids have no prediction",
            missing_ids=missing,
            extra_ids=extra,
        )
    pred_cols = [c for c in sub.columns if c != task.id_column]
    if not pred_cols:
        return fail("submission.csv has no prediction column")
    merged = answers.merge(sub, on=task.id_column, how="left", suffixes=("", "_pred"))
    pred_col = f"{target}_pred" if f"{target}_pred" in merged.columns else pred_cols[0]
    if merged[pred_col].isna().any():
        return fail("some predictions are empty", extra_ids=extra)
    if task.task_type == "regression":
        metrics = _regression(merged[target].to_numpy(float), merged[pred_col])
        if metrics is None:
            return fail("regression predictions are not numeric", extra_ids=extra)
    else:
        metrics = _classification(merged, target, pred_col, [c for c in pred_cols if c != pred_col])
    return SubmissionScore(task.task_type, True, extra_ids=extra, metrics=metrics)


def _regression(y: np.ndarray, pred: pd.Series) -> dict[str, float] | None:
    p = pd.to_numeric(pred, errors="coerce").to_numpy(float)
    if np.isnan(p).any():
        return None
    rmse = math.sqrt(float(np.mean((y - p) ** 2)))
    span = float(y.max() - y.min()) or 1.0
    iqr = float(np.subtract(*np.percentile(y, [75, 25]))) or 1.0
    return {
        "rmse": rmse,
        "mae": float(np.mean(np.abs(y - p))),
        "rmse_pct_range": 100 * rmse / span,
        "rmse_pct_iqr": 100 * rmse / iqr,
    }


def _classification(
    merged: pd.DataFrame, target: str, pred_col: str, extra_cols: list[str]
) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score, roc_auc_score

    y = _norm_label(merged[target])
    labels = sorted(set(y))
    raw = merged[pred_col]
    numeric = pd.to_numeric(raw, errors="coerce")
    probabilities = None
    if labels == ["0", "1"] and numeric.notna().all() and ((numeric % 1) != 0).any():
        probabilities = numeric.to_numpy(float)  # P(class 1) in the prediction column
        pred = pd.Series(np.where(probabilities >= 0.5, "1", "0"))
    else:
        pred = _norm_label(raw)
    out = {
        "accuracy": float(accuracy_score(y, pred)),
        "f1_macro": float(f1_score(y, pred, average="macro", labels=labels, zero_division=0)),
        "f1_weighted": float(f1_score(y, pred, average="weighted", labels=labels, zero_division=0)),
    }
    class_cols = [c for c in extra_cols if _norm_label(pd.Series([c]))[0] in labels]
    try:
        if probabilities is not None and len(labels) == 2:
            out["roc_auc"] = float(roc_auc_score(y.astype(int), probabilities))
        elif len(class_cols) == len(labels) >= 2:  # one probability column per class
            order = sorted(class_cols, key=lambda c: labels.index(_norm_label(pd.Series([c]))[0]))
            probs = merged[order].to_numpy(float)
            if len(labels) == 2:
                out["roc_auc"] = float(roc_auc_score((y == labels[1]).astype(int), probs[:, 1]))
            else:
                out["roc_auc"] = float(
                    roc_auc_score(
                        y, probs / probs.sum(1, keepdims=True), multi_class="ovr", labels=labels
                    )
                )
    except ValueError:
        pass  # a single class in the answers: AUC undefined, leave it out
    return out
