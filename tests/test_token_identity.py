"""Token-in, token-out: what is trained on is exactly what was sampled.

Covers the reference code's fault (1): for an agent's 2nd action the training prompt must
be the real context (first prompt + sampled completion + tool turn), not a fragment.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from conftest import tiny_run_config

from mappa.config import RLConfig
from mappa.models.interface import Sample
from mappa.models.loading import load_base
from mappa.models.policies import AgentPolicies
from mappa.rl.update import build_batch, compute_advantages, policy_step, reference_logprobs
from mappa.tasks import Task
from mappa.train import build_runner
from mappa.workflow.chat import ChatFormat
from mappa.workflow.records import Score


class FakeScriptedPolicy:
    """Fake policy: answers each agent's n-th call with a scripted text; records its inputs."""

    def __init__(self, chat: ChatFormat, eos_id: int, scripts: dict[str, list[str]]) -> None:
        self.chat, self.eos_id, self.scripts = chat, eos_id, scripts
        self.calls: dict[str, int] = {}
        self.seen: list[tuple[str, list[list[int]]]] = []

    def generate(
        self,
        agent: str | None,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        batch_size: int = 8,
        greedy: bool = False,
    ) -> list[Sample]:
        assert agent is not None
        n = self.calls.get(agent, 0)
        self.calls[agent] = n + 1
        self.seen.append((agent, [list(p) for p in prompts]))
        ids = self.chat.encode(self.scripts[agent][n]) + [self.eos_id]
        return [Sample(list(p), list(ids), [-0.5] * len(ids), False) for p in prompts]


class RecordingPolicy:
    """Delegates to real policies and records every (agent, prompt, completion) it scores."""

    def __init__(self, inner: AgentPolicies) -> None:
        self.inner = inner
        self.calls: list[tuple[str | None, list[list[int]], list[list[int]]]] = []

    def completion_logprobs(
        self,
        agent,
        prompt_ids,
        completion_ids,
        temperature=1.0,  # type: ignore[no-untyped-def]
        with_entropy=False,
    ):
        self.calls.append((agent, [list(p) for p in prompt_ids], [list(c) for c in completion_ids]))
        return self.inner.completion_logprobs(
            agent, prompt_ids, completion_ids, temperature, with_entropy
        )


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> AgentPolicies:
    base, tok = load_base(str(tiny_model_dir), dtype="float32", device="cpu")
    cfg = tiny_run_config(tiny_model_dir, Path("unused"))
    return AgentPolicies(base, tok, [a.name for a in cfg.agents], cfg.model.lora)


def test_tool_loop_second_prompt_is_real_context_and_is_trained_on(
    tiny_model_dir: Path, tiny: AgentPolicies, tmp_path: Path
) -> None:
    cfg = tiny_run_config(tiny_model_dir, tmp_path)
    chat = ChatFormat(tiny.tokenizer)
    fake = FakeScriptedPolicy(
        chat,
        tiny.tokenizer.eos_token_id,
        {
            "problem_solver": ["12 + 5 = 17"],
            "code_executor": ["```python\nprint(12 + 5)\n```", "The code printed 17."],
            "verifier": ["The answer is \\boxed{17}."],
        },
    )
    runner = build_runner(cfg, tiny, tmp_path / "ws")
    runner.policy = fake
    tasks = [Task("t0", "Ava has 12 apples and gets 5 more. How many?", "17")] * 2
    episodes = runner.run(tasks)

    for ep in episodes:
        assert ep.correct is True and ep.final_answer == "17"
        first, second = ep.agent_actions("code_executor")
        assert first.tool_observation == "17" and second.tool_observation is None
        tool_turn = chat.tool_turn(cfg.workflow.tool_turn_template.format(observation="17"), True)
        assert second.prompt_ids == first.prompt_ids + first.completion_ids + tool_turn
        assert "Code output:" in second.prompt_text and "print(12 + 5)" in second.prompt_text
        verifier = ep.agent_actions("verifier")[0]
        assert "The code printed 17." in verifier.prompt_text and "17" in verifier.prompt_text
    # The policy was asked to continue exactly from the recorded prompts.
    executor_calls = [prompts for agent, prompts in fake.seen if agent == "code_executor"]
    assert executor_calls[1] == [ep.agent_actions("code_executor")[1].prompt_ids for ep in episodes]

    # The update trains on exactly those ids, both for the reference and the policy pass.
    items = [(ep, a) for ep in episodes for a in ep.agent_actions("code_executor")]
    for (_, a), v in zip(items, [8.0, 2.0, 6.0, 4.0], strict=True):
        a.coach = Score(v)
        a.sample_logprobs = (
            tiny.completion_logprobs(  # a real old policy for the ratio
                "code_executor", [a.prompt_ids], [a.completion_ids]
            )
            .logprobs[0, : len(a.completion_ids)]
            .tolist()
        )
    actions = [a for _, a in items]
    rl = RLConfig(micro_batch_size=8)
    recorder = RecordingPolicy(tiny)
    batch = build_batch(items, rl)
    ref = reference_logprobs(recorder, batch.actions, batch.old.shape[1], 8, 1.0)
    adv, _, _ = compute_advantages(batch, ref, rl, beta=0.01)
    params = tiny.adapter_parameters("code_executor")
    stats = policy_step(
        recorder,
        "code_executor",
        batch,
        adv,
        ref,
        torch.optim.Adam(params, lr=1e-3),
        params,
        rl,
        beta=0.01,
    )
    assert stats.tokens == sum(len(a.completion_ids) for a in actions)
    assert [c[0] for c in recorder.calls] == [None, "code_executor"]
    for _, prompts, completions in recorder.calls:
        assert prompts == [a.prompt_ids for a in actions]
        assert completions == [a.completion_ids for a in actions]


def test_sampling_logprobs_match_training_logprobs_across_a_tool_turn(tiny: AgentPolicies) -> None:
    chat = ChatFormat(tiny.tokenizer)
    torch.manual_seed(0)
    prompts = [
        chat.first_prompt("You are the Code Executor.", f"Compute {i} + 5.") for i in range(3)
    ]
    first = tiny.generate("code_executor", prompts, max_new_tokens=10)
    second_prompts = [
        s.prompt_ids + s.completion_ids + chat.tool_turn("Code output:\n17", not s.truncated)
        for s in first
    ]
    second = tiny.generate("code_executor", second_prompts, max_new_tokens=10)
    for batch in (first, second):
        lp = tiny.completion_logprobs(
            "code_executor", [s.prompt_ids for s in batch], [s.completion_ids for s in batch]
        ).logprobs
        for row, s in enumerate(batch):
            got = lp[row, : len(s.completion_ids)]
            assert torch.allclose(got, torch.tensor(s.logprobs), atol=1e-4)
    assert all(len(s.prompt_ids) > len(p) for s, p in zip(second, prompts, strict=True))
