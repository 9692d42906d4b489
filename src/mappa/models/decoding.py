"""Batched token-by-token decoding over a transformers causal LM: the hf engine's sampling
and the local coach's greedy writing share it.

A plain loop rather than transformers' ``generate()``: the log-probability of every token
is exactly that of the distribution it was drawn from (temperature only, no hidden top-k or
top-p warpers), and a row that has written a stop token leaves the batch (its cache rows are
dropped), so no forward pass is spent on finished rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from mappa.models.tensors import kv_cache, left_pad, with_cache


def draw(logp: torch.Tensor) -> torch.Tensor:
    """One token per row, drawn from ``exp(logp)`` by inverting its cumulative distribution.

    The same distribution ``torch.multinomial`` draws from, at a fraction of its cost on a
    CPU: a draw per decoding step over a full vocabulary is a visible share of a small
    model's step there (docs/benchmarks.md). The cumulative sum runs in float64, so even a
    token of probability 1e-12 keeps its share; a token of probability 0 is never drawn
    (``right=True``: the draw lands in the first bin whose upper edge exceeds it).

    Args:
        logp: ``(rows, vocab)`` log-probabilities, each row normalised.

    Returns:
        ``(rows,)`` token ids.
    """
    cdf = logp.double().exp().cumsum(-1)
    u = torch.rand(logp.shape[0], 1, dtype=cdf.dtype, device=cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=logp.shape[-1] - 1)


def stop_ids(model: Any, tokenizer: Any) -> set[int]:
    """The tokens that end a reply: the tokenizer's end of sequence and the model's
    generation config's (a chat model's end of turn is often only there)."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(gen_eos)
    return {i for i in ids if i is not None}


@torch.no_grad()
def decode_batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    pad_id: int,
    stop: set[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    greedy: bool = False,
) -> tuple[list[list[int]], list[list[float]]]:
    """Continue each prompt until it writes a token of ``stop`` or ``max_new_tokens``.

    Args:
        prompts: token ids, one list per row (left-padded together).
        temperature: the sampling distribution is softmax(logits / temperature); greedy
            takes its argmax, and the log-probs are of that same distribution.

    Returns:
        Per prompt, the tokens written (a stop token included where one was written) and
        each one's log-probability.
    """
    device = next(model.parameters()).device
    ids, mask, positions = left_pad(prompts, pad_id, device)
    stop_t = torch.tensor(sorted(stop), device=device)
    tokens: list[list[int]] = [[] for _ in prompts]
    logps: list[list[float]] = [[] for _ in prompts]
    live = list(range(len(prompts)))  # batch row -> prompt index
    # Prefill: only the last position's logits are needed (logits_to_keep=1); a long
    # prompt must not hold a vocabulary-sized row per token.
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    next_pos = positions[:, -1:] + 1
    for _ in range(max_new_tokens):
        logp = F.log_softmax(out.logits[:, -1, :].float() / temperature, dim=-1)
        tok = logp.argmax(-1) if greedy else draw(logp)
        tok_logp = logp.gather(-1, tok[:, None]).squeeze(-1)
        for row, (t, lp) in enumerate(zip(tok.tolist(), tok_logp.tolist(), strict=True)):
            tokens[live[row]].append(t)
            logps[live[row]].append(lp)
        going = ~torch.isin(tok, stop_t)
        if not bool(going.any()):
            break
        if not bool(going.all()):
            keep = going.nonzero().squeeze(-1)
            kv_cache(out).batch_select_indices(keep)
            live = [live[r] for r in keep.tolist()]
            tok, mask, next_pos = tok[keep], mask[keep], next_pos[keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        out = model(
            input_ids=tok[:, None],
            attention_mask=mask,
            position_ids=next_pos,
            **with_cache(kv_cache(out)),
            use_cache=True,
            logits_to_keep=1,
        )
        next_pos = next_pos + 1
    return tokens, logps
