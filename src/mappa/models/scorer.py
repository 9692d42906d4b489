"""A local model's probability distribution over the scores 0..10 after a prefix.

Scores are read where the model would write the score's digit after the prefix, summing
the probability of every token that spells each of 0..10. Where "10" is "1" + "0", the mass
of "1" is split into 1 and 10 by the probability of a following "0". Which tokens, where,
and the split are shared with the other scorers (``mappa.models.score_tokens``).

Every coach prompt of a call starts with the same system text, often half of its tokens. So
the tokens all prompts share are run once and their KV cache is expanded over each batch;
only the rest (the suffix) is computed per action, in batches of similar length sized by
tokens. A guessed "1" token rides along at the end of each suffix, so P("0" | "1") comes out
of the same forward; only rows whose likelier "1" token is the other one need an extra step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from mappa.models.batching import token_batches
from mappa.models.decoding import decode_batch, stop_ids
from mappa.models.score_tokens import ScoreTokens, score_prompt_ids, score_tokens, split_ten
from mappa.models.tensors import kv_cache, left_pad, with_cache


def common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix every sequence shares.

    Measured on tokens, not on the rendered text: BPE may merge the last characters the
    texts share with the first ones that differ, so the tokens of a common text prefix are
    not always a prefix of every tokenized prompt.
    """
    first, n = seqs[0], min(len(s) for s in seqs)
    for s in seqs[1:]:
        n = next((i for i in range(n) if s[i] != first[i]), n)
    return n


class ScoreDistributionModel:
    """Implements ``mappa.coach.local.ScoreDistribution`` with a causal LM."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        batch_size: int = 64,
        batch_tokens: int = 4096,
        activate: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.batch_tokens = batch_tokens
        self.activate = activate  # e.g. "adapters off" when the coach shares the policy base
        self.device = next(model.parameters()).device
        self.stop = stop_ids(model, tokenizer)
        self._tokens: dict[str, ScoreTokens] = {}

    def tokens(self, prefix: str) -> ScoreTokens:
        """The score's tokens after ``prefix`` (found once per prefix)."""
        if prefix not in self._tokens:
            self._tokens[prefix] = score_tokens(self.tokenizer, prefix)
        return self._tokens[prefix]

    def write(self, conversations: Sequence[list[dict[str, str]]], max_tokens: int) -> list[str]:
        """The coach's greedy reply to each conversation, ``max_tokens`` at most, written
        together in batches of ``batch_size`` (the ``mappa.coach.self_solve.Writer`` the
        self-solving coach uses): a decode step costs about as much for a batch as for one
        row on a CPU, so the tasks of a step are solved at once."""
        prompts = [
            list(
                self.tokenizer.encode(
                    self.tokenizer.apply_chat_template(
                        c, tokenize=False, add_generation_prompt=True
                    ),
                    add_special_tokens=False,
                )
            )
            for c in conversations
        ]
        texts: list[str] = [""] * len(prompts)
        with self.activate():
            for rows in token_batches([len(p) for p in prompts], self.batch_size):
                written, _ = decode_batch(
                    self.model,
                    [prompts[r] for r in rows],
                    self.tokenizer.pad_token_id,
                    self.stop,
                    max_tokens,
                    greedy=True,
                )
                for r, tokens in zip(rows, written, strict=True):
                    kept = [t for t in tokens if t not in self.stop]
                    texts[r] = self.tokenizer.decode(kept, skip_special_tokens=True)
        return texts

    def _batch(
        self, suffixes: list[list[int]], prefix_cache: Any, shared: int, tokens: ScoreTokens
    ) -> list[list[float]]:
        """P(0..10) for prompts ``shared prefix + suffix``, the prefix's cache given. The
        guessed "1" rides along at the end of each suffix, for P("0" | "1")."""
        ids, mask, pos = left_pad(
            [s + [tokens.one_guess] for s in suffixes], self.tokenizer.pad_token_id, self.device
        )
        cache = None
        if prefix_cache is not None:
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(len(suffixes))
            mask = torch.cat([torch.ones_like(mask[:, :1]).expand(-1, shared), mask], dim=1)
            pos = pos + shared
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            **with_cache(cache),
            use_cache=True,
            logits_to_keep=2,
        )
        probs = F.softmax(out.logits[:, 0].float(), dim=-1)
        digit = torch.stack([probs[:, list(i)].sum(-1) for i in tokens.scores], dim=1)
        zeros = list(tokens.zeros)
        p_zero = F.softmax(out.logits[:, 1].float(), dim=-1)[:, zeros].sum(-1)
        # Rows whose likelier "1" is not the guess: one step with it in the guess's place
        # (same position; the guess is masked out of what it sees).
        ones = torch.tensor(tokens.scores[1], device=probs.device)
        best = ones[probs[:, ones].argmax(-1)]
        redo = (best != tokens.one_guess).nonzero().flatten()
        if len(redo):
            kv_cache(out).batch_select_indices(redo)
            step_mask = torch.cat([mask[redo, :-1], torch.zeros_like(mask[redo, -1:])], dim=1)
            step_mask = torch.cat([step_mask, torch.ones_like(step_mask[:, :1])], dim=1)
            after = self.model(
                input_ids=best[redo, None],
                attention_mask=step_mask,
                position_ids=pos[redo, -1:],
                **with_cache(kv_cache(out)),
                use_cache=True,
            )
            p_zero[redo] = F.softmax(after.logits[:, -1].float(), dim=-1)[:, zeros].sum(-1)
        return [split_ten(d, z) for d, z in zip(digit.tolist(), p_zero.tolist(), strict=True)]

    @torch.no_grad()
    def __call__(
        self, conversations: Sequence[list[dict[str, str]]], prefix: str
    ) -> list[list[float]]:
        tokens = self.tokens(prefix)
        seqs = score_prompt_ids(self.tokenizer, conversations, prefix, tokens)
        if not seqs:
            return []
        # Every suffix keeps its last token: the score is read at that token's output.
        shared = min(common_prefix_len(seqs), min(len(s) for s in seqs) - 1)
        result: list[list[float]] = [[] for _ in seqs]
        with self.activate():
            prefix_cache = None
            if shared:
                head = torch.tensor([seqs[0][:shared]], device=self.device)
                head_out = self.model(input_ids=head, use_cache=True, logits_to_keep=1)
                prefix_cache = kv_cache(head_out)
            batches = token_batches(
                [len(s) - shared + 1 for s in seqs], self.batch_size, self.batch_tokens
            )
            for rows in tqdm(batches, desc="coach", leave=False):
                suffixes = [seqs[i][shared:] for i in rows]
                probs = self._batch(suffixes, prefix_cache, shared, tokens)
                for i, p in zip(rows, probs, strict=True):
                    result[i] = p
        return result
