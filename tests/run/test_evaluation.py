"""Evaluation plumbing: a code run's status, then `mappa eval` and the held-out eval of
training on the tiny random model (seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import tiny_run_config

from mappa.cli import main
from mappa.config import RunConfig
from mappa.jsonl import read_jsonl
from mappa.provenance import environment, source_revision
from mappa.records import read_episodes
from mappa.run.loop import train
from mappa.sandbox import ExecutionResult, Status
from mappa.sandbox.limits import LimitName
from mappa.workflow.code_runs import tool_status

AGENTS = ("problem_solver", "code_executor", "verifier")


def _result(status: Status, limit: LimitName | None = None) -> ExecutionResult:
    return ExecutionResult(status, 0, "", "", 0.1, limit=limit)


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        ([_result("ok"), _result("ok")], "ok"),
        ([_result("ok"), _result("error")], "error"),
        ([_result("error", "memory"), _result("timeout", "wall_time")], "limit"),
        ([_result("timeout", "wall_time")], "timeout"),
        ([_result("killed", "output")], "limit"),
        ([_result("killed")], "error"),  # a crash (segfault) names no limit
    ],
)
def test_tool_status_comes_from_the_sandbox_result(
    results: list[ExecutionResult], expected: str
) -> None:
    assert tool_status(results) == expected


def _config_file(cfg: RunConfig, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return path


def test_mappa_eval_writes_eval_json_with_all_metrics(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config_file(tiny_run_config(tiny_model_dir, tmp_path / "run"), tmp_path / "c.yaml")
    out = tmp_path / "eval"
    args = ["eval", "--config", str(config), "--out", str(out), "eval.num_tasks=3"]
    assert main([*args, "--samples", "2"]) == 2  # k > 1 needs a temperature
    assert "temperature > 0" in capsys.readouterr().err

    assert main([*args, "--samples", "2", "--temperature", "1.0"]) == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["tasks"] == 3 and result["samples"] == 2 and result["temperature"] == 1.0
    for key in ("accuracy", "avg@2", "pass@2", "graded", "wall_s"):
        assert key in result, key
    assert 0.0 <= result["avg@2"] <= result["pass@2"] <= 1.0
    for agent in AGENTS:
        for metric in ("response_tokens", "truncation_rate", "format_rate"):
            assert result[f"{metric}/{agent}"] is not None, (metric, agent)
    assert 0.0 <= result["tool_call_rate/code_executor"] <= 1.0
    assert "exec_error_rate/code_executor" in result
    assert (result["code"], result["environment"]) == (source_revision(), environment())
    assert [len(t["predictions"]) for t in result["per_task"]] == [2, 2, 2]
    episodes = read_episodes(out / "eval_episodes.jsonl")
    assert len(episodes) == 6 and {e.task_id for e in episodes} == {
        t["task_id"] for t in result["per_task"]
    }
    assert "pass@2" in capsys.readouterr().out


def test_overlapping_eval_set_stops_unless_allowed(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_file, eval_file = tmp_path / "train.json", tmp_path / "eval.json"
    train_file.write_text(
        json.dumps(
            [
                {"id": "tr-1", "prompt": "What is 2 + 2?", "answer": 4},
                {"id": "tr-2", "prompt": "What is 3 + 5?", "answer": 8},
                {"id": "tr-3", "prompt": "What is 9 - 4?", "answer": 5},
            ]
        )
    )
    eval_file.write_text(
        json.dumps(
            [
                {"id": "ev-1", "prompt": "what is 3+5 ?", "answer": 8},  # tr-2, reformatted
                {"id": "ev-2", "prompt": "What is 7 * 6?", "answer": 42},
                {"id": "ev-3", "prompt": "What is 9 - 4?", "answer": 5},  # tr-3
            ]
        )
    )
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run", f"tasks.source={train_file}")
    args = [
        "eval",
        "--config",
        str(_config_file(cfg, tmp_path / "c.yaml")),
        "--tasks",
        str(eval_file),
        "--out",
        str(tmp_path / "out"),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "2 problem(s)" in err and "ev-1 (= train tr-2)" in err and "ev-3 (= train tr-3)" in err
    assert not (tmp_path / "out" / "eval.json").exists()  # stopped before any model loaded

    assert main([*args, "--allow-overlap"]) == 0
    assert json.loads((tmp_path / "out" / "eval.json").read_text())["tasks"] == 3


def test_the_untrained_team_is_evaluated_first_with_eval_at_start(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``eval.at_start``: the held-out set before the first update, on step 0's line as
    ``eval_start/...`` and as step -1 episodes; the summary compares it with the last
    evaluation. A resumed run does not evaluate the start again."""
    from mappa.report.summary import run_summary

    args = ["train.save_every=1", "eval.every=2", "eval.at_start=true", "eval.num_tasks=2"]
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run", "train.steps=1", *args)
    run_dir = train(cfg)
    held = run_dir / "heldout_episodes.jsonl"
    [line] = read_jsonl(run_dir / "metrics.jsonl")
    assert line["step"] == 0 and line["eval_start/tasks"] == 2 and line["eval_start/graded"] == 2
    assert 0.0 <= line["eval_start/accuracy"] <= 1.0 and line["eval_start_s"] > 0
    assert "eval/accuracy" in line  # the last step is evaluated too
    assert [e.step for e in read_episodes(held)] == [-1, -1, 0, 0]
    names = [a.name for a in cfg.agents]
    assert "held-out accuracy, untrained -> after step 0: " in run_summary(run_dir, names)
    longer = tiny_run_config(tiny_model_dir, tmp_path / "run", "train.steps=2", *args)
    train(longer, resume=run_dir)
    lines = read_jsonl(run_dir / "metrics.jsonl")
    assert ["eval_start/accuracy" in m for m in lines] == [True, False]
    assert [e.step for e in read_episodes(held)] == [-1, -1, 0, 0, 1, 1]


def test_training_logs_held_out_metrics_every_eval_every_steps(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = tiny_run_config(
        tiny_model_dir,
        tmp_path / "run",
        "train.steps=3",
        "eval.every=2",
        "eval.num_tasks=2",
    )
    run_dir = train(cfg)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [("eval/accuracy" in m) for m in metrics] == [False, True, True]  # every 2, and the last
    for m in metrics:
        assert 0.0 <= m["tool_call_rate/code_executor"] <= 1.0  # this step's rollouts
        assert all(m[f"coach/{a}"] is not None for a in AGENTS)
    for m in metrics[1:]:
        assert 0.0 <= m["eval/accuracy"] <= 1.0 and m["eval/tasks"] == 2
        assert "eval/tool_call_rate/code_executor" in m and "eval/format_rate/verifier" in m
    held = read_episodes(run_dir / "heldout_episodes.jsonl")
    assert [e.step for e in held] == [1, 1, 2, 2]
    train_prompts = {e.task for e in read_episodes(run_dir / "episodes.jsonl")}
    assert not train_prompts & {e.task for e in held}  # held out means held out
