"""A local model's probability distribution over the scores 0..10 after a prefix.

Digits are read at the position after the prefix, summing the probability of each digit
with and without a leading space. "10" starts like "1", so one more forward step splits the
mass of "1" into 1 and 10 by the probability of a following "0".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from mappa.models.policies import left_pad


def _single_token_ids(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids if len(ids) == 1 else []


class ScoreDistributionModel:
    """Implements ``mappa.coach.local.ScoreDistribution`` with a causal LM."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        batch_size: int = 4,
        activate: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.activate = activate  # e.g. "adapters off" when the coach shares the policy base
        self.digit_ids = [
            _single_token_ids(tokenizer, str(d)) + _single_token_ids(tokenizer, f" {d}")
            for d in range(10)
        ]
        if not all(self.digit_ids):
            raise ValueError("tokenizer has no single-token digits; cannot read a score")
        self.zero_ids = self.digit_ids[0]
        self.device = next(model.parameters()).device

    def _score_probs(self, seqs: list[list[int]]) -> torch.Tensor:
        """P(0..10) per sequence: one pass over the prompts, one cached step for "10"."""
        ids, mask, pos = left_pad(seqs, self.tokenizer.pad_token_id, self.device)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        probs = F.softmax(out.logits[:, -1, :].float(), dim=-1)
        digit = torch.stack([probs[:, i].sum(-1) for i in self.digit_ids], dim=1)
        # Split P("1") into 1 and 10 by P("0" | prefix + the likelier "1" token).
        one = torch.tensor(self.digit_ids[1], device=probs.device)
        best_one = one[probs[:, one].argmax(-1)]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        after = self.model(
            input_ids=best_one[:, None],
            attention_mask=mask,
            position_ids=pos[:, -1:] + 1,
            cache=out.cache,
            use_cache=True,
        )
        p_zero = F.softmax(after.logits[:, -1, :].float(), dim=-1)[:, self.zero_ids].sum(-1)
        p10 = digit[:, 1] * p_zero
        digit[:, 1] = digit[:, 1] - p10
        return torch.cat([digit, p10[:, None]], dim=1).cpu()

    @torch.no_grad()
    def __call__(
        self, conversations: Sequence[list[dict[str, str]]], prefix: str
    ) -> list[list[float]]:
        prompts = [
            self.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
            + prefix
            for c in conversations
        ]
        seqs = [list(self.tokenizer.encode(p, add_special_tokens=False)) for p in prompts]
        result: list[list[float]] = []
        with self.activate():
            for i in tqdm(range(0, len(seqs), self.batch_size), desc="coach", leave=False):
                result.extend(self._score_probs(seqs[i : i + self.batch_size]).tolist())
        return result
