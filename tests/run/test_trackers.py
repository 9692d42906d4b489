"""``train.report_to``: a tiny run logs to each tracker's offline backend, for real, and a
resumed run goes on in the same tracker runs."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import tiny_run_config

from mappa.paths import fresh_run_dir_problem
from mappa.run.trackers import SAMPLE_COLUMNS, TrackerError, Trackers

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every tracker writes under ``tmp_path/trackers`` and reaches no server."""
    root = tmp_path / "trackers"
    root.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{root / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 would rather have a db
    monkeypatch.setenv("TRACKIO_DIR", str(root / "trackio"))
    return root


@pytest.mark.integration
def test_a_tiny_run_logs_to_each_offline_tracker(
    tiny_model_dir: Path, tmp_path: Path, offline: Path
) -> None:
    import mlflow

    from mappa.run.loop import train

    args = [
        "train.report_to=[wandb,mlflow,trackio]",
        "train.tracker_project=mappa-test",
        "train.sample_episodes=2",
        "train.save_every=1",
    ]
    run_dir = train(tiny_run_config(tiny_model_dir, tmp_path / "run", "train.steps=1", *args))
    ids = json.loads((run_dir / "trackers.json").read_text())
    assert set(ids) == {"wandb", "mlflow", "trackio"}
    # resumed: the second step goes to the same tracker runs
    train(tiny_run_config(tiny_model_dir, tmp_path / "run", "train.steps=2", *args), resume=run_dir)
    assert json.loads((run_dir / "trackers.json").read_text()) == ids
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == [0, 1]

    # MLflow: every step's metrics, and a sample table per step with the actions of 2 episodes
    client = mlflow.tracking.MlflowClient()
    history = client.get_metric_history(ids["mlflow"], "coach_s")
    assert [m.step for m in history] == [s["step"] for s in steps]
    assert [m.value for m in history] == pytest.approx([s["coach_s"] for s in steps])
    run = client.get_run(ids["mlflow"])
    assert run.data.params["rl.lr"] == "0.01" and run.info.run_name == run_dir.name
    table = Path(client.download_artifacts(ids["mlflow"], "samples/step_0001.json", tmp_path))
    cells = json.loads(table.read_text())
    assert cells["columns"] == SAMPLE_COLUMNS
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").open()]
    first_two = [e for e in episodes if e["step"] == 1][:2]
    assert len(cells["data"]) == sum(len(e["actions"]) for e in first_two)
    assert cells["data"][0][5] == first_two[0]["actions"][0]["completion_text"]

    # trackio: its local database holds the steps' metrics
    db = sqlite3.connect(offline / "trackio" / "mappa-test.db")
    logged = [json.loads(m) for (m,) in db.execute("select metrics from metrics order by step")]
    assert any("coach_s" in m for m in logged) and any("samples" in m for m in logged)

    # wandb (offline, a run folder per process, both of the same run id): the run files
    # name the metrics; the tables are written beside them
    wandb_runs = sorted((run_dir / "wandb").glob(f"offline-run-*-{ids['wandb']}"))
    assert len(wandb_runs) == 2
    for folder in wandb_runs:
        assert b"coach_s" in next(folder.glob("run-*.wandb")).read_bytes()
    tables = [t for f in wandb_runs for t in (f / "files/media/table").glob("samples_*.json")]
    assert len(tables) == len(steps)
    assert json.loads(tables[0].read_text())["columns"] == SAMPLE_COLUMNS


def test_a_tracker_that_cannot_start_is_one_line_naming_it_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mappa.config import load_config

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # MLflow 3 refuses the store
    cfg = load_config("configs/smoke.yaml", [f"run_dir={tmp_path}", "train.report_to=[mlflow]"])
    with pytest.raises(TrackerError) as err:
        Trackers(cfg, tmp_path)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("train.report_to: mlflow could not start (")
    assert "MLFLOW_TRACKING_URI" in str(err.value)


def test_a_tracker_that_cannot_start_stops_the_run_before_its_models_load(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trackers open before the models: a run whose tracker cannot start costs no model
    load (minutes for a large model on a GPU node)."""
    from mappa.run import loop

    def no_load(*_: object) -> None:
        raise AssertionError("the models loaded before the trackers opened")

    monkeypatch.setattr(loop, "_models", no_load)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # MLflow 3 refuses the store
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run", "train.report_to=[mlflow]")
    with pytest.raises(TrackerError, match=r"^train.report_to: mlflow could not start \("):
        loop.train(cfg)
    assert not (tmp_path / "run").exists()  # the run never started: no stub of it is left
    # a directory the user made for it stays (and the failed start leaves it fit to reuse)
    (tmp_path / "mine").mkdir()
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "mine", "train.report_to=[mlflow]")
    with pytest.raises(TrackerError):
        loop.train(cfg)
    assert (tmp_path / "mine").is_dir() and fresh_run_dir_problem(tmp_path / "mine") is None


def test_wandb_online_with_its_server_out_of_reach_is_one_line_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logged in, online mode, the server out of reach (a real closed loopback port): one
    line naming the fix in seconds, instead of wandb waiting out its 90 s init timeout."""
    import socket
    import time

    wandb = pytest.importorskip("wandb")
    from mappa.config import load_config

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    cfg = load_config("configs/smoke.yaml", [f"run_dir={tmp_path}", "train.report_to=[wandb]"])
    wandb.teardown()  # the settings are read when wandb is set up: here, with these
    start = time.monotonic()
    try:
        with pytest.raises(TrackerError) as err:
            Trackers(cfg, tmp_path)
    finally:
        wandb.teardown()
    assert time.monotonic() - start < 10
    assert str(err.value).startswith(
        "train.report_to: wandb could not start (ConnectionError: the server cannot be "
        "reached (127.0.0.1: "
    )
    assert "\n" not in str(err.value) and "WANDB_MODE=offline" in str(err.value)
