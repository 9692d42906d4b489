"""The vLLM rollout engine (``rollout.engine: vllm``) against the trainer's own model.

Runs the real vLLM (the CPU build, ``make install-vllm``) on a tiny Llama; skipped when vLLM
is not installed. vLLM's CPU attention has no kernel for the shared tiny model's head size
(8), so these tests build the same model with 32-dimensional heads.

Tolerances: both sides compute in float32 on the CPU, but with different kernels (vLLM's
attention and LoRA kernels, its fused QKV projection), so log-probs agree to about 1e-5;
``ATOL`` leaves room for that and is still far below the change one update makes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import build_tiny_model, tiny_run_config

pytestmark = pytest.mark.integration
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make install-vllm)"
)

ATOL = 2e-4
"""Largest |vLLM - trainer| log-prob difference accepted for one token."""


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' tiny Llama and tokenizer, with 32-dimensional attention heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = build_tiny_model(tmp_path_factory.mktemp("tiny-llama-vllm"))
    config = LlamaConfig.from_pretrained(directory)
    config.head_dim = 32
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def _config(model_dir: Path, run_dir: Path, *overrides: str) -> Any:
    return tiny_run_config(
        model_dir,
        run_dir,
        "rollout.engine=vllm",
        "rollout.max_prompt_tokens=1024",
        "rollout.vllm.kv_cache_gib=0.25",
        "model.dtype=float32",
        "model.device=cpu",
        *overrides,
    )


@pytest.fixture(scope="module")
def engine_and_policies(vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A live engine serving adapters that differ from the base (LoRA B starts at zero)."""
    from mappa.factory import load_policies
    from mappa.models.vllm_engine import VllmEngine

    cfg = _config(vllm_model_dir, tmp_path_factory.mktemp("run"))
    policies = load_policies(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policies.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    engine = VllmEngine(cfg, policies.tokenizer, policies.stop_ids)
    engine.sync(policies, 0)
    yield engine, policies
    engine.close()


def _prompts(policies: Any) -> list[list[int]]:
    from mappa.workflow.chat import ChatFormat

    chat = ChatFormat(policies.tokenizer)
    texts = ["What is 2 + 3?", "Write code that prints the sum.", "Is 17 prime? Answer."]
    return [chat.first_prompt("You solve problems.", t) for t in texts]


def _trainer_logprobs(
    policies: Any,
    agent: str | None,
    prompts: list[list[int]],
    completions: list[list[int]],
    t: float,
) -> list[list[float]]:
    with torch.no_grad():
        out = policies.completion_logprobs(agent, prompts, completions, temperature=t).logprobs
    return [out[i, : len(c)].tolist() for i, c in enumerate(completions)]


def _max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(y) for y in b]
    return max(abs(x - y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True))


@needs_vllm
def test_sampled_logprobs_are_the_trainers_at_the_temperature(engine_and_policies: Any) -> None:
    engine, policies = engine_and_policies
    prompts = _prompts(policies)
    agent = policies.agents[0]
    for t in (1.0, 0.7):
        samples = engine.generate(agent, prompts, 10, temperature=t)
        assert [s.prompt_ids for s in samples] == prompts  # order kept
        comps = [s.completion_ids for s in samples]
        assert all(len(s.logprobs) == len(s.completion_ids) > 0 for s in samples)
        trainer = _trainer_logprobs(policies, agent, prompts, comps, t)
        assert _max_gap([s.logprobs for s in samples], trainer) < ATOL, t
        # Not the temperature-1 (raw) log-probs: the test can tell the two apart.
        if t != 1.0:
            raw = _trainer_logprobs(policies, agent, prompts, comps, 1.0)
            assert _max_gap([s.logprobs for s in samples], raw) > 10 * ATOL


@needs_vllm
def test_each_agent_and_the_base_are_served(engine_and_policies: Any) -> None:
    engine, policies = engine_and_policies
    prompts = _prompts(policies)
    comps = [s.completion_ids for s in policies.generate(None, prompts, 8)]
    served = {a: engine.logprobs_of(a, prompts, comps) for a in [None, *policies.agents]}
    for agent, logps in served.items():
        assert _max_gap(logps, _trainer_logprobs(policies, agent, prompts, comps, 1.0)) < ATOL
    # The adapters differ from the base and from each other, so the test above can fail.
    for agent in policies.agents:
        assert _max_gap(served[agent], served[None]) > 10 * ATOL, agent
    a, b = policies.agents[:2]
    assert _max_gap(served[a], served[b]) > 10 * ATOL


@needs_vllm
def test_greedy_stop_token_and_truncation(engine_and_policies: Any) -> None:
    engine, policies = engine_and_policies
    prompts = _prompts(policies)
    agent = policies.agents[1]
    hf = policies.generate(agent, prompts, 12, temperature=0.7, greedy=True)
    got = engine.generate(agent, prompts, 12, temperature=0.7, greedy=True)
    assert [s.completion_ids for s in got] == [s.completion_ids for s in hf]
    # Greedy log-probs are recorded at the temperature, as the hf engine records them.
    assert _max_gap([s.logprobs for s in got], [s.logprobs for s in hf]) < ATOL
    assert all(s.truncated == h.truncated for s, h in zip(got, hf, strict=True))

    # Make a token the greedy completion reaches a stop token: it ends the completion, is
    # kept in it, and the sample is not truncated; a completion without one is.
    stops = engine.stop_ids
    free = [s for s in got if s.truncated]
    assert free, "the tiny model should not stop on its own within 12 tokens"
    ids = free[0].completion_ids
    stop = ids[4]
    engine.stop_ids = [stop]
    try:
        [short] = engine.generate(agent, [free[0].prompt_ids], 12, temperature=0.7, greedy=True)
        [longer] = engine.generate(agent, [free[0].prompt_ids], 3, temperature=0.7, greedy=True)
    finally:
        engine.stop_ids = stops
    end = ids.index(stop) + 1
    assert short.completion_ids == ids[:end] and short.completion_ids[-1] == stop
    assert not short.truncated and len(short.logprobs) == end
    if stop not in ids[:3]:
        assert longer.completion_ids == ids[:3] and longer.truncated


@needs_vllm
def test_vllm_engine_trains_two_steps_and_serves_each_update(
    vllm_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acceptance: ``rollout.engine: vllm`` trains end to end; the actions trained are the
    very samples vLLM returned; after step 0's update the engine's log-probs of a fixed
    completion are the trainer's (and differ from before the update)."""
    from mappa.jsonl import read_jsonl
    from mappa.models import vllm_engine
    from mappa.train import train
    from mappa.workflow.records import read_episodes

    sampled: list[tuple[list[int], list[int], list[float]]] = []
    after_update: dict[str, tuple[list[float], list[float], list[float]]] = {}

    class RecordingEngine(vllm_engine.VllmEngine):
        """The real engine; records what it returned and checks each sync it receives."""

        def generate(self, *args: Any, **kwargs: Any) -> Any:
            samples = super().generate(*args, **kwargs)
            sampled.extend((s.prompt_ids, s.completion_ids, s.logprobs) for s in samples)
            return samples

        def sync(self, source: Any, step: int) -> None:
            if step != 1:  # step 1's adapters: those after step 0's update
                super().sync(source, step)
                return
            tok = source.tokenizer
            prompt = _prompts(source)[:1]
            completion = [tok.encode(" 2 + 3 = 5", add_special_tokens=False) + [tok.eos_token_id]]
            before = {a: self.logprobs_of(a, prompt, completion)[0] for a in source.agents}
            super().sync(source, step)
            for a in source.agents:
                served = self.logprobs_of(a, prompt, completion)[0]
                [trainer] = _trainer_logprobs(source, a, prompt, completion, 1.0)
                after_update[a] = (before[a], served, trainer)

    monkeypatch.setattr(vllm_engine, "VllmEngine", RecordingEngine)
    cfg = _config(vllm_model_dir, tmp_path / "run")
    run_dir = train(cfg)

    episodes = read_episodes(run_dir / "episodes.jsonl")
    assert len(episodes) == 2 * 2 * 2  # steps x prompts x samples
    actions = [a for ep in episodes for a in ep.actions]
    assert actions and len(actions) == len(sampled)
    recorded = {(tuple(a.prompt_ids), tuple(a.completion_ids)): a for a in actions}
    for prompt, completion, logps in sampled:
        action = recorded[(tuple(prompt), tuple(completion))]
        assert action.sample_logprobs == pytest.approx(logps, abs=1e-6)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:  # the trainer recomputes what vLLM recorded for every trained token
        assert all(m[f"rl/{a.name}/tokens"] > 0 for a in cfg.agents)
        assert m["rl/logprob_gap_max"] < ATOL

    assert set(after_update) == {a.name for a in cfg.agents}
    for agent, (before, served, trainer) in after_update.items():
        assert max(abs(x - y) for x, y in zip(served, trainer, strict=True)) < ATOL, agent
        assert max(abs(x - y) for x, y in zip(before, served, strict=True)) > 10 * ATOL, agent


def test_check_refuses_the_vllm_engine_without_vllm(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mappa.config import ConfigError
    from mappa.factory import check

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "vllm" else find_spec(name, *a),
    )
    with pytest.raises(ConfigError, match=r"rollout\.engine.*make install-vllm"):
        check(_config(tiny_model_dir, tmp_path / "run"))
    check(tiny_run_config(tiny_model_dir, tmp_path / "run"))  # the hf engine needs nothing
