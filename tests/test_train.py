"""Two real training steps of the 3-agent pipeline on a tiny random model."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_run_config
from safetensors.torch import load_file

from mappa.factory import load_policies
from mappa.jsonl import read_jsonl
from mappa.models.loading import load_base
from mappa.train import train
from mappa.workflow.records import read_episodes


def test_two_steps_change_each_adapter_and_not_the_base(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run")
    policies = load_policies(cfg)
    base_before = {k: v.clone() for k, v in policies.base_parameters().items()}
    names = [a.name for a in cfg.agents]
    adapters_before = {
        n: [p.detach().clone() for p in policies.adapter_parameters(n)] for n in names
    }

    start = time.monotonic()
    run_dir = train(cfg, policies)
    assert time.monotonic() - start < 60  # the acceptance bound, far above typical

    for name, tensor in policies.base_parameters().items():
        assert torch.equal(tensor, base_before[name]), f"base weight {name} changed"
    after = {n: [p.detach() for p in policies.adapter_parameters(n)] for n in names}
    for n in names:
        assert any(
            not torch.equal(a, b) for a, b in zip(after[n], adapters_before[n], strict=True)
        ), n
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert any(not torch.equal(x, y) for x, y in zip(after[a], after[b], strict=True)), (
                a,
                b,
            )

    # Outputs: one standard PEFT adapter per agent, equal to the trained weights.
    from peft import PeftModel

    for n in names:
        saved = load_file(run_dir / "adapters" / n / "adapter_model.safetensors")
        assert saved and any(t.abs().sum() > 0 for k, t in saved.items() if "lora_B" in k)
        assert json.loads((run_dir / "adapters" / n / "adapter_config.json").read_text())["r"] == 8
    ids = torch.tensor([[1, 5, 9, 12, 3]])
    for n in names:
        base, _ = load_base(str(tiny_model_dir), dtype="float32", device="cpu")
        loaded = PeftModel.from_pretrained(base, run_dir / "adapters" / n).eval()
        with torch.no_grad(), policies.use(n):
            expected = policies.model(input_ids=ids).logits
        assert torch.allclose(loaded(input_ids=ids).logits, expected, atol=1e-5), n

    episodes = read_episodes(run_dir / "episodes.jsonl")
    assert len(episodes) == 2 * 2 * 2  # steps x prompts x samples
    for ep in episodes:
        assert [a.agent for a in ep.actions][0] == "problem_solver"
        for a in ep.actions:
            assert a.coach is not None and 0.0 <= a.coach.value <= 10.0
            assert a.prompt_ids and len(a.completion_ids) == len(a.sample_logprobs) > 0
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:
        for n in names:
            assert m[f"rl/{n}/tokens"] > 0 and m[f"coach/{n}"] is not None
        assert m["rollout_tokens_per_s"] > 0 and m["mean_kl"] is not None


@pytest.mark.parametrize(
    "overrides",
    [
        ["rl.advantage=grpo", "rl.kl_in_loss=true", "rl.kl_estimator=k3"],
        ["rl.advantage=outcome_only", "rl.norm_scope=global"],
        ["rl.advantage=rloo", "rl.loss_agg=seq_mean", "rl.kl_target=0.01"],
        ["rl.norm_scope=agent_tasktype", "rl.w_outcome=1.0", "rl.clip_eps_high=0.28"],
    ],
    ids=["grpo", "outcome_only", "rloo", "mixed"],
)
def test_alternative_estimators_train_end_to_end(
    tiny_model_dir: Path, tmp_path: Path, overrides: list[str]
) -> None:
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run", "train.steps=1", *overrides)
    run_dir = train(cfg)
    [m] = read_jsonl(run_dir / "metrics.jsonl")
    for n in ("problem_solver", "code_executor", "verifier"):
        assert m[f"rl/{n}/tokens"] > 0 and math.isfinite(m[f"rl/{n}/loss"])
        assert math.isfinite(m[f"rl/{n}/entropy"]) and m[f"rl/{n}/entropy"] > 0
        assert (run_dir / "adapters" / n / "adapter_model.safetensors").is_file()
