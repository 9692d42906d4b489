"""The vLLM rollout engine (``rollout.engine: vllm``) against the trainer's own model, and
the local coach scoring on it (``coach.local.engine``) against the hf scorer.

Runs the real vLLM (the CPU build, ``make install-vllm``) on a tiny Llama; skipped when vLLM
is not installed. vLLM's CPU attention has no kernel for the shared tiny model's head size
(8), so these tests build the same model with 32-dimensional heads.

Tolerances: both sides compute in float32 on the CPU, but with different kernels (vLLM's
attention and LoRA kernels, its fused QKV projection), so log-probs agree to about 1e-5;
``ATOL`` leaves room for that and is still far below the change one update makes.
``SCORE_RTOL`` is the same allowance for the coach's probabilities (relative, as they are
exp(log-prob)).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import build_tiny_model, tiny_run_config

from mappa.models.hf_engine import HfEngine
from mappa.workflow.team import chat_messages

pytestmark = pytest.mark.integration
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make install-vllm)"
)

ATOL = 2e-4
"""Largest |vLLM - trainer| log-prob difference accepted for one token."""

BF16_GAP = 0.05
"""Largest |vLLM - trainer| log-prob gap accepted in bfloat16, where both round every
activation to 8 bits of mantissa in different kernels."""

AGENTS = ("problem_solver", "code_executor", "verifier")

SCORE_RTOL = 2e-4
"""Largest relative |vLLM - hf| difference accepted for one probability of P(0..10)."""


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
    from mappa.models.vllm_engine import VllmEngine
    from mappa.run.build import load_policies

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
    return [chat.prompt(chat_messages("You solve problems.", t)) for t in texts]


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
    comps = [s.completion_ids for s in HfEngine(policies).generate(None, prompts, 8)]
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
    hf = HfEngine(policies).generate(agent, prompts, 12, temperature=0.7, greedy=True)
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
    """Acceptance: ``rollout.engine: vllm`` trains end to end, the local coach scoring on the
    engine; the actions trained are the very samples vLLM returned; after step 0's update the
    engine's log-probs of a fixed completion are the trainer's (and differ from before the
    update)."""
    from mappa.jsonl import read_jsonl
    from mappa.models import vllm_engine
    from mappa.records import read_episodes
    from mappa.run.loop import train

    sampled: list[tuple[list[int], list[int], list[float]]] = []
    calls: list[str] = []  # release and sync, in order
    after_update: dict[str, tuple[list[float], list[float], list[float]]] = {}

    class RecordingEngine(vllm_engine.VllmEngine):
        """The real engine; records what it returned and checks each sync it receives."""

        def generate(self, *args: Any, **kwargs: Any) -> Any:
            samples = super().generate(*args, **kwargs)
            sampled.extend((s.prompt_ids, s.completion_ids, s.logprobs) for s in samples)
            return samples

        def release(self) -> None:
            calls.append("release")
            super().release()

        def sync(self, source: Any, step: int) -> None:
            calls.append(f"sync {step}")
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

    scored: list[int] = []

    class RecordingScores(vllm_engine.VllmScoreDistribution):
        """The real vLLM coach scorer; counts the actions it scored."""

        def __call__(self, conversations: Any, prefix: str) -> list[list[float]]:
            probs = super().__call__(conversations, prefix)
            scored.append(len(probs))
            return probs

    monkeypatch.setattr(vllm_engine, "VllmEngine", RecordingEngine)
    monkeypatch.setattr(vllm_engine, "VllmScoreDistribution", RecordingScores)
    cfg = _config(vllm_model_dir, tmp_path / "run")
    assert cfg.coach.local.engine == "auto"
    run_dir = train(cfg)

    # The engine may free its memory for each update, and the next sync follows it.
    assert calls == ["sync 0", "release", "sync 1", "release", "sync 2"]
    episodes = read_episodes(run_dir / "episodes.jsonl")
    assert len(episodes) == 2 * 2 * 2  # steps x prompts x samples
    actions = [a for ep in episodes for a in ep.actions]
    assert actions and len(actions) == len(sampled)
    # The local coach scored every action on the engine (auto: the policy base, vLLM rollout).
    assert sum(scored) == len(actions)
    assert all(a.coach is not None and not a.coach.flagged for a in actions)
    recorded = {(tuple(a.prompt_ids), tuple(a.completion_ids)): a for a in actions}
    for prompt, completion, logps in sampled:
        action = recorded[(tuple(prompt), tuple(completion))]
        assert action.sample_logprobs == pytest.approx(logps, abs=1e-6)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:  # the trainer recomputes what vLLM recorded for every trained token
        assert all(m[f"rl/{a.name}/tokens"] > 0 for a in cfg.agents)
        assert m["rl/logprob_gap_max"] < ATOL
        assert all(0 <= m[f"sync/{a.name}/probe_gap"] < ATOL for a in cfg.agents)  # the probe

    assert set(after_update) == {a.name for a in cfg.agents}
    for agent, (before, served, trainer) in after_update.items():
        assert max(abs(x - y) for x, y in zip(served, trainer, strict=True)) < ATOL, agent
        assert max(abs(x - y) for x, y in zip(before, served, strict=True)) > 10 * ATOL, agent


@needs_vllm
def test_a_skipped_sync_stops_the_run_naming_the_agent_and_engine(
    vllm_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine whose sync after an update stamps the step but reloads nothing (it keeps
    serving the adapters of the first sync): the probe after step 0's update stops the run,
    naming the agent and the engine (the acceptance run above, with the sync, passes)."""
    from mappa.models import vllm_engine
    from mappa.models.sync_probe import StaleAdapterError
    from mappa.run.loop import train

    class SkippingEngine(vllm_engine.VllmEngine):
        def sync(self, source: Any, step: int) -> None:
            if step == 0:
                super().sync(source, step)
            else:
                self.wake()
                self.version = step  # the stamp a version check would trust

    monkeypatch.setattr(vllm_engine, "VllmEngine", SkippingEngine)
    with pytest.raises(StaleAdapterError) as err:
        train(_config(vllm_model_dir, tmp_path / "run", "train.steps=1"))
    message = str(err.value)
    assert message.startswith(
        "stale adapter for agent 'problem_solver' on the vllm engine: before step 1's rollout"
    )
    assert "rollout.sync_tolerance" in message


@needs_vllm
def test_vllm_engine_trains_in_the_shipped_default_dtype(
    vllm_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``model.dtype: auto``, the shipped configs' setting (bfloat16 on a CPU with bfloat16
    instructions, else float32): vLLM loads the base in the dtype the trainer picked and the
    run trains; the update recomputes the old log-probs (vLLM is not the trainer), and their
    gap to vLLM's stays within the rounding of that dtype."""
    from mappa.jsonl import read_jsonl
    from mappa.models.loading import resolve_dtype
    from mappa.run.loop import train

    picked = resolve_dtype("auto", torch.device("cpu"))
    caplog.set_level(logging.INFO, logger="mappa.models.loading")
    run_dir = train(_config(vllm_model_dir, tmp_path / "run", "model.dtype=auto"))
    chosen = [r.getMessage() for r in caplog.records if "model.dtype auto" in r.getMessage()]
    assert len(chosen) >= 2 and all(str(picked) in m for m in chosen)  # trainer and engine
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    tolerance = BF16_GAP if picked == torch.bfloat16 else ATOL
    for m in metrics:
        assert all(m[f"rl/{a}/tokens"] > 0 and m[f"rl/{a}/grad_norm"] > 0 for a in AGENTS)
        assert 0 <= m["rl/logprob_gap_max"] < tolerance


@pytest.fixture(scope="module")
def sharp_model_dir(vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vLLM test model with its matrices redrawn larger, as tests/coach/test_coach_local.py
    does: at the default init the next token hardly depends on the context, so a score read
    at the wrong position or after a leaked token would still pass."""
    import shutil

    from transformers import LlamaForCausalLM

    directory = tmp_path_factory.mktemp("tiny-llama-vllm-sharp")
    shutil.copytree(vllm_model_dir, directory, dirs_exist_ok=True)
    model = LlamaForCausalLM.from_pretrained(vllm_model_dir)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    model.save_pretrained(directory)
    return directory


def _coach_contexts() -> list[Any]:
    """Demo-like coach contexts: each MathChat agent, short to long outputs (one past a
    vLLM KV block of its own), a tool observation, and the final agent with the reference."""
    from dataclasses import replace

    from mappa.coach.context import CoachContext

    base = CoachContext("What is 12 + 30?", "", "", 0, "", "", None, False, None)
    base = replace(base, output_limit=12, task_type="arithmetic")
    solver = "We add 12 and 30 step by step. " * 3
    return [
        replace(
            base,
            agent="problem_solver",
            role="solve",
            agent_input="Problem: 12 + 30",
            output=solver,
        ),
        replace(
            base,
            agent="problem_solver",
            role="solve",
            agent_input="Problem: 12 + 30",
            output=solver * 6,
            truncated=True,
        ),
        replace(
            base,
            agent="code_executor",
            role="code",
            agent_input=f"wrote: {solver}",
            output="```python\nprint(12 + 30)\n```",
            observation="42\n",
        ),
        replace(
            base,
            agent="code_executor",
            role="code",
            turn=1,
            agent_input="output 42",
            output="The result is 42.",
        ),
        replace(
            base,
            agent="verifier",
            role="check",
            agent_input="The result is 42.",
            output="\\boxed{42}",
            is_final=True,
            ground_truth="42",
        ),
        replace(
            base,
            agent="verifier",
            role="check",
            agent_input="The result is 41.",
            output="\\boxed{41}",
            is_final=True,
            ground_truth="42",
        ),
    ]


@needs_vllm
def test_local_coach_on_the_engine_reads_the_hf_scorers_distribution(
    sharp_model_dir: Path, tmp_path: Path
) -> None:
    """``coach.local.engine``: the vLLM scorer (one batched call on the engine's base, prefix
    cached) gives the hf scorer's P(0..10) on the same model and contexts, for either guess
    of the "1" token (one rides along, the other takes the extra request), and the same
    coach scores."""
    from mappa.coach.local import SCORE_PREFIX
    from mappa.coach.templates import render_messages
    from mappa.models.scorer import ScoreDistributionModel
    from mappa.models.vllm_engine import VllmScoreDistribution
    from mappa.run.build import load_policies, make_coach, make_engine
    from mappa.run.preflight import coach_template

    cfg = _config(sharp_model_dir, tmp_path / "run")
    policies = load_policies(cfg)
    engine = make_engine(cfg, policies)
    try:
        coach: Any = make_coach(cfg, policies, engine)  # auto: on the engine
        hf_cfg = _config(sharp_model_dir, tmp_path / "run", "coach.local.engine=hf")
        hf_coach: Any = make_coach(hf_cfg, policies, engine)
        assert isinstance(coach.distribution, VllmScoreDistribution)
        assert isinstance(hf_coach.distribution, ScoreDistributionModel)
        # Coach prompts may be longer than the rollout's max_prompt_tokens + max_new_tokens:
        # the engine holds the model's context when the coach scores on it.
        assert engine.max_model_len == 4096
        assert engine.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching

        contexts = _coach_contexts()
        conversations = [render_messages(coach_template(cfg), c) for c in contexts]
        want = hf_coach.distribution(conversations, SCORE_PREFIX)
        dist = coach.distribution
        tokens = dist.tokens(SCORE_PREFIX)
        assert len(tokens.scores[1]) == 2  # "1" and " 1": the guess can be wrong here
        for guess in tokens.scores[1]:
            dist._tokens[SCORE_PREFIX] = dataclasses.replace(tokens, one_guess=guess)
            got = dist(conversations, SCORE_PREFIX)
            for g, w in zip(got, want, strict=True):
                assert len(g) == 11
                assert torch.allclose(torch.tensor(g), torch.tensor(w), rtol=SCORE_RTOL, atol=1e-9)
                assert 0.0 < sum(g) < 0.9  # over the full vocabulary, not the digits alone
        # Different actions get different distributions: the contexts are really read.
        assert max(abs(a - b) for a, b in zip(got[-1], got[-2], strict=True)) > 1e-3
        assert dist([], SCORE_PREFIX) == []

        scores, hf_scores = coach.score(contexts), hf_coach.score(contexts)
        for s, h in zip(scores, hf_scores, strict=True):
            assert not s.flagged and s.backend == "local"
            assert abs(s.value - h.value) < 1e-3
    finally:
        engine.close()


def test_coach_engine_choice_and_impossible_combinations(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``auto`` scores on the vLLM engine only for the policy base with a vLLM rollout;
    ``vllm`` elsewhere is refused when the config loads, or (no engine built, as in
    ``mappa coach-check``) when the coach is built; ``auto`` then falls back to hf."""
    from mappa.config import ConfigError
    from mappa.run.build import coach_on_engine, make_coach

    run = tmp_path / "run"
    assert coach_on_engine(_config(tiny_model_dir, run))
    assert not coach_on_engine(_config(tiny_model_dir, run, "coach.local.engine=hf"))
    assert not coach_on_engine(_config(tiny_model_dir, run, f"coach.local.model_path={run}"))
    assert not coach_on_engine(tiny_run_config(tiny_model_dir, run))  # the hf rollout
    http = _config(tiny_model_dir, run, "coach.backend=http", "coach.local.engine=vllm")
    assert not coach_on_engine(http)  # the local settings do not apply
    with pytest.raises(ConfigError, match=r"coach\.local\.engine.*rollout\.engine: vllm"):
        tiny_run_config(tiny_model_dir, run, "coach.local.engine=vllm")
    with pytest.raises(ConfigError, match=r"coach\.local\.engine.*policy base only"):
        _config(tiny_model_dir, run, "coach.local.engine=vllm", f"coach.local.model_path={run}")
    with pytest.raises(ValueError, match=r"coach\.local\.engine.*does not start"):
        make_coach(_config(tiny_model_dir, run, "coach.local.engine=vllm"), None)
    with pytest.raises(ValueError, match="needs the policy model"):  # auto: hf, no engine
        make_coach(_config(tiny_model_dir, run), None)


def test_check_refuses_the_vllm_engine_without_vllm(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mappa.config import ConfigError
    from mappa.run.preflight import check

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "vllm" else find_spec(name, *a),
    )
    with pytest.raises(ConfigError, match=r"rollout\.engine.*make install-vllm"):
        check(_config(tiny_model_dir, tmp_path / "run"))
    check(tiny_run_config(tiny_model_dir, tmp_path / "run"))  # the hf engine needs nothing


@needs_vllm
def test_sleep_during_update_is_refused_where_vllm_has_no_sleep_mode(
    vllm_model_dir: Path, tmp_path: Path
) -> None:
    """The CPU build has no sleep mode: ``true`` stops before an engine starts, naming the
    key; ``null`` (the default) resolves to off there."""
    from mappa.models.vllm_engine import VllmEngine, _sleep_during_update

    assert _sleep_during_update(None) is False
    assert _sleep_during_update(False) is False
    cfg = _config(vllm_model_dir, tmp_path / "run", "rollout.vllm.sleep_during_update=true")
    with pytest.raises(ValueError, match=r"rollout\.vllm\.sleep_during_update.*no sleep mode"):
        VllmEngine(cfg, object(), stop_ids=[0])


class FakeLLM:
    """The fake of ``vllm.LLM``: records the LoRA adapters added and removed."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.llm_engine = self
        self.loras: dict[int, Any] = {}

    def add_lora(self, request: Any) -> bool:
        self.loras[request.lora_int_id] = request
        return True

    def remove_lora(self, lora_id: int) -> None:
        del self.loras[lora_id]


@dataclasses.dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


class FakeOneAgentSource:
    """The fake of one Ray engine actor's policies (``cluster.engines: per_agent``): the
    tokenizer, stop tokens and the adapter of its one agent only."""

    def __init__(self, agent: str) -> None:
        self.agents = [agent]
        self.tokenizer = dataclasses.make_dataclass("Tok", [("eos_token_id", int)])(0)
        self.stop_ids = [0]

    def save(self, directory: Path) -> dict[str, Path]:
        (directory / self.agents[0]).mkdir(parents=True)
        return {self.agents[0]: directory / self.agents[0]}


def test_a_one_agent_vllm_engine_syncs_its_agent_only(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A per-agent engine actor holds one agent's adapter: the engine it builds serves that
    agent, not every agent of the config (whose sync would find the others missing). The
    vLLM library is replaced by fakes, so this runs without vLLM."""
    import sys
    import types

    from mappa.run import build

    fake = {
        "vllm": types.SimpleNamespace(LLM=FakeLLM),
        "vllm.lora": types.SimpleNamespace(),
        "vllm.lora.request": types.SimpleNamespace(LoRARequest=FakeLoRARequest),
        "vllm.platforms": types.SimpleNamespace(
            current_platform=types.SimpleNamespace(is_sleep_mode_available=lambda: False)
        ),
        "vllm.v1.sample.logits_processor": types.SimpleNamespace(AdapterLogitsProcessor=object),
    }
    for name, module in fake.items():
        monkeypatch.setitem(sys.modules, name, module)
    cfg = _config(tiny_model_dir, tmp_path / "run")
    assert len(cfg.agents) > 1
    engine: Any = build.make_engine(cfg, FakeOneAgentSource("verifier"))  # type: ignore[arg-type]
    try:
        assert engine.agents == ["verifier"]
        assert engine.llm.kwargs["max_loras"] == 1
        assert [r.lora_name for r in engine.llm.loras.values()] == ["verifier@0"]
        engine.sync(FakeOneAgentSource("verifier"), 1)
        assert [r.lora_name for r in engine.llm.loras.values()] == ["verifier@1"]
    finally:
        engine.__dict__.pop("llm")  # nothing to shut down
        engine.close()
