"""The in-process coach: expected score over 0-10 from a real (tiny) model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mappa.coach.context import CoachContext
from mappa.coach.local import SCORE_PREFIX, LocalCoach
from mappa.coach.templates import load_template, render_messages
from mappa.models.loading import load_base
from mappa.models.scorer import ScoreDistributionModel


def _direct(
    model: Any, tok: Any, scorer: ScoreDistributionModel, messages: list[dict[str, str]]
) -> list[float]:
    """Unbatched, uncached reference computation of P(0..10)."""
    text = (
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + SCORE_PREFIX
    )
    ids = tok.encode(text, add_special_tokens=False)
    with torch.no_grad():
        p = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
        digits = [float(p[i].sum()) for i in scorer.digit_ids]
        ones = scorer.digit_ids[1]
        best = ones[int(p[ones].argmax())]
        q = torch.softmax(model(input_ids=torch.tensor([ids + [best]])).logits[0, -1].float(), -1)
    p10 = digits[1] * float(q[scorer.zero_ids].sum())
    digits[1] -= p10
    return digits + [p10]


def test_batched_cached_distribution_matches_direct(tiny_model_dir: Path) -> None:
    model, tok = load_base(str(tiny_model_dir), dtype="float32", device="cpu")
    scorer = ScoreDistributionModel(model, tok, batch_size=3)
    contexts = [
        CoachContext("2+2?", "problem_solver", "solve", 0, "in", "out " * n, None, False, None)
        for n in (1, 7, 20)
    ] + [CoachContext("2+2?", "verifier", "answer", 0, "in", "\\boxed{4}", "4", True, "4")]
    template = load_template("mathchat")
    conversations = [render_messages(template, c) for c in contexts]
    batched = scorer(conversations, SCORE_PREFIX)
    for conv, got in zip(conversations, batched, strict=True):
        assert len(got) == 11 and min(got) >= 0
        assert torch.allclose(
            torch.tensor(got), torch.tensor(_direct(model, tok, scorer, conv)), atol=1e-5
        )
    scores = LocalCoach(scorer, template).score(contexts)
    for s, p in zip(scores, batched, strict=True):
        assert 0 <= s.value <= 10 and not s.flagged and s.backend == "local"
        assert abs(s.value - sum(i * q for i, q in enumerate(p)) / sum(p)) < 1e-9
