"""DSBench tasks (synthetic, scikit-learn, real folders) and submission metrics by id."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mappa.tasks.dsbench import load_task_dir
from mappa.tasks.dsbench.loader import load_task_list
from mappa.tasks.dsbench.metrics import score_submission
from mappa.tasks.dsbench.sklearn_data import DATASETS
from mappa.tasks.dsbench.sklearn_data import make_task as sklearn_task
from mappa.tasks.dsbench.spec import DSBenchTask
from mappa.tasks.dsbench.synthetic import generate, make_task

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "dsbench"


def test_synthetic_tasks_follow_the_contract(tmp_path: Path) -> None:
    tasks = generate(tmp_path / "a", per_kind=2, seed=1)
    assert sorted(t.task_type for t in tasks).count("regression") == 2 and len(tasks) == 6
    again = generate(tmp_path / "b", per_kind=2, seed=1)
    for t, u in zip(tasks, again, strict=True):
        assert Path(t.train_csv).read_text() == Path(u.train_csv).read_text()  # seeded
        train, test, ans = (pd.read_csv(p) for p in (t.train_csv, t.test_csv, t.answers_csv))
        assert "target" in train.columns and "target" not in test.columns
        assert list(ans.columns) == ["id", "target"] and set(ans["id"]) == set(test["id"])
        assert not set(train["id"]) & set(test["id"])
        assert train.isna().any().any()  # missing values to handle
        assert {"color", "region"} <= set(train.columns)
        assert load_task_dir(Path(t.train_csv).parent) == t
        assert "Submission format" in t.description
    labels = {str(v) for v in pd.read_csv(tasks[0].answers_csv)["target"]}
    assert labels == {"no", "yes"}  # string labels on even tasks


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_sklearn_tasks(tmp_path: Path, name: str) -> None:
    task = sklearn_task(tmp_path / name, name)
    assert task.task_type == DATASETS[name][1]
    test, ans = pd.read_csv(task.test_csv), pd.read_csv(task.answers_csv)
    assert len(test) == len(ans) > 30 and set(test["id"]) == set(ans["id"])


def _task(tmp_path: Path, kind: str = "binary") -> DSBenchTask:
    return make_task(tmp_path / kind, kind, seed=3)


def _submit(tmp_path: Path, frame: pd.DataFrame) -> Path:
    path = tmp_path / "submission.csv"
    frame.to_csv(path, index=False)
    return path


def test_perfect_submission_shuffled_rows_scores_by_id(tmp_path: Path) -> None:
    task = _task(tmp_path)
    ans = pd.read_csv(task.answers_csv)
    shuffled = ans.sample(frac=1.0, random_state=0)
    s = score_submission(_submit(tmp_path, shuffled), task)
    assert s.success and s.metrics["accuracy"] == 1.0 and s.metrics["f1_macro"] == 1.0
    # the reference's row-order join would have seen a shuffled file as roughly chance
    by_row = (shuffled["target"].to_numpy() == ans["target"].to_numpy()).mean()
    assert by_row < 0.8


def test_missing_extra_duplicate_and_unreadable(tmp_path: Path) -> None:
    task = _task(tmp_path)
    ans = pd.read_csv(task.answers_csv)
    s = score_submission(_submit(tmp_path, ans.iloc[5:]), task)
    assert not s.success and s.missing_ids == 5 and "5 of" in s.reason
    extra = pd.concat([ans, pd.DataFrame({"id": [1, 2], "target": ["no", "yes"]})])
    s = score_submission(_submit(tmp_path, extra), task)
    assert s.success and s.extra_ids == 2 and s.metrics["accuracy"] == 1.0
    s = score_submission(_submit(tmp_path, pd.concat([ans, ans.iloc[:1]])), task)
    assert not s.success and "repeats" in s.reason
    assert not score_submission(tmp_path / "nope.csv", task).success
    (tmp_path / "bad.csv").write_bytes(b"")
    assert "not a readable" in score_submission(tmp_path / "bad.csv", task).reason
    s = score_submission(_submit(tmp_path, ans.rename(columns={"id": "row"})), task)
    assert not s.success and "no 'id' column" in s.reason
    assert s.fair() == {"accuracy": 0.5, "f1_macro": 0.0, "f1_weighted": 0.0}


def test_constant_prediction_and_string_labels(tmp_path: Path) -> None:
    task = make_task(tmp_path / "m", "multiclass", seed=4, string_labels=True)
    ans = pd.read_csv(task.answers_csv)
    const = ans.assign(target="low")
    s = score_submission(_submit(tmp_path, const), task)
    share = float((ans["target"] == "low").mean())
    assert s.success and s.metrics["accuracy"] == pytest.approx(share)
    # macro F1 of a constant: only class "low" has F1 = 2p/(1+p), the other two 0, averaged
    assert s.metrics["f1_macro"] == pytest.approx(2 * share / (1 + share) / 3, abs=1e-9)


def test_probabilities_vs_labels(tmp_path: Path) -> None:
    task = make_task(tmp_path / "b", "binary", seed=5, string_labels=False)
    ans = pd.read_csv(task.answers_csv)
    y = ans["target"].to_numpy()
    probs = np.where(y == 1, 0.8, 0.3)
    probs[:10] = 1 - probs[:10]  # ten confident mistakes
    s = score_submission(_submit(tmp_path, ans.assign(target=probs)), task)
    assert s.success and 0.5 < s.metrics["roc_auc"] < 1.0
    assert s.metrics["accuracy"] == pytest.approx(1 - 10 / len(y))
    labels_only = score_submission(_submit(tmp_path, ans), task)
    assert "roc_auc" not in labels_only.metrics and labels_only.metrics["accuracy"] == 1.0
    mc = make_task(tmp_path / "mc", "multiclass", seed=6)
    ans = pd.read_csv(mc.answers_csv)
    onehot = pd.get_dummies(ans["target"]).astype(float)
    sub = pd.concat([ans, onehot], axis=1)
    s = score_submission(_submit(tmp_path, sub), mc)
    assert s.metrics["roc_auc"] == pytest.approx(1.0)


def test_regression_metrics_by_hand(tmp_path: Path) -> None:
    task = _task(tmp_path, "regression")
    ans = pd.read_csv(task.answers_csv)
    y = ans["target"].to_numpy(float)
    s = score_submission(_submit(tmp_path, ans.assign(target=y + 2.0)), task)
    # every prediction off by exactly 2: RMSE = MAE = 2, RMSE % range = 200 / (max - min)
    assert s.metrics["rmse"] == pytest.approx(2.0) and s.metrics["mae"] == pytest.approx(2.0)
    assert s.metrics["rmse_pct_range"] == pytest.approx(200 / (y.max() - y.min()))
    s = score_submission(_submit(tmp_path, ans.assign(target="n/a")), task)
    assert not s.success and s.fair() == {"rmse_pct_range": 50.0}


def test_real_dsbench_task_list(tmp_path: Path) -> None:
    root = tmp_path / "DSBench"
    folder = make_task(tmp_path / "src", "binary", seed=7)
    data = root / "data" / "data_resplit" / "t1"
    answers = root / "data" / "answers" / "t1"
    data.mkdir(parents=True)
    answers.mkdir(parents=True)
    for name in ("train.csv", "test.csv"):
        (data / name).write_bytes(Path(getattr(folder, name.replace(".csv", "_csv"))).read_bytes())
    (answers / "test_answer.csv").write_bytes(Path(folder.answers_csv).read_bytes())
    meta = {
        "task_id": "t1",
        "data_type": "classification",
        "train_file": "./data/DSBench/data/data_resplit/t1/train.csv",
        "test_file": "./data/DSBench/data/data_resplit/t1/test.csv",
        "answer_dir": "./data/DSBench/data/answers/t1",
    }
    missing = {**meta, "task_id": "t2", "train_file": "./data/DSBench/nowhere.csv"}
    listing = tmp_path / "tasks.json"
    listing.write_text(
        "\n".join(json.dumps({"prompt": "Kaggle text", "metadata": m}) for m in (meta, missing))
    )
    tasks, problems = load_task_list(listing, root)
    assert [t.task_id for t in tasks] == ["t1"] and problems and problems[0].startswith("t2:")
    assert score_submission(_submit(tmp_path, pd.read_csv(tasks[0].answers_csv)), tasks[0]).success
    if SHARED.is_dir():  # the shipped list parses; its CSVs are not available offline
        tasks, problems = load_task_list(SHARED / "dsbench_modeling_train.json", tmp_path)
        assert not tasks and len(problems) == 64
