"""The in-process coach: expected score over 0-10 from a real (tiny) model.

The fast path (shared-prefix KV cache, length-sorted token batches, the "1" of "10" riding
along in the same forward) must give the scores of the plain computation: one prompt at a
time, no cache, no padding, one more forward for P("0" | "1").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from mappa.coach.context import CoachContext
from mappa.coach.local import LOW_MASS, SCORE_PREFIX, LocalCoach
from mappa.coach.templates import load_template, render_messages
from mappa.models.batching import token_batches
from mappa.models.loading import load_base
from mappa.models.score_tokens import split_ten
from mappa.models.scorer import ScoreDistributionModel, common_prefix_len


def _direct(
    model: Any, tok: Any, scorer: ScoreDistributionModel, messages: list[dict[str, str]]
) -> list[float]:
    """Unbatched, uncached reference computation of P(0..10)."""
    tokens = scorer.tokens(SCORE_PREFIX)
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text + SCORE_PREFIX + " 0", add_special_tokens=False)[:-1]
    with torch.no_grad():
        p = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
        digits = [float(p[list(i)].sum()) for i in tokens.scores]
        ones = list(tokens.scores[1])
        best = ones[int(p[ones].argmax())]
        q = torch.softmax(model(input_ids=torch.tensor([ids + [best]])).logits[0, -1].float(), -1)
    p10 = digits[1] * float(q[list(tokens.zeros)].sum())
    digits[1] -= p10
    digits[10] += p10
    return digits


def _expected(p: Sequence[float]) -> float:
    return sum(i * q for i, q in enumerate(p)) / sum(p)


def _ctx(agent: str, output: str, final: bool = False) -> CoachContext:
    return CoachContext(
        "2+2?", agent, "solve", 0, "in", output, None, final, "4" if final else None
    )


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Any, Any]:
    """The tiny Llama with its matrices redrawn 15x larger: at the default init its outputs
    hardly depend on the context, so an off-by-one position or a leaked token would pass."""
    model, tok = load_base(str(tiny_model_dir), dtype="float32", device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model, tok


def _assert_matches_direct(
    model: Any, tok: Any, scorer: ScoreDistributionModel, contexts: list[CoachContext]
) -> list[list[float]]:
    template = load_template("mathchat")
    conversations = [render_messages(template, c) for c in contexts]
    fast = scorer(conversations, SCORE_PREFIX)
    for conv, got in zip(conversations, fast, strict=True):
        want = _direct(model, tok, scorer, conv)
        assert len(got) == 11 and min(got) >= 0
        # float32 sums over a padded batch and a cached prefix differ from the direct
        # forward's by up to ~2e-4 of a probability at these enlarged weights, run to run
        assert torch.allclose(torch.tensor(got), torch.tensor(want), rtol=5e-4, atol=1e-7)
        assert abs(_expected(got) - _expected(want)) < 1e-4
    return fast


def test_fast_path_matches_plain_computation_across_lengths_and_batches(
    tiny: tuple[Any, Any],
) -> None:
    model, tok = tiny
    # Lengths from a few to hundreds of tokens; a small token budget splits them into
    # several padded batches, and the final agent's longer system prompt ends the shared
    # prefix earlier than the other contexts alone would.
    contexts = [_ctx("problem_solver", "out " * n) for n in (1, 7, 20, 300, 3)] + [
        _ctx("verifier", "\\boxed{4}", final=True)
    ]
    scorer = ScoreDistributionModel(model, tok, batch_size=3, batch_tokens=400)
    tokens = scorer.tokens(SCORE_PREFIX)
    # The right guess (every row rides along) and a wrong one (every row takes the extra step)
    for guess in (tokens.one_guess, tokens.scores[2][0]):
        scorer._tokens[SCORE_PREFIX] = dataclasses.replace(tokens, one_guess=guess)
        fast = _assert_matches_direct(model, tok, scorer, contexts)
    scores = LocalCoach(scorer, load_template("mathchat")).score(contexts)
    for s, p in zip(scores, fast, strict=True):
        # a random model puts little mass on the scores: flagged, the mass kept
        assert 0 <= s.value <= 10 and s.backend == "local"
        assert s.digit_mass == pytest.approx(sum(p)) and s.flagged == (sum(p) < LOW_MASS)
        assert abs(s.value - _expected(p)) < 1e-9


def test_one_action_and_identical_actions(tiny: tuple[Any, Any]) -> None:
    """A lone prompt (or copies of one) is all shared prefix: its last token must still be
    computed with the batch, where the score is read."""
    model, tok = tiny
    scorer = ScoreDistributionModel(model, tok)
    _assert_matches_direct(model, tok, scorer, [_ctx("verifier", "4", final=True)])
    _assert_matches_direct(model, tok, scorer, [_ctx("solver", "4")] * 3)
    assert scorer([], SCORE_PREFIX) == []


def test_shared_prefix_is_found_on_tokens_not_text(tiny: tuple[Any, Any]) -> None:
    """Two prompts whose texts agree on "...PROCESS_SC" split earlier as tokens (BPE merged
    the agreeing characters with the differing ones): the cached prefix must stop there."""
    model, tok = tiny
    a, b = "PROCESS_SCORE", "PROCESS_SCALE"
    text_common = len("PROCESS_SC")
    ids_a, ids_b = (tok.encode(t, add_special_tokens=False) for t in (a, b))
    shared = common_prefix_len([ids_a, ids_b])
    assert tok.decode(ids_a[:shared]) != a[:text_common]  # a text boundary would be wrong
    assert ids_a[:shared] == ids_b[:shared] and ids_a[shared] != ids_b[shared]
    scorer = ScoreDistributionModel(model, tok)
    _assert_matches_direct(model, tok, scorer, [_ctx("solver", a), _ctx("solver", b)])


def test_common_prefix_len() -> None:
    assert common_prefix_len([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_len([[1, 2], [3]]) == 0
    assert common_prefix_len([[5, 6]]) == 2


def test_token_batches_sort_by_length_and_respect_both_budgets() -> None:
    lengths = [10, 300, 12, 11, 290, 50, 9]
    batches = token_batches(lengths, max_rows=3, max_tokens=600)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert batches[0] == [1, 4]  # the longest two: 2 x 300 fits, a third would not
    for b in batches:
        assert len(b) <= 3 and (len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 600)
        assert [lengths[i] for i in b] == sorted((lengths[i] for i in b), reverse=True)
    assert token_batches([1000, 5], max_rows=8, max_tokens=100) == [[0], [1]]  # alone


def test_split_ten_moves_mass_from_one_to_ten() -> None:
    p = split_ten([0.1, 0.4, 0.5, 0, 0, 0, 0, 0, 0, 0, 0.05], 0.25)
    assert p == pytest.approx([0.1, 0.3, 0.5, 0, 0, 0, 0, 0, 0, 0, 0.15])


def test_the_coach_writes_in_batches_what_it_writes_alone(tiny: tuple[Any, Any]) -> None:
    """``write`` (the self-solving coach's writer on transformers): greedy, so rows of a
    left-padded batch write what they write alone."""
    model, tok = tiny
    scorer = ScoreDistributionModel(model, tok, batch_size=2)
    conversations = [
        [{"role": "user", "content": text}]
        for text in ("What is 2 + 2?", "Tom has 13 marbles and buys 4 more. How many now?", "x")
    ]
    together = scorer.write(conversations, 6)
    assert together == [scorer.write([c], 6)[0] for c in conversations]
    assert all(together)
    assert scorer.write([], 6) == []
