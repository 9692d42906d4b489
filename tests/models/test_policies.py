"""AgentPolicies: completion log-probs are computed in chunks that match the unchunked
computation (values and gradients) while no ``B x T_c x V`` tensor is ever built;
checkpointing, adapter seeds and names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import lora_policies, prompts_and_completions, randomize_lora_b
from torch.utils._python_dispatch import TorchDispatchMode

from mappa.config import LoraConfig
from mappa.models import policies as policies_module
from mappa.models.hf_engine import HfEngine
from mappa.models.loading import load_base
from mappa.models.policies import LORA_TENSOR_KINDS, AgentPolicies, lora_adapter_of
from mappa.models.tensors import left_pad, token_logprobs


@pytest.fixture(scope="module")
def policies(tiny_model_dir: Path) -> AgentPolicies:
    return lora_policies(tiny_model_dir)  # type: ignore[no-any-return]


def _full_logits_reference(
    pol: AgentPolicies, agent: str, prompts: list[list[int]], completions: list[list[int]]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The unchunked computation: every position's logits, one log_softmax over all of them."""
    seqs = [p + c for p, c in zip(prompts, completions, strict=True)]
    ids, mask, pos = left_pad(seqs, pol.tokenizer.pad_token_id, pol.device)
    with pol.use(agent):
        logits = pol.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    dist = F.log_softmax(logits[:, :-1].float() / 0.7, dim=-1)
    logp = dist.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = -(dist.exp() * dist).sum(-1)
    return (
        [logp[row, -len(c) :] for row, c in enumerate(completions)],
        [ent[row, -len(c) :] for row, c in enumerate(completions)],
    )


@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunked_logprobs_match_unchunked_values_and_gradients(
    policies: AgentPolicies, with_entropy: bool
) -> None:
    prompts, completions = prompts_and_completions(len(policies.tokenizer))
    params = policies.adapter_parameters("solver")
    weights = torch.linspace(0.5, 1.5, 11)

    def run(chunk: int | None) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
        for p in params:
            p.grad = None
        if chunk is None:  # the old way: all positions' logits at once
            lp_rows, ent_rows = _full_logits_reference(policies, "solver", prompts, completions)
            logp = torch.zeros(3, 11)
            ent = torch.zeros(3, 11)
            for row, (lp, e) in enumerate(zip(lp_rows, ent_rows, strict=True)):
                logp[row, : len(lp)] = lp
                ent[row, : len(e)] = e.detach()
            entropy: torch.Tensor | None = ent if with_entropy else None
        else:
            policies.logprob_chunk_tokens = chunk
            try:
                logp, entropy = policies.completion_logprobs(
                    "solver", prompts, completions, temperature=0.7, with_entropy=with_entropy
                )
            finally:
                del policies.logprob_chunk_tokens  # back to the class default
        (logp * weights).sum().backward()
        return logp.detach(), entropy, [p.grad.clone() for p in params if p.grad is not None]

    ref_logp, ref_ent, ref_grads = run(None)
    assert len(ref_grads) == len(params) and any(g.abs().sum() > 0 for g in ref_grads)
    for chunk in (1, 3, 4096):
        logp, entropy, grads = run(chunk)
        assert logp.shape == (3, 11)
        torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=0)
        assert logp[1, 1:].abs().sum() == 0  # padding after a 1-token completion stays 0
        assert len(grads) == len(ref_grads)
        for g, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-5)
        if with_entropy:
            assert entropy is not None and ref_ent is not None
            assert not entropy.requires_grad  # a statistic: no graph kept for it
            # ~log V summed over V terms: float32 rounding is relative here
            torch.testing.assert_close(entropy, ref_ent, atol=1e-6, rtol=1e-6)
        else:
            assert entropy is None


def test_vocabulary_projection_never_sees_more_than_a_chunk(policies: AgentPolicies) -> None:
    prompts, completions = prompts_and_completions(len(policies.tokenizer))
    rows: list[int] = []
    head = policies.model.get_base_model().get_output_embeddings()
    handle = head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    policies.logprob_chunk_tokens = 4
    try:
        logp, _ = policies.completion_logprobs("solver", prompts, completions, with_entropy=True)
        logp.sum().backward()  # the backward recomputes each chunk's logits
    finally:
        handle.remove()
        del policies.logprob_chunk_tokens
    # 19 real completion tokens (padding is never projected): 4+4+4+4+3, in the forward
    # and again (in reverse) in the backward.
    assert rows == [4, 4, 4, 4, 3] + [3, 4, 4, 4, 4]


def test_reference_and_no_grad_and_empty_completions(policies: AgentPolicies) -> None:
    prompts, completions = prompts_and_completions(len(policies.tokenizer))
    with torch.no_grad():
        ref = policies.completion_logprobs(None, prompts, completions).logprobs
        mine = policies.completion_logprobs("solver", prompts, completions).logprobs
    assert not ref.requires_grad and ref.shape == mine.shape == (3, 11)
    assert not torch.allclose(ref, mine)  # adapters off vs on
    empty = policies.completion_logprobs("solver", prompts, [[], [], []], with_entropy=True)
    assert empty.logprobs.shape == (3, 0) and empty.entropy is not None
    with pytest.raises(ValueError, match="chunk_tokens"):
        token_logprobs(
            torch.nn.Linear(2, 3),
            torch.zeros(1, 2),
            torch.zeros(1, dtype=torch.long),
            chunk_tokens=0,
        )


def test_gradient_checkpointing_recomputes_layers_and_changes_no_number(
    tiny_model_dir: Path,
) -> None:
    """Same log-probs and adapter gradients with and without checkpointing; with it, each
    layer's attention runs again in the backward pass (its activations were not kept), and
    the no-grad passes (sampling) never recompute."""

    def build(checkpointing: bool) -> AgentPolicies:
        base, tok = load_base(str(tiny_model_dir), "float32", "cpu")
        torch.manual_seed(0)  # the same LoRA A initialisation in both
        pol = AgentPolicies(
            base, tok, ["solver"], LoraConfig(), gradient_checkpointing=checkpointing
        )
        return randomize_lora_b(pol)  # type: ignore[no-any-return]

    prompts, completions = prompts_and_completions(len(build(False).tokenizer))
    results = []
    for checkpointing in (False, True):
        pol = build(checkpointing)
        attention_calls: list[int] = []
        attn = pol.model.get_base_model().model.layers[0].self_attn
        handle = attn.register_forward_hook(lambda *_, calls=attention_calls: calls.append(1))
        try:
            torch.manual_seed(0)
            HfEngine(pol).generate("solver", prompts, 3)
            sampling_calls = len(attention_calls)
            lp = pol.completion_logprobs("solver", prompts, completions, 0.7).logprobs
            forward_calls = len(attention_calls)
            lp.sum().backward()
        finally:
            handle.remove()
        grads = [p.grad.clone() for p in pol.adapter_parameters("solver") if p.grad is not None]
        assert grads and any(bool(g.abs().sum() > 0) for g in grads)
        results.append((lp.detach(), grads, sampling_calls, len(attention_calls) - forward_calls))
    (lp_plain, g_plain, samp_plain, back_plain), (lp_ckpt, g_ckpt, samp_ckpt, back_ckpt) = results
    torch.testing.assert_close(lp_ckpt, lp_plain)
    for a, b in zip(g_ckpt, g_plain, strict=True):
        torch.testing.assert_close(a, b)
    assert (back_plain, back_ckpt) == (0, 1)  # recomputed once in the backward pass
    assert samp_ckpt == samp_plain  # sampling is as before


def test_checkpointing_changes_no_sampled_token_nor_no_grad_logprob(
    tiny_model_dir: Path,
) -> None:
    """Seeded samples (tokens and their log-probs) and no-grad log-probs are the same with
    and without checkpointing, and no layer is in training mode in a forward without grad:
    transformers versions that drop the KV cache of a layer in training mode (5.19, the vLLM
    venv's) would otherwise sample each token without its context. In a forward that builds
    a graph every layer is, so that one is checkpointed."""
    results = []
    for checkpointing in (False, True):
        base, tok = load_base(str(tiny_model_dir), "float32", "cpu")
        prompts, completions = prompts_and_completions(len(tok))
        torch.manual_seed(0)
        pol = randomize_lora_b(
            AgentPolicies(base, tok, ["solver"], LoraConfig(), gradient_checkpointing=checkpointing)
        )
        layers = list(pol.model.get_base_model().model.layers)
        seen: list[tuple[bool, bool]] = []  # (grad enabled, layer in training mode)
        handles = [
            layer.register_forward_pre_hook(
                lambda m, *_, seen=seen: seen.append((torch.is_grad_enabled(), m.training))
            )
            for layer in layers
        ]
        try:
            torch.manual_seed(1)
            samples = HfEngine(pol).generate("solver", prompts, 8, temperature=1.0)
            with torch.no_grad():
                no_grad = pol.completion_logprobs("solver", prompts, completions).logprobs
            graph = pol.completion_logprobs("solver", prompts, completions).logprobs
        finally:
            for handle in handles:
                handle.remove()
        assert not any(training for grad, training in seen if not grad)
        assert all(training == checkpointing for grad, training in seen if grad)
        assert not any(layer.training for layer in layers)  # back to eval after the pass
        results.append(
            ([s.completion_ids for s in samples], [s.logprobs for s in samples], no_grad, graph)
        )
    (tokens, sampled, no_grad, graph), (tokens_c, sampled_c, no_grad_c, graph_c) = results
    assert tokens_c == tokens and sum(map(len, tokens)) > len(tokens)  # more than one step
    for a, b in zip(sampled_c, sampled, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b))
    torch.testing.assert_close(no_grad_c, no_grad)
    torch.testing.assert_close(graph_c.detach(), graph.detach())


def test_each_adapter_starts_from_its_own_seed_and_leaves_the_global_rng_alone(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """An agent's initial adapter depends on (seed, agent) only, not on which agents share
    the process: a Ray trainer actor holding one agent starts where a single process holding
    all three does. Building adapters draws nothing from torch's global RNG (the sampler's),
    and the per-agent state round-trips through ``adapter_state``."""

    def build(agents: list[str], seed: int = 0) -> AgentPolicies:
        base, tok = load_base(str(tiny_model_dir), "float32", "cpu")
        return AgentPolicies(base, tok, agents, LoraConfig(), seed=seed)

    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    together = build(["solver", "coder", "checker"])
    assert torch.equal(torch.rand(3), expected_draw)

    alone = build(["checker"])
    for key, value in together.adapter_state("checker").items():
        assert torch.equal(alone.adapter_state("checker")[key], value), key
    lora_a = [k for k in together.adapter_state("solver") if "lora_A" in k]
    assert lora_a
    assert not torch.equal(
        together.adapter_state("solver")[lora_a[0]], together.adapter_state("checker")[lora_a[0]]
    )
    other_seed = build(["checker"], seed=1).adapter_state("checker")
    assert not torch.equal(other_seed[lora_a[0]], alone.adapter_state("checker")[lora_a[0]])

    together.save(tmp_path / "saved")
    shifted = {k: v + 1 for k, v in alone.adapter_state("checker").items()}
    alone.load_adapter_state("checker", shifted)
    assert all(torch.equal(alone.adapter_state("checker")[k], v) for k, v in shifted.items())
    reloaded = build(["checker"], seed=7)
    reloaded.load(tmp_path / "saved")
    for key, value in together.adapter_state("checker").items():
        assert torch.equal(reloaded.adapter_state("checker")[key], value), key
    with pytest.raises(ValueError, match="does not match"):
        reloaded.load_adapter_state("checker", {"nonsense.lora_A.weight": torch.zeros(1)})


@pytest.mark.filterwarnings("ignore:Adapter name .a. should not be contained in the prefix")
def test_adapter_parameters_are_exactly_the_agents_own_lora_tensors(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's optimizer gets its own LoRA A and B of each target module and nothing else:
    not the tensors of an agent whose name extends it (``a``/``ab``), nor, for an agent named
    like a module (``q_proj``, refused at creation but bypassed here), every agent's tensors
    of that module."""
    from peft.tuners.lora import LoraLayer

    assert set(LORA_TENSOR_KINDS) == set(LoraLayer.adapter_layer_names)
    assert lora_adapter_of("m.q_proj.lora_embedding_A.solver") == "solver"
    assert lora_adapter_of("m.q_proj.lora_magnitude_vector.solver.weight") == "solver"

    def check(agents: list[str]) -> None:
        base, tok = load_base(str(tiny_model_dir), "float32", "cpu")
        pol = AgentPolicies(base, tok, agents, LoraConfig())
        per_agent = 2 * len(LoraConfig().target_modules) * base.config.num_hidden_layers
        names = {id(p): n for n, p in pol.model.named_parameters()}
        chosen = {agent: [names[id(p)] for p in pol.adapter_parameters(agent)] for agent in agents}
        for agent, own in chosen.items():
            assert len(own) == per_agent, (agent, own)
            assert all(f".lora_A.{agent}." in n or f".lora_B.{agent}." in n for n in own), own
        assert not set(chosen[agents[0]]) & set(chosen[agents[1]])

    check(["a", "ab"])
    monkeypatch.setattr(policies_module, "check_agent_names", lambda *_: None, raising=False)
    check(["solver", "q_proj"])


def test_agents_named_like_a_module_of_the_model_or_peft_are_refused(
    tiny_model_dir: Path,
) -> None:
    """An adapter is named after its agent, so an agent may not share a name with a module of
    the base model (found from the model itself) or of PEFT; containing one is fine."""
    base, tok = load_base(str(tiny_model_dir), "float32", "cpu")
    for agent, path in [
        ("q_proj", "model.layers.0.self_attn.q_proj"),
        ("mlp", "model.layers.0.mlp"),
        ("layers", "model.layers"),
        ("embed_tokens", "model.embed_tokens"),
    ]:
        with pytest.raises(ValueError, match=rf"rename agent '{agent}'") as err:
            AgentPolicies(base, tok, ["solver", agent], LoraConfig())
        assert f"agent '{agent}' has the name of a module of the base model ({path})" in str(
            err.value
        )
    for agent in ["base_layer", "default", "lora_dropout"]:
        with pytest.raises(ValueError, match=rf"PEFT uses this name.*rename agent '{agent}'"):
            AgentPolicies(base, tok, ["solver", agent], LoraConfig())
    pol = AgentPolicies(base, tok, ["q_proj_agent", "solver"], LoraConfig())
    assert len(pol.adapter_parameters("q_proj_agent")) == len(pol.adapter_parameters("solver"))


def test_saving_adapters_asks_the_hub_nothing(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the base named by a Hub id and the network cut (every name lookup and
    connection refused at the socket), a save makes no connection attempt and takes no Hub
    timeout, and the adapter still names its base as the user does."""
    import json
    import socket
    import time
    import warnings

    base, tok = load_base(str(tiny_model_dir), "float32", "cpu")
    pol = AgentPolicies(base, tok, ["solver", "checker"], LoraConfig(), base_name="Qwen/Qwen3-4B")
    attempts: list[object] = []

    def refuse(*args: object) -> None:
        attempts.append(args[-1])
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # offline mode would hide a lookup
    start = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PEFT warns when its Hub lookup fails
        saved = pol.save(tmp_path / "adapters")
    assert attempts == [] and time.monotonic() - start < 10
    for agent, path in saved.items():
        config = json.loads((path / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == "Qwen/Qwen3-4B", agent
        assert (path / "adapter_model.safetensors").is_file()


class _Float32TokenMatmuls(TorchDispatchMode):
    """Counts the matrix products with a float32 input of ``tokens`` rows (one per token of
    the batch): the LoRA matmuls PEFT runs in its float32 adapter weights on a bf16 model."""

    MATMULS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.linear.default"}

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens
        self.hits: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if str(func) in self.MATMULS:
            for a in args:
                if (
                    isinstance(a, torch.Tensor)
                    and a.dtype == torch.float32
                    and a.dim() >= 2
                    and a.reshape(-1, a.shape[-1]).shape[0] == self.tokens
                ):
                    self.hits.append(str(func))
                    break
        return func(*args, **(kwargs or {}))


def test_a_bf16_model_runs_no_token_sized_float32_matmul_in_its_logprob_pass(
    tiny_model_dir: Path,
) -> None:
    """PEFT keeps LoRA weights in float32 (Adam's precision) and casts each layer's input up
    to them: without autocast every adapted projection of a bf16 model multiplies all the
    batch's tokens in float32, several times slower on a GPU than bf16."""
    base, tok = load_base(str(tiny_model_dir), "bfloat16", "cpu")
    pol = randomize_lora_b(AgentPolicies(base, tok, ["solver"], LoraConfig(), seed=1))
    assert {p.dtype for p in pol.adapter_parameters("solver")} == {torch.float32}
    prompts, completions = prompts_and_completions(len(tok))
    tokens = len(prompts) * max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    counter = _Float32TokenMatmuls(tokens)
    with torch.no_grad(), counter:
        out = pol.completion_logprobs("solver", prompts, completions)
    assert counter.hits == []
    assert torch.isfinite(out.logprobs).all()


def test_a_lora_target_the_model_lacks_is_one_line_naming_its_layers(
    tiny_model_dir: Path,
) -> None:
    """Not a PEFT traceback after the load: the missing names and the linear layers there
    are; dotted suffixes and ``all-linear`` pass, as PEFT matches them."""
    from mappa.config import ConfigError

    base, tok = load_base(str(tiny_model_dir), "float32", "cpu")
    with pytest.raises(ConfigError) as err:
        AgentPolicies(base, tok, ["solver"], LoraConfig(target_modules=["q_proj", "foo"]))
    message = str(err.value)
    assert message.startswith("model.lora.target_modules: foo not in this model; its linear")
    assert "q_proj" in message and "\n" not in message
    for ok in (["self_attn.q_proj"], ["all-linear"]):
        policies_module.check_target_modules(base, ok)
