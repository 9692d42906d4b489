"""``mappa.models.decoding.draw``: the sampler of every sampled token of the hf engine."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from mappa.models.decoding import draw

pytestmark = pytest.mark.filterwarnings("ignore")


def _counts(logp: torch.Tensor, n: int) -> torch.Tensor:
    """Per row, how often each token came out of ``n`` draws."""
    draws = draw(logp.repeat_interleave(n, dim=0)).view(logp.shape[0], n)
    return torch.stack([torch.bincount(d, minlength=logp.shape[-1]) for d in draws])


def _chi2_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() / probs.double().sum() * counts.sum()
    keep = expected > 0
    return float(chisquare(counts[keep].double().numpy(), expected[keep].numpy()).pvalue)


def test_draws_follow_each_rows_distribution() -> None:
    torch.manual_seed(0)
    probs = torch.tensor(
        [
            [0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0],
            [0.0, 0.1, 0.1, 0.1, 0.1, 0.6],
        ]
    )
    counts = _counts(probs.log(), 40_000)
    for row in range(2):
        assert _chi2_p(counts[row], probs[row]) > 1e-3
    # the test has power: the same counts are rejected against the other row's distribution
    assert _chi2_p(counts[0], torch.tensor([0.45, 0.3, 0.125, 0.0625, 0.0625, 0.0])) < 1e-6


def test_a_token_of_probability_zero_is_never_drawn() -> None:
    torch.manual_seed(1)
    probs = torch.zeros(3, 1000)
    probs[0, 0] = 1.0  # first token only
    probs[1, -1] = 1.0  # last token only
    probs[2, 500:502] = 0.5  # zeros on both sides
    counts = _counts(probs.log(), 5_000)
    assert counts[0, 0] == counts[1, -1] == 5_000
    assert counts[2, 500] + counts[2, 501] == 5_000 and counts[2, 500] > 2_000
