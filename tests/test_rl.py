"""REINFORCE++ math against numbers worked out by hand (arithmetic beside each value)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mappa.rl import get_estimator, kl_estimate, masked_whiten, policy_loss, returns_to_go, token_rewards

REWARDS = torch.tensor([0.8, 0.3])
KL = torch.tensor([[0.1, -0.2, 0.3], [0.5, 0.0, 9.9]])  # 9.9 sits on padding
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_k1() -> None:
    assert torch.allclose(kl_estimate(torch.tensor([-1.0]), torch.tensor([-1.5])), torch.tensor([0.5]))
    with pytest.raises(ValueError):
        kl_estimate(torch.tensor([0.0]), torch.tensor([0.0]), "k9")


def test_token_rewards_put_reward_on_last_real_token() -> None:
    r = token_rewards(REWARDS, KL, MASK, beta=0.1)
    expected = torch.tensor(
        [
            [-0.01, 0.02, -0.03 + 0.8],  # -0.1*0.1, -0.1*-0.2, -0.1*0.3 + R0
            [-0.05, 0.0 + 0.3, 0.0],  # -0.1*0.5, -0.1*0.0 + R1, padding stays 0
        ]
    )
    assert torch.allclose(r, expected, atol=1e-7)


def test_returns_to_go() -> None:
    r = token_rewards(REWARDS, KL, MASK, beta=0.1)
    g1 = returns_to_go(r, MASK, gamma=1.0)
    # row0: 0.77 | 0.02+0.77=0.79 | -0.01+0.79=0.78 ; row1: 0.3 | -0.05+0.3=0.25 | pad 0
    assert torch.allclose(g1, torch.tensor([[0.78, 0.79, 0.77], [0.25, 0.3, 0.0]]), atol=1e-6)
    g05 = returns_to_go(r, MASK, gamma=0.5)
    # row0: t2=0.77, t1=0.02+0.5*0.77=0.405, t0=-0.01+0.5*0.405=0.1925
    assert torch.allclose(g05[0], torch.tensor([0.1925, 0.405, 0.77]), atol=1e-6)


def test_reinforce_pp_whitens_over_the_whole_batch() -> None:
    r = token_rewards(REWARDS, KL, MASK, beta=0.1)
    adv, ret = get_estimator("reinforce_pp")(r, MASK, 1.0)
    # values 0.78 0.79 0.77 0.25 0.30: mean 2.89/5=0.578; squared deviations
    # .040804+.044944+.036864+.107584+.077284=.30748; var=.30748/4=.07687; std=.277254
    std = math.sqrt(0.30748 / 4)
    expected = torch.tensor([[0.202, 0.212, 0.192], [-0.328, -0.278, 0.0]]) / std
    expected[1, 2] = 0.0
    assert torch.allclose(adv, expected, atol=1e-5)
    assert torch.allclose(ret[1], torch.tensor([0.25, 0.3, 0.0]), atol=1e-6)


def test_whiten_degenerate_batches_are_finite() -> None:
    one = masked_whiten(torch.tensor([[3.0, 7.0]]), torch.tensor([[1.0, 0.0]]))
    assert torch.equal(one, torch.tensor([[0.0, 0.0]]))  # single token: centered only
    same = masked_whiten(torch.full((2, 3), 0.4), torch.ones(2, 3))
    assert torch.equal(same, torch.zeros(2, 3))  # zero variance: centered, not divided by ~0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=40), st.data())
def test_whiten_property(values: list[float], data: st.DataObject) -> None:
    x = torch.tensor(values, dtype=torch.float64)[None, :]
    keep = data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values)))
    mask = torch.tensor(keep, dtype=torch.float64)[None, :]
    out = masked_whiten(x, mask)
    assert torch.isfinite(out).all()
    sel = out[mask > 0]
    kept = x[mask > 0]
    if kept.numel() >= 2 and float(kept.std()) > 1e-6:
        assert abs(float(sel.mean())) < 1e-6
        assert abs(float(sel.std()) - 1.0) < 1e-6


def test_policy_loss_by_hand() -> None:
    old = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    logp = torch.tensor([[math.log(1.5), math.log(0.5), 0.0, 5.0]])  # last token is padding
    adv = torch.tensor([[1.0, -1.0, 2.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, stats = policy_loss(logp, old, adv, mask, clip_eps=0.2)
    # t0: max(-1*1.5, -1*1.2)=-1.2 ; t1: max(1*0.5, 1*0.8)=0.8 ; t2: max(-2,-2)=-2
    # token mean: (-1.2 + 0.8 - 2) / 3 = -0.8 ; clipped on t0 and t1 -> 2/3
    assert math.isclose(float(loss), -0.8, abs_tol=1e-6)
    assert math.isclose(stats["clip_frac"], 2 / 3, abs_tol=1e-6)
    loss_n, _ = policy_loss(logp, old, adv, mask, clip_eps=0.2, normalizer=6.0)
    assert math.isclose(float(loss_n), -2.4 / 6, abs_tol=1e-6)  # sum -2.4 over a batch of 6


def test_loss_gradient_equals_reinforce_gradient() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11))
    inputs = torch.randint(0, 11, (3, 5))
    actions = torch.randint(0, 11, (3, 5))
    adv = torch.randn(3, 5)
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2, [1.0] * 4 + [0.0]])

    def logp() -> torch.Tensor:
        lp = torch.log_softmax(model(inputs), dim=-1)
        return lp.gather(-1, actions[..., None]).squeeze(-1)

    lp = logp()
    loss, _ = policy_loss(lp, lp.detach(), adv, mask)  # ratio 1: no clipping
    ppo = torch.autograd.grad(loss, list(model.parameters()))
    direct = -(adv * logp() * mask).sum() / mask.sum()  # -(1/N) sum_t A_t log pi(a_t)
    ref = torch.autograd.grad(direct, list(model.parameters()))
    for a, b in zip(ppo, ref, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
