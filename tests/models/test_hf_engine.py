"""The hf rollout engine: the prefill projects only the last position onto the vocabulary,
finished rows leave the batch without changing any sample, ``sync`` accepts only the
trainer's own adapters, and ``logprobs_of`` (the sync probe's view) scores with the weights
``generate`` samples from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import lora_policies, prompts_and_completions

from mappa.models.hf_engine import HfEngine
from mappa.models.policies import AgentPolicies


@pytest.fixture(scope="module")
def policies(tiny_model_dir: Path) -> AgentPolicies:
    return lora_policies(tiny_model_dir)  # type: ignore[no-any-return]


def test_prefill_projects_only_the_last_position(policies: AgentPolicies) -> None:
    calls: list[tuple[int, Any, tuple[int, ...]]] = []

    def record(module: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        calls.append((kwargs["input_ids"].shape[1], kwargs.get("logits_to_keep"), out.logits.shape))

    prompts, _ = prompts_and_completions(len(policies.tokenizer))
    prompts = [p * 20 for p in prompts]  # a long-ish prompt: the prefill sees up to 240 tokens
    causal_lm = policies.model.get_base_model()
    handle = causal_lm.register_forward_hook(record, with_kwargs=True)
    try:
        torch.manual_seed(0)
        HfEngine(policies).generate("solver", prompts, max_new_tokens=3)
    finally:
        handle.remove()
    assert calls[0][0] == 240  # the prefill ...
    assert all(keep == 1 for _, keep, _ in calls)  # ... and every step ask for one position
    assert all(shape == (3, 1, len(policies.tokenizer)) for _, _, shape in calls)


def test_finished_rows_leave_the_batch_without_changing_any_sample(
    policies: AgentPolicies,
) -> None:
    """Greedy, a batch of three sorted by length, one row stopping early: every row's tokens
    and log-probs equal those generated alone, and the steps after the stop run on two rows."""
    prompts, _ = prompts_and_completions(len(policies.tokenizer))
    engine = HfEngine(policies)
    saved_stop = policies.stop_ids
    try:
        policies.stop_ids = set()  # first, the unstopped greedy continuations
        alone = [engine.generate("solver", [p], 8, 0.7, greedy=True)[0] for p in prompts]
        stop_token = alone[1].completion_ids[2]  # the second prompt stops at its third token
        policies.stop_ids = {stop_token}
        expected = [s.completion_ids for s in alone]
        expected = [
            ids[: ids.index(stop_token) + 1] if stop_token in ids else ids for ids in expected
        ]
        assert any(len(e) == 8 for e in expected) and len(expected[1]) <= 3

        batch_rows: list[int] = []
        causal_lm = policies.model.get_base_model()
        handle = causal_lm.register_forward_hook(
            lambda m, a, kw, o: batch_rows.append(kw["input_ids"].shape[0]), with_kwargs=True
        )
        try:
            batched = engine.generate("solver", prompts, 8, 0.7, batch_size=8, greedy=True)
        finally:
            handle.remove()
    finally:
        policies.stop_ids = saved_stop
    assert [s.completion_ids for s in batched] == expected
    for b, a, e in zip(batched, alone, expected, strict=True):
        assert b.prompt_ids == a.prompt_ids
        assert b.truncated == (e[-1] != stop_token)
        torch.testing.assert_close(
            torch.tensor(b.logprobs), torch.tensor(a.logprobs[: len(e)]), atol=1e-5, rtol=0
        )
    assert batch_rows[0] == 3 and batch_rows[-1] < 3  # the finished row left the batch


def test_sync_takes_only_the_trainers_own_adapters(policies: AgentPolicies) -> None:
    engine = HfEngine(policies)
    assert engine.name == "hf" and engine.shares_trainer
    engine.sync(policies, 1)  # nothing to publish
    with pytest.raises(ValueError, match="its trainer's own adapters"):
        engine.sync(object(), 1)


def test_logprobs_of_scores_with_the_weights_generate_samples(policies: AgentPolicies) -> None:
    """The sync probe's view of the engine: its log-probs of a sampled completion are those
    the sampler recorded, and the trainer's; another agent's adapter gives others."""
    engine = HfEngine(policies)
    prompts, _ = prompts_and_completions(len(policies.tokenizer))
    torch.manual_seed(0)
    samples = engine.generate("solver", prompts, max_new_tokens=6)
    completions = [s.completion_ids for s in samples]
    scored = engine.logprobs_of("solver", prompts, completions)
    with torch.no_grad():
        trained = policies.completion_logprobs("solver", prompts, completions).logprobs
    for s, got, want in zip(samples, scored, trained, strict=True):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(s.logprobs), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(got), want[: len(got)], atol=1e-5, rtol=0)
    other = engine.logprobs_of("checker", prompts, completions)
    pairs = zip(other, scored, strict=True)
    assert max(abs(a - b) for x, y in pairs for a, b in zip(x, y, strict=True)) > 1e-3
