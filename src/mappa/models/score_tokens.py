"""Where a score is read, shared by the local coach's two scorers (``scorer.py`` over
transformers, ``vllm_engine.VllmScoreDistribution`` over vLLM), so both read the same
tokens at the same position and split "10" the same way.

Torch-free: the vLLM scorer works on the log-probs vLLM returns, as Python floats.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _single_token_ids(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids if len(ids) == 1 else []


def digit_token_ids(tokenizer: Any) -> list[list[int]]:
    """Per digit 0..9, its single-token spellings: the bare digit and the digit with a
    leading space (a model may write either after ``PROCESS_SCORE:``), where each is one
    token. Raises ``ValueError`` for a tokenizer without single-token digits."""
    ids = [
        _single_token_ids(tokenizer, str(d)) + _single_token_ids(tokenizer, f" {d}")
        for d in range(10)
    ]
    if not all(ids):
        raise ValueError("tokenizer has no single-token digits; cannot read a score")
    return ids


def one_guess(digit_ids: Sequence[Sequence[int]]) -> int:
    """The "1" token to read P("0" | "1") after before knowing which "1" is likelier: " 1"
    where it is one token (after "SCORE:" a model writes a space), else the bare "1", then
    the only candidate and never wrong."""
    return digit_ids[1][-1]


def score_prompt_ids(
    tokenizer: Any, conversations: Sequence[list[dict[str, str]]], prefix: str
) -> list[list[int]]:
    """Each conversation chat-templated, opened as the assistant's turn and continued with
    ``prefix``, as token ids: the score is read at the position after the last one."""
    return [
        list(
            tokenizer.encode(
                tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                + prefix,
                add_special_tokens=False,
            )
        )
        for c in conversations
    ]


def split_ten(digit: Sequence[float], p_zero: float) -> list[float]:
    """P(0..10) from P(digit 0..9) and P("0" after the likelier "1"): "10" starts like "1",
    so that share of the mass of "1" is the mass of 10."""
    p10 = digit[1] * p_zero
    return [digit[0], digit[1] - p10, *digit[2:], p10]
