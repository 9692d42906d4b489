"""examples/solver_critic: a team that is not a pipeline trains end to end through
`mappa train --config`, every agent's actions scored by the coach and trained."""

from __future__ import annotations

from pathlib import Path

import pytest

from mappa.jsonl import read_jsonl
from mappa.records import read_episodes

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "solver_critic"


@pytest.mark.integration
def test_the_solver_critic_example_trains_every_agent_one_step(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mappa.cli import main

    monkeypatch.chdir(tmp_path)  # its module and coach template are found beside the config
    run_dir = tmp_path / "run"
    overrides = [
        f"model.path={tiny_model_dir}",
        "model.dtype=float32",
        f"run_dir={run_dir}",
        "rollout.max_new_tokens=12",
        "rollout.max_prompt_tokens=4096",
        "train.steps=1",
        "train.prompts_per_step=2",
        "train.samples_per_prompt=2",
        "tasks.num_tasks=8",
        "eval.num_tasks=2",
        "eval.at_start=false",
        "coach.cache.mode=off",
        "coach.local.min_digit_mass=0",
        "rl.min_reward_spread=0",
        "rl.lr=0.01",
    ]
    assert main(["train", "--config", str(EXAMPLE / "config.yaml"), *overrides]) == 0

    episodes = read_episodes(run_dir / "episodes.jsonl")
    assert len(episodes) == 4 and all(e.error is None for e in episodes)
    for ep in episodes:
        # a random model never opens with ACCEPT: every episode runs its three rounds
        assert [(a.agent, a.turn) for a in ep.actions] == [
            ("solver", 0),
            ("critic", 0),
            ("solver", 1),
            ("critic", 1),
            ("solver", 2),
            ("critic", 2),
            ("solver", 3),
        ]
        for a in ep.actions:
            assert a.coach is not None and 0.0 <= a.coach.value <= 10.0
            assert a.prompt_ids and len(a.completion_ids) == len(a.sample_logprobs) > 0
    [metrics] = read_jsonl(run_dir / "metrics.jsonl")
    for agent, actions in (("critic", 12), ("solver", 16)):
        assert metrics[f"actions/{agent}"] == actions
        assert metrics[f"coach/{agent}"] is not None
        assert metrics[f"rl/{agent}/steps"] > 0 and not metrics[f"rl/{agent}/skipped"]
    assert (run_dir / "adapters" / "critic").is_dir() and (run_dir / "adapters" / "solver").is_dir()
