"""Where a score is read and which tokens spell it, shared by the local coach's scorers
(``scorer.py`` over transformers, ``vllm_engine.VllmScoreDistribution`` over vLLM,
``llamacpp_scorer.py`` over llama.cpp), so all read the same tokens at the same position
and split "10" the same way.

The read position is where a score is the model's natural next token: the prompt is
tokenized as if the model had written ``PROCESS_SCORE: 0`` and the digit's token is dropped.
On tokenizers that spell " 7" as " " + "7" (Qwen2.5, SmolLM2, Llama 3) the space stays in
the prompt; where " 7" is one token the prompt ends at the colon. Reading right after the
colon on the first kind finds the space as the next token and almost no mass on any digit.

Torch-free: the vLLM and llama.cpp scorers work on log-probs as Python floats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

SCORES = tuple(str(s) for s in range(11))
ZERO = "0"
"""The one spelling of "0" that after a "1" makes "10" (" 0" after "1" is "1 0")."""


def score_value(text: str) -> int | None:
    """The score 0..10 a token spells, or None. Only the exact digits of a score, after any
    leading whitespace: "07" is not 7 (no score is written with a leading zero, and ``int``
    would read it as one), nor are "7 " or "²". Every scorer, and the HTTP coach's reading
    of ``top_logprobs``, counts the same spellings.

    >>> [score_value(t) for t in ("7", " 10", "\\n3", "07", "007", "7 ", "²", "11")]
    [7, 10, 3, None, None, None, None, None]
    """
    value = text.lstrip()
    return int(value) if value in SCORES else None


@dataclass(frozen=True)
class ScoreTokens:
    """The tokens that spell each score at the read position.

    ``scores[s]``: every token whose text is ``s`` (0..10), with or without leading
    whitespace. ``zeros``: the tokens spelling a bare "0", which after a "1" make "10" on
    tokenizers that split it. ``one_guess``: the "1" the tokenizer writes there, the one
    most likely to be the likelier "1" (the scorers read P("0") after it in the same pass).
    """

    scores: tuple[tuple[int, ...], ...]
    zeros: tuple[int, ...]
    one_guess: int


def _pieces(tokenizer: Any) -> Iterable[tuple[int, str]]:
    """(id, text) of the tokens whose text may be a number: a digit in the raw piece."""
    raw = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    for i, piece in enumerate(raw):
        if piece is not None and any(c.isdigit() for c in piece):
            yield i, tokenizer.decode([i])


def score_tokens_from(
    pieces: Iterable[tuple[int, str]], encode: Callable[[str], list[int]], prefix: str
) -> ScoreTokens:
    """``ScoreTokens`` from a vocabulary's (id, text) pairs and its ``encode``.

    Raises ``ValueError`` when a digit after ``prefix`` is not one token, or the text
    before it tokenizes differently per digit: the score could not be read at one position.
    """
    scores: list[list[int]] = [[] for _ in SCORES]
    zeros: list[int] = []
    for i, text in pieces:
        value = score_value(text)
        if value is not None:
            scores[value].append(i)
            if text == ZERO:
                zeros.append(i)
    if not zeros or not all(scores[:10]):
        raise ValueError("the tokenizer has no single-token digits; cannot read a score")
    contexts = set()
    for d in range(10):
        ids = encode(f"{prefix} {d}")
        if ids[-1] not in scores[d]:
            raise ValueError(f"the tokenizer does not end {prefix!r} {d} with a digit token")
        contexts.add(tuple(ids[:-1]))
    if len(contexts) != 1:
        raise ValueError(f"the text before a digit after {prefix!r} tokenizes per digit")
    ten, one = encode(f"{prefix} 10"), encode(f"{prefix} 1")[-1]
    guess = ten[-2] if ten[-1] in zeros and ten[-2] in scores[1] else one
    return ScoreTokens(tuple(map(tuple, scores)), tuple(zeros), guess)


def score_tokens(tokenizer: Any, prefix: str) -> ScoreTokens:
    """``ScoreTokens`` of a transformers tokenizer for a score written after ``prefix``."""
    return score_tokens_from(
        _pieces(tokenizer), lambda t: tokenizer.encode(t, add_special_tokens=False), prefix
    )


def read_position_ids(ids: list[int], tokens: ScoreTokens) -> list[int]:
    """The ids of a text ending in ``prefix + " 0"`` without the digit: the prompt after
    which the score is the model's next token."""
    if not ids or ids[-1] not in tokens.scores[0]:
        raise ValueError("the score prompt does not end with a digit token")
    return ids[:-1]


def score_prompt_ids(
    tokenizer: Any, conversations: Sequence[list[dict[str, str]]], prefix: str, tokens: ScoreTokens
) -> list[list[int]]:
    """Each conversation chat-templated, opened as the assistant's turn and continued with
    ``prefix`` up to where its score's digit would be, as token ids: the score is read at
    the position after the last one."""
    return [
        read_position_ids(
            list(
                tokenizer.encode(
                    tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                    + f"{prefix} 0",
                    add_special_tokens=False,
                )
            ),
            tokens,
        )
        for c in conversations
    ]


def split_ten(digit: Sequence[float], p_zero: float) -> list[float]:
    """P(0..10) from P(spellings of 0..10) and P("0" after the likelier "1"): "10" starts
    like "1" where it is two tokens, so that share of the mass of "1" is the mass of 10.

    >>> [round(p, 3) for p in split_ten([0.1, 0.4, 0.5] + [0.0] * 8, 0.25)]
    [0.1, 0.3, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1]
    """
    p10 = digit[1] * p_zero
    return [digit[0], digit[1] - p10, *digit[2:10], digit[10] + p10]
