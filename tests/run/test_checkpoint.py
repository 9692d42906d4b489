"""Checkpoints and resume (``mappa.run.checkpoint``): real processes killed with SIGKILL at a
named point (the test-only ``MAPPA_TEST_PAUSE`` hook) resume to the uninterrupted run's
metrics, with no torn line and no duplicate step in the records."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import tiny_run_config

from mappa.cli import main
from mappa.jsonl import read_jsonl
from mappa.provenance import CODE_LOG, run_code, source_revision
from mappa.run import checkpoint
from mappa.run.checkpoint import config_differences, latest_checkpoint

AGENTS = ("problem_solver", "code_executor", "verifier")
STEPS = 4
# Compared per step between an interrupted-and-resumed run and an uninterrupted one.
KEYS = (
    "accuracy",
    "kl_beta",
    "mean_kl",
    "lr",
    "eval/accuracy",
    *(f"coach/{a}" for a in AGENTS),
    *(f"rl/{a}/{k}" for a in AGENTS for k in ("loss", "grad_norm", "tokens", "mean_reward")),
    *(f"coach_health/{a}/{k}" for a in AGENTS for k in ("spread", "no_signal_streak")),
)


def _config(model_dir: Path, run_dir: Path, path: Path, *overrides: str) -> Path:
    cfg = tiny_run_config(
        model_dir, run_dir, f"train.steps={STEPS}", "eval.every=2", "eval.num_tasks=2", *overrides
    )
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return path


def _check_records(run_dir: Path) -> list[dict[str, Any]]:
    """No torn line, one metrics line per step in order, episodes of exactly those steps."""
    for name in ("episodes.jsonl", "metrics.jsonl", "heldout_episodes.jsonl"):
        text = (run_dir / name).read_text()
        assert text.endswith("\n"), name
        for line in text.splitlines():
            json.loads(line)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(len(metrics)))
    steps = [e["step"] for e in read_jsonl(run_dir / "episodes.jsonl")]
    assert steps == sorted(steps) and set(steps) == set(range(len(metrics)))
    heldout = [e["step"] for e in read_jsonl(run_dir / "heldout_episodes.jsonl")]
    assert set(heldout) == {m["step"] for m in metrics if "eval/accuracy" in m}
    assert heldout == sorted(heldout) and len(heldout) == 2 * len(set(heldout))
    return metrics


def _completions(path: Path) -> list[list[list[int]]]:
    return [[a["completion_ids"] for a in e["actions"]] for e in read_jsonl(path)]


def _same_metrics(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for key in KEYS:
            if w.get(key) is None:
                assert g.get(key) is None, (g["step"], key)
            else:
                assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-7), (g["step"], key)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run (checkpoint every 2 steps), in this process."""
    tmp = tmp_path_factory.mktemp("reference")
    config = _config(tiny_model_dir, tmp / "run", tmp / "c.yaml", "train.save_every=2")
    assert main(["train", "--config", str(config)]) == 0
    run_dir = tmp / "run"
    return {
        "metrics": _check_records(run_dir),
        "episodes": _completions(run_dir / "episodes.jsonl"),
        "heldout": _completions(run_dir / "heldout_episodes.jsonl"),
    }


@pytest.mark.integration
@pytest.mark.parametrize(
    ("pause", "lost_from"),
    [("rollout@3", 2), ("update@3", 2), ("checkpoint@4", 2)],
    ids=["rollout", "update", "checkpoint-write"],
)
def test_sigkill_then_resume_reproduces_the_uninterrupted_run(
    tiny_model_dir: Path,
    tmp_path: Path,
    reference: dict[str, Any],
    pause: str,
    lost_from: int,
) -> None:
    run_dir = tmp_path / "run"
    config = _config(tiny_model_dir, run_dir, tmp_path / "c.yaml", "train.save_every=2")
    marker = tmp_path / "paused"
    env = {
        **os.environ,
        "MAPPA_TEST_PAUSE": pause,
        "MAPPA_TEST_PAUSE_FILE": str(marker),
        # The reference ran in this process: a float sum over another thread count is
        # another number (a loss near 0 moves by a fifth).
        "OMP_NUM_THREADS": str(torch.get_num_threads()),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "mappa.cli", "train", "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "the run never reached the pause point"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None and ckpt.name == f"step-{lost_from:06d}"
    assert json.loads((run_dir / "adapters" / "step.json").read_text()) == {"step": lost_from}
    with (run_dir / "metrics.jsonl").open("a") as fh:  # as if killed mid-append, too
        fh.write('{"step": 99, "tor')

    assert main(["train", "--resume", str(run_dir)]) == 0
    _same_metrics(_check_records(run_dir), reference["metrics"])
    assert _completions(run_dir / "episodes.jsonl") == reference["episodes"]
    assert _completions(run_dir / "heldout_episodes.jsonl") == reference["heldout"]
    assert json.loads((run_dir / "adapters" / "step.json").read_text()) == {"step": STEPS}
    assert [d.name for d in (run_dir / "checkpoints").iterdir()] == [f"step-{STEPS:06d}"]
    noted = read_jsonl(run_dir / CODE_LOG)  # the first start and the resume, same code
    assert [row["from_step"] for row in noted] == [0, lost_from]
    assert run_code(run_dir) == source_revision()


@pytest.mark.integration
def test_a_run_stopped_after_n_steps_is_the_same_run_and_resumes_to_its_end(
    tiny_model_dir: Path, tmp_path: Path, reference: dict[str, Any]
) -> None:
    """``--stop-after``: the steps done are the uninterrupted run's (its learning-rate
    schedule spans all the steps), checkpointed there, and a resume finishes that run."""
    run_dir = tmp_path / "run"
    config = _config(tiny_model_dir, run_dir, tmp_path / "c.yaml", "train.save_every=2")
    assert main(["train", "--config", str(config), "--stop-after", "3"]) == 0
    _same_metrics(_check_records(run_dir), reference["metrics"][:3])
    assert latest_checkpoint(run_dir).name == "step-000003"  # type: ignore[union-attr]
    assert main(["train", "--resume", str(run_dir)]) == 0
    _same_metrics(_check_records(run_dir), reference["metrics"])
    assert _completions(run_dir / "episodes.jsonl") == reference["episodes"]


@pytest.mark.integration
def test_resume_refuses_a_different_config_and_extends_steps(
    tiny_model_dir: Path,
    tmp_path: Path,
    reference: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_dir = tmp_path / "run"
    config = _config(tiny_model_dir, run_dir, tmp_path / "c.yaml", "train.steps=2")
    assert main(["train", "--config", str(config)]) == 0
    capsys.readouterr()
    args = ["train", "--resume", str(run_dir)]
    assert main([*args, "rl.lr=0.5", "seed=3"]) == 2
    err = capsys.readouterr().err
    assert "rl.lr (0.01 -> 0.5)" in err and "seed (0 -> 3)" in err and "train.steps (" not in err
    bare = tmp_path / "killed-before-its-first-checkpoint"
    bare.mkdir()
    (bare / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    assert main(["train", "--resume", str(bare)]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err
    damaged = tmp_path / "damaged"
    shutil.copytree(run_dir, damaged, symlinks=True)
    state = latest_checkpoint(damaged) / "state.pt"  # type: ignore[operator]
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # a copy cut short
    assert main(["train", "--resume", str(damaged)]) == 2
    err = capsys.readouterr().err
    assert str(state) in err and "damaged" in err and len(err.strip().splitlines()) == 1

    # Extended to 4 steps: steps 0-1 ran on a 2-step lr schedule, so only the sampling and
    # the coach of step 0-1 match the 4-step reference; the run goes on from its checkpoint.
    assert main([*args, f"train.steps={STEPS}"]) == 0
    metrics = _check_records(run_dir)
    assert len(metrics) == STEPS
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["steps"] == STEPS
    _same_metrics(metrics[:1], reference["metrics"][:1])


def test_a_run_saved_before_a_key_existed_resumes_under_its_default(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A key added after the run started reads as its default (what the run did); set to
    anything else it is a difference, unless resumable."""
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run")
    saved = cfg.model_dump(mode="json")
    del saved["coach"]["local"]["engine"], saved["train"]["tensorboard"], saved["tasks"]["seed"]
    assert config_differences(saved, cfg) == []
    pinned = tiny_run_config(tiny_model_dir, tmp_path / "run", "tasks.seed=5")
    assert config_differences(saved, pinned) == ["tasks.seed"]  # other problems: not a resume
    assert config_differences(saved, cfg.model_copy(update={"seed": cfg.seed + 1})) == ["seed"]
    other = tiny_run_config(tiny_model_dir, tmp_path / "run", "coach.local.engine=hf")
    assert config_differences(saved, other) == ["coach.local.engine"]
    quiet = tiny_run_config(tiny_model_dir, tmp_path / "run", "train.tensorboard=false")
    assert config_differences(saved, quiet) == []  # resumable: computes nothing


def _checkpoints(run_dir: Path, steps: tuple[int, ...] = (1, 2)) -> Path:
    """Complete checkpoints of ``steps`` (small files, their checksums recorded); returns
    the checkpoints' directory."""
    root = run_dir / "checkpoints"
    for step in steps:
        ckpt = root / f"step-{step:06d}"
        (ckpt / "adapters").mkdir(parents=True)
        (ckpt / "state.pt").write_bytes(b"state" * 100)
        (ckpt / "adapters" / "weights").write_bytes(b"w" * 10)
        meta = {"step": step, "offsets": {}, "sha256": checkpoint._digests(ckpt)}
        (ckpt / "checkpoint.json").write_text(json.dumps(meta))
    return root


def test_a_damaged_checkpoint_falls_back_to_an_intact_older_one(tmp_path: Path) -> None:
    """Checksums recorded at save: a file cut short or missing is named; an older intact
    checkpoint, where one is kept, is used instead; a checkpoint from before checksums
    were recorded is taken as it is."""
    root = _checkpoints(tmp_path)
    assert checkpoint.resumable_checkpoint(tmp_path).name == "step-000002"
    newest = root / "step-000002"
    (newest / "adapters" / "weights").unlink()
    assert checkpoint.damage(newest) == f"{newest / 'adapters' / 'weights'} is missing"
    assert checkpoint.resumable_checkpoint(tmp_path).name == "step-000001"
    oldest = root / "step-000001" / "state.pt"
    oldest.write_bytes(b"state" * 50)
    assert checkpoint.damage(oldest.parent) == (
        f"{oldest} is not the file that was written (its sha256 differs)"
    )
    with pytest.raises(ValueError, match=r"weights is missing: .* older ones are damaged too"):
        checkpoint.resumable_checkpoint(tmp_path)
    meta = json.loads((newest / "checkpoint.json").read_text())
    (newest / "checkpoint.json").write_text(json.dumps({**meta, "sha256": None}))
    assert checkpoint.resumable_checkpoint(tmp_path) == newest  # older format: no check


def test_an_unreadable_checkpoint_record_is_a_damaged_checkpoint(tmp_path: Path) -> None:
    """A ``checkpoint.json`` cut short is named like any damaged file: an older intact
    checkpoint is used, else one line naming the file and how to start again; the hint
    after a failed step says so rather than failing on it."""
    root = _checkpoints(tmp_path)
    record = root / "step-000002" / "checkpoint.json"
    record.write_text("{broken\n")
    problem = f"{record} is not the record that was written (no JSON with a step)"
    assert checkpoint.damage(record.parent) == problem
    assert checkpoint.resumable_checkpoint(tmp_path).name == "step-000001"
    assert checkpoint.checkpoint_step(checkpoint.resumable_checkpoint(tmp_path)) == 1
    shutil.rmtree(root / "step-000001")
    restart = f"start the run again (`mappa train --config {tmp_path / 'config.yaml'} run_dir="
    with pytest.raises(ValueError) as err:
        checkpoint.resumable_checkpoint(tmp_path)
    assert str(err.value) == (
        f"{problem}: the checkpoint is damaged and no older one is kept; {restart}<a new dir>`)"
    )
    assert checkpoint.resume_hint(tmp_path).startswith(
        f"The newest checkpoint is damaged ({problem})"
    )


def test_a_run_without_a_checkpoint_says_to_start_it_again(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        checkpoint.resumable_checkpoint(tmp_path)
    assert str(err.value) == (
        f"{tmp_path}: no complete checkpoint to resume from; start the run again (`mappa train "
        f"--config {tmp_path / 'config.yaml'} run_dir=<a new dir>`)"
    )
