"""REINFORCE++ and its baselines against numbers worked out by hand (arithmetic beside each
expected value), with padding and truncated (masked-out) completions present."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from dataclasses import fields
from typing import Any, get_args

import pytest
import torch
from fakes import FakeTablePolicy
from hypothesis import given, settings
from hypothesis import strategies as st

from mappa.config import RLConfig
from mappa.records import Action, Episode, Score
from mappa.rl import (
    get_estimator,
    kl_estimate,
    masked_whiten,
    policy_loss,
    returns_to_go,
    token_rewards,
)
from mappa.rl.advantages import EstimatorConfig, Groups
from mappa.rl.core import grouped_whiten
from mappa.rl.experience import (
    StaleOldLogprobsError,
    build_batch,
    check_group_sizes,
    compute_advantages,
    make_experience,
    micro_batches,
    scored_actions,
    step_layout,
)
from mappa.rl.kl import (
    DEFAULT_KL_ESTIMATOR,
    K3_CLAMP,
    KL_ESTIMATORS,
    LOG_RATIO_CLAMP,
    KLController,
    get_kl_estimator,
    register_kl_estimator,
)
from mappa.rl.loss import LossConfig
from mappa.rl.rewards import mix_reward
from mappa.rl.update import UpdateStats, policy_step, update_agents

REWARDS = torch.tensor([0.8, 0.3])
KL = torch.tensor([[0.1, -0.2, 0.3], [0.5, 0.0, 9.9]])  # 9.9 sits on padding
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
CFG = EstimatorConfig(gamma=1.0)


def groups(
    rewards: list[float],
    prompt: list[int] | None = None,
    scope: list[int] | None = None,
    outcomes: list[float] | None = None,
) -> Groups:
    n = len(rewards)
    return Groups(
        prompt=torch.tensor(prompt or [0] * n),
        scope=torch.tensor(scope or [0] * n),
        rewards=torch.tensor(rewards),
        outcomes=torch.tensor(outcomes or [0.0] * n),
    )


def test_kl_estimators() -> None:
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])  # d = 0.5
    assert math.isclose(float(kl_estimate(logp, ref, "k1")), 0.5, abs_tol=1e-7)
    assert math.isclose(float(kl_estimate(logp, ref, "k2")), 0.125, abs_tol=1e-7)  # 0.5^2/2
    # k3 = exp(-0.5) - 1 + 0.5 = 0.60653066 - 0.5 = 0.10653066
    assert math.isclose(float(kl_estimate(logp, ref, "k3")), 0.10653066, abs_tol=1e-6)
    assert float(kl_estimate(torch.tensor([0.0]), torch.tensor([0.0]), "k3")) == 0.0
    with pytest.raises(ValueError):
        kl_estimate(logp, ref, "k9")


def test_kl_registry_and_the_one_default() -> None:
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}
    # the config offers exactly the registered estimators, and everything defaults to k1
    assert set(get_args(RLConfig.model_fields["kl_estimator"].annotation)) == set(KL_ESTIMATORS)
    assert DEFAULT_KL_ESTIMATOR == "k1" == RLConfig().kl_estimator == LossConfig().kl_estimator
    with pytest.raises(ValueError, match="k1, k2, k3"):
        get_kl_estimator("k9")
    with pytest.raises(ValueError, match="twice"):
        register_kl_estimator("k1")(lambda d: d)
    try:
        register_kl_estimator("abs")(lambda d: d.abs())
        assert kl_estimate(torch.tensor([-1.0]), torch.tensor([0.0]), "abs").tolist() == [1.0]
    finally:
        KL_ESTIMATORS.pop("abs", None)


def test_kl_clamps_change_nothing_in_normal_ranges() -> None:
    d = torch.linspace(-19.5, 19.5, 79)
    ref = torch.zeros_like(d)  # so logp - ref is d exactly
    assert torch.equal(kl_estimate(d, ref, "k1"), d)
    assert torch.equal(kl_estimate(d, ref, "k2"), 0.5 * d**2)
    raw = torch.expm1(-d) + d
    k3 = kl_estimate(d, ref, "k3")
    inside = raw <= K3_CLAMP  # d from about -2.6 to 11
    assert inside.sum() > 20 and torch.equal(k3[inside], raw[inside])
    assert (k3[~inside] == K3_CLAMP).all()


def test_kl_clamps_keep_extreme_log_ratios_finite() -> None:
    inf = float("inf")
    logp, ref = torch.tensor([0.0, -inf, 0.0, -1.0]), torch.tensor([-inf, 0.0, -100.0, -1.0])
    c = LOG_RATIO_CLAMP
    assert kl_estimate(logp, ref, "k1").tolist() == [c, -c, c, 0.0]
    assert kl_estimate(logp, ref, "k2").tolist() == [c * c / 2, c * c / 2, c * c / 2, 0.0]
    assert kl_estimate(logp, ref, "k3").tolist() == [K3_CLAMP, K3_CLAMP, K3_CLAMP, 0.0]


def test_adaptive_beta() -> None:
    fixed = KLController(0.1)
    assert fixed.update(5.0, 1000) == 0.1
    ctl = KLController(0.1, target=0.05, horizon=100)
    # error = clip((0.1-0.05)/0.05 = 1.0, +-0.2) = 0.2 ; beta *= 1 + 0.2*50/100 -> 0.11
    assert math.isclose(ctl.update(0.1, 50), 0.11, rel_tol=1e-9)
    # error = clip((0.04-0.05)/0.05 = -0.2) = -0.2 ; beta *= 1 - 0.2*50/100 -> 0.099
    assert math.isclose(ctl.update(0.04, 50), 0.099, rel_tol=1e-9)


def test_token_rewards_put_reward_on_last_real_token() -> None:
    r = token_rewards(REWARDS, KL, MASK, beta=0.1)
    expected = torch.tensor(
        [
            [-0.01, 0.02, -0.03 + 0.8],  # -0.1*0.1, -0.1*-0.2, -0.1*0.3 + R0
            [-0.05, 0.0 + 0.3, 0.0],  # -0.1*0.5, -0.1*0.0 + R1, padding stays 0
        ]
    )
    assert torch.allclose(r, expected, atol=1e-7)


def test_reward_mixing_and_clipping() -> None:
    assert mix_reward(7.0, 1.0) == pytest.approx(0.7)  # 1*7/10 + 0*1
    assert mix_reward(7.0, 1.0, 0.0, 1.0) == pytest.approx(1.0)  # outcome only
    assert mix_reward(4.0, 1.0, 0.5, 2.0) == pytest.approx(2.2)  # 0.5*0.4 + 2*1
    assert mix_reward(4.0, None, 1.0, 1.0) == pytest.approx(0.4)  # no outcome known: 0
    assert mix_reward(10.0, 1.0, 1.0, 1.0, clip=1.5) == 1.5  # 2.0 clipped


def test_returns_to_go() -> None:
    r = token_rewards(REWARDS, KL, MASK, beta=0.1)
    g1 = returns_to_go(r, MASK, gamma=1.0)
    # row0: 0.77 | 0.02+0.77=0.79 | -0.01+0.79=0.78 ; row1: 0.3 | -0.05+0.3=0.25 | pad 0
    assert torch.allclose(g1, torch.tensor([[0.78, 0.79, 0.77], [0.25, 0.3, 0.0]]), atol=1e-6)
    g05 = returns_to_go(r, MASK, gamma=0.5)
    # row0: t2=0.77, t1=0.02+0.5*0.77=0.405, t0=-0.01+0.5*0.405=0.1925
    assert torch.allclose(g05[0], torch.tensor([0.1925, 0.405, 0.77]), atol=1e-6)


def test_reinforce_pp_whitens_the_batch_and_ignores_truncated_rows() -> None:
    rewards = torch.tensor([0.8, 0.3, 0.9])
    kl = torch.cat([KL, torch.tensor([[2.0, 2.0, 2.0]])])
    valid = torch.cat([MASK, torch.ones(1, 3)])
    loss_mask = valid.clone()
    loss_mask[2] = 0.0  # a truncated completion: masked out of whitening and loss
    r = token_rewards(rewards, kl, valid, beta=0.1)
    est = get_estimator("reinforce_pp")(r, loss_mask, groups([0.8, 0.3, 0.9]), CFG)
    # values 0.78 0.79 0.77 0.25 0.30: mean 2.89/5=0.578; squared deviations
    # .040804+.044944+.036864+.107584+.077284=.30748; var=.30748/4=.07687; std=.277254
    std = math.sqrt(0.30748 / 4)
    expected = torch.tensor([[0.202, 0.212, 0.192], [-0.328, -0.278, 0.0], [0.0, 0.0, 0.0]]) / std
    assert torch.allclose(est.advantages, expected, atol=1e-5)
    assert torch.allclose(est.returns[1], torch.tensor([0.25, 0.3, 0.0]), atol=1e-6)
    assert est.signal.tolist() == [True, True, False]  # the masked row is not trained
    assert est.counts == {"unwhitened_scopes": 0}


def test_reinforce_pp_leaves_a_scope_of_equal_rewards_unwhitened() -> None:
    # scope 0: rewards 0.5, 0.5 (a tie: no signal) ; scope 1: 0.8, 0.3 (signal)
    r = token_rewards(
        torch.tensor([0.5, 0.5, 0.8, 0.3]), torch.cat([KL, KL]), torch.cat([MASK, MASK]), 0.1
    )
    mask = torch.cat([MASK, MASK])
    est = get_estimator("reinforce_pp")(
        r, mask, groups([0.5, 0.5, 0.8, 0.3], scope=[0, 0, 1, 1]), CFG
    )
    # scope 0 returns: row0 -0.01+0.02-0.03+0.5=0.48, 0.49, 0.47 ; row1 0.45, 0.5
    # mean 2.39/5 = 0.478 ; centered only: .002 .012 -.008 | -.028 .022 (never / std=.0195)
    expected0 = torch.tensor([[0.002, 0.012, -0.008], [-0.028, 0.022, 0.0]])
    assert torch.allclose(est.advantages[:2], expected0, atol=1e-6)
    # scope 1 is whitened as in the test above (same returns as rows 0-1 there)
    std = math.sqrt(0.30748 / 4)
    expected1 = torch.tensor([[0.202, 0.212, 0.192], [-0.328, -0.278, 0.0]]) / std
    assert torch.allclose(est.advantages[2:], expected1, atol=1e-5)
    assert est.signal.tolist() == [False, False, True, True]
    assert est.counts == {"unwhitened_scopes": 1}


@pytest.mark.parametrize(("spread", "whitened"), [(0.01, False), (0.2, True)])
def test_reinforce_pp_whitens_a_scope_only_when_its_rewards_spread_enough(
    spread: float, whitened: bool
) -> None:
    # no KL: returns are each row's reward on every token. Rewards 0.5+spread, 0.5 over
    # 3 + 2 tokens: mean 0.5 + 0.6*spread, centered +0.4*spread (x3) | -0.6*spread (x2)
    rewards = [0.5 + spread, 0.5]
    r = token_rewards(torch.tensor(rewards), torch.zeros_like(KL), MASK, 0.0)
    est = get_estimator("reinforce_pp")(r, MASK, groups(rewards), CFG)  # min_spread 0.05
    centered = torch.tensor([[0.4, 0.4, 0.4], [-0.6, -0.6, 0.0]]) * spread
    assert est.signal.tolist() == [whitened, whitened]
    assert est.counts == {"unwhitened_scopes": 0 if whitened else 1}
    if whitened:  # divided by the std: unit scale
        assert abs(float(est.advantages[MASK > 0].std()) - 1.0) < 1e-5
    else:  # only centered: magnitudes of the reward gap, not a unit-size update
        assert torch.allclose(est.advantages, centered, atol=1e-6)
        assert float(est.advantages.abs().max()) < 0.01
    # min_spread 0 counts any difference as signal
    loose = get_estimator("reinforce_pp")(r, MASK, groups(rewards), EstimatorConfig(min_spread=0))
    assert loose.signal.tolist() == [True, True]
    assert abs(float(loose.advantages[MASK > 0].std()) - 1.0) < 1e-5


def test_a_half_point_gap_is_signal_despite_float32_rounding() -> None:
    # 0.35 - 0.3 is 0.0499999... in float32: the threshold of 0.05 must still count it
    r = token_rewards(torch.tensor([0.35, 0.3]), torch.zeros_like(KL), MASK, 0.0)
    est = get_estimator("reinforce_pp")(r, MASK, groups([0.35, 0.3]), CFG)
    assert est.signal.tolist() == [True, True]


def test_a_scope_of_one_trained_action_is_only_centered() -> None:
    r = token_rewards(REWARDS, KL, MASK, beta=0.1)
    one = MASK.clone()
    one[1] = 0.0  # row 1 masked out: its scope holds one trained action
    est = get_estimator("reinforce_pp")(r, one, groups([0.8, 0.3]), CFG)
    # row0 returns 0.78 0.79 0.77: mean 0.78, centered 0 .01 -.01 (never / std)
    expected = torch.tensor([[0.0, 0.01, -0.01], [0.0, 0.0, 0.0]])
    assert torch.allclose(est.advantages, expected, atol=1e-6)
    assert est.signal.tolist() == [False, False] and est.counts == {"unwhitened_scopes": 1}


def test_grpo_gives_a_group_below_the_spread_no_signal() -> None:
    rewards = [0.9, 0.3, 0.5, 0.51]  # group 1 differs by 0.01: GRPO would make it +-0.707
    r = token_rewards(torch.tensor(rewards), torch.zeros_like(G_KL), G_MASK, 0.0)
    est = get_estimator("grpo")(r, G_MASK, groups(rewards, prompt=[0, 0, 1, 1]), CFG)
    assert torch.equal(est.advantages[2:], torch.zeros(2, 3))
    assert abs(float(est.advantages[0, 0]) - 0.70710678) < 1e-6
    assert est.signal.tolist() == [True, True, False, False]
    assert est.counts == {"flat_groups": 1, "singleton_groups": 0}


def test_outcome_only_replaces_the_reward_by_the_outcome() -> None:
    r = token_rewards(REWARDS, KL, MASK, beta=0.1)
    est = get_estimator("outcome_only")(r, MASK, groups([0.8, 0.3], outcomes=[0.0, 1.0]), CFG)
    # row0 tokens -0.01, 0.02, -0.03+0 -> returns -0.02, -0.01, -0.03
    # row1 tokens -0.05, 0+1.0 -> returns 0.95, 1.0
    expected_ret = torch.tensor([[-0.02, -0.01, -0.03], [0.95, 1.0, 0.0]])
    assert torch.allclose(est.returns, expected_ret, atol=1e-6)
    # mean 1.89/5=0.378; squared deviations .158404+.150544+.166464+.327184+.386884=1.18948
    # var 1.18948/4=0.29737; std 0.545316
    std = math.sqrt(1.18948 / 4)
    expected = torch.tensor([[-0.398, -0.388, -0.408], [0.572, 0.622, 0.0]]) / std
    assert torch.allclose(est.advantages, expected, atol=1e-5)
    # every outcome 0: no signal, and the KL-only returns are only centered
    flat = get_estimator("outcome_only")(r, MASK, groups([0.8, 0.3], outcomes=[0.0, 0.0]), CFG)
    assert flat.signal.tolist() == [False, False] and flat.counts == {"unwhitened_scopes": 1}
    # returns -0.02 -0.01 -0.03 | -0.05 0.0 ; mean -0.022 ; centered .002 .012 -.008 | -.028 .022
    expected_flat = torch.tensor([[0.002, 0.012, -0.008], [-0.028, 0.022, 0.0]])
    assert torch.allclose(flat.advantages, expected_flat, atol=1e-6)


# Four rows for the group baselines: completion lengths 3, 2, 2, 1; per-token KL k(t); beta 0.1.
G_KL = torch.tensor([[0.1, -0.2, 0.3], [0.5, 0.0, 9.9], [0.2, 0.2, 0.0], [1.0, 0.0, 0.0]])
G_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_grpo_token_rewards_keep_the_kl_penalty_and_gamma() -> None:
    rewards = [0.9, 0.3, 0.5, 0.5]  # group 0: rows 0, 1 ; group 1: rows 2, 3 (a tie)
    r = token_rewards(torch.tensor(rewards), G_KL, G_MASK, beta=0.1)
    # token rewards -0.1*k, + R on the last token:
    #   row0 -0.01, 0.02, -0.03+0.9 ; row1 -0.05, 0+0.3 ; row2 -0.02, -0.02+0.5 ; row3 -0.1+0.5
    g = groups(rewards, prompt=[0, 0, 1, 1])
    est = get_estimator("grpo")(r, G_MASK, g, CFG)
    # group 0: mean 0.6, unbiased std s = sqrt((.09+.09)/1) = .424264 -> A = +-0.3/s = +-a,
    # a = .707107. The adjusted scalar replaces R on the last token and the KL penalty is
    # divided by the same s (beta in reward units, §3a): 0.01/s = a/30, 0.05/s = a/6.
    #   row0 -a/30, +a/15, -a/10 + a ; row1 -a/6, -a.
    # group 1: rewards tie -> exactly 0 and nothing divided: row2 -0.02, -0.02 ; row3 -0.1.
    # Return-to-go (gamma 1), and advantages = returns (no whitening):
    a = 0.70710678
    expected = torch.tensor(
        [
            [0.9 * a + a / 30, 0.9 * a + a / 15, 0.9 * a],  # .659966 .683537 .636396
            [-a - a / 6, -a, 0.0],  # -.824958 -.707107
            [-0.04, -0.02, 0.0],
            [-0.1, 0.0, 0.0],
        ]
    )
    assert torch.allclose(est.advantages, expected, atol=1e-6)
    assert torch.equal(est.returns, est.advantages)
    assert est.signal.tolist() == [True, True, False, False]
    assert est.counts == {"flat_groups": 1, "singleton_groups": 0}
    # gamma 0.5, row0: t2 = .9a = .636396 ; t1 = a/15 + 0.5*.636396 = .365339 ;
    # t0 = -a/30 + 0.5*.365339 = .159099
    half = get_estimator("grpo")(r, G_MASK, g, EstimatorConfig(gamma=0.5))
    assert torch.allclose(
        half.advantages[0], torch.tensor([0.159099, 0.365339, 0.636396]), atol=1e-6
    )


def test_rloo_token_rewards_keep_the_kl_penalty() -> None:
    rewards = [0.8, 0.2, 0.5, 0.7]  # group 0: rows 0-2 ; row 3 alone
    kl = torch.tensor([[0.1, 0.3], [0.2, 0.0], [-0.4, 0.0], [0.5, 0.5]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    r = token_rewards(torch.tensor(rewards), kl, mask, beta=0.1)
    # token rewards: row0 -0.01, -0.03+0.8 ; row1 -0.02+0.2 ; row2 0.04, 0+0.5 ;
    # row3 -0.05, -0.05+0.7
    est = get_estimator("rloo")(r, mask, groups(rewards, prompt=[0, 0, 0, 1]), CFG)
    # leave-one-out: .8-(.2+.5)/2=.45 ; .2-(.8+.5)/2=-.45 ; .5-(.8+.2)/2=0 ; a group of one: 0
    # shaped: row0 -0.01, -0.03+.45=.42 ; row1 -0.02-.45=-.47 ; row2 0.04, 0 ; row3 -0.05, -0.05
    # returns: row0 .41 .42 ; row1 -.47 ; row2 .04 0 ; row3 -.1 -.05
    expected = torch.tensor([[0.41, 0.42], [-0.47, 0.0], [0.04, 0.0], [-0.1, -0.05]])
    assert torch.allclose(est.advantages, expected, atol=1e-6)
    assert est.signal.tolist() == [True, True, True, False]  # row2's group has spread
    assert est.counts == {"flat_groups": 0, "singleton_groups": 1}


def test_group_estimators_without_kl_are_the_textbook_ones() -> None:
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    rewards = [0.8, 0.2, 0.5, 0.9, 0.4]
    g = groups(rewards, prompt=[0, 0, 1, 1, 2])
    r = token_rewards(torch.tensor(rewards), torch.zeros(5, 2), mask, beta=0.0)
    adv = get_estimator("grpo")(r, mask, g, CFG).advantages
    # group0 [.8,.2]: mean .5, unbiased std sqrt(.18)=.424264 -> +-.3/.424264 = +-.707107
    # group1 [.5,.9]: mean .7, std sqrt(.08)=.282843 -> -+.2/.282843 = -+.707107 ; group2 alone: 0
    a = 0.70710678
    expected = torch.tensor([[a, a], [-a, 0.0], [-a, -a], [a, a], [0.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)


# The one rule for beta (docs/algorithm.md §3a): beta is in the reward's own units. Whatever
# an estimator divides the reward by divides the KL penalty too, so the KL's weight against
# the reward is the same in every estimator.
ESTIMATORS = ("reinforce_pp", "outcome_only", "grpo", "rloo")
NORMALISING = ("reinforce_pp", "outcome_only", "grpo")  # rloo divides by nothing


def _estimate(
    name: str,
    rewards: list[float],
    kl: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    prompt: list[int] | None = None,
    cfg: EstimatorConfig = CFG,
) -> torch.Tensor:
    """``name``'s advantages; ``rewards`` are the scalar rewards, or the outcomes for
    ``outcome_only`` (whose placed reward, swapped out, is an unrelated 0.37)."""
    placed = [0.37] * len(rewards) if name == "outcome_only" else rewards
    g = groups(placed, prompt=prompt, outcomes=rewards)
    r = token_rewards(torch.tensor(placed), kl, mask, beta)
    return get_estimator(name)(r, mask, g, cfg).advantages


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("c", [0.1, 10.0])
def test_beta_is_in_reward_units_in_every_estimator(name: str, c: float) -> None:
    # Rewards, beta and the reward-unit thresholds times c: a normalising estimator gives the
    # very same advantages, rloo (nothing divided) c times them. Before the rule GRPO divided
    # the reward by the group std but not the KL, so its KL weighed c times more here.
    rewards, prompt, beta = [0.9, 0.3, 0.5, 0.7], [0, 0, 1, 1], 0.1
    base = _estimate(name, rewards, G_KL, G_MASK, beta, prompt)
    scaled_cfg = EstimatorConfig(eps=1e-4 * c, min_spread=0.05 * c)
    scaled = _estimate(name, [c * x for x in rewards], G_KL, G_MASK, c * beta, prompt, scaled_cfg)
    factor = 1.0 if name in NORMALISING else c
    torch.testing.assert_close(scaled, factor * base, rtol=1e-5, atol=1e-6)


def test_the_kl_weighs_alike_against_a_tenth_of_the_spread_in_every_estimator() -> None:
    # One task sampled 4 times, 2 tokens each; the same per-token KL (only row 0 pays it)
    # and beta. Outcomes o = 0, 1, 0, 1 (spread 1) against process rewards 0.5 + o/10
    # (spread 0.1, as coach scores / 10 are). Rows 0 and 2 share a reward, so A[2] - A[0]
    # is the KL's effect; rows 2 and 3 differ only in reward, so A[3] - A[2] is the reward
    # gap's. Under the rule their ratio is beta * (KL still ahead) / (reward gap), whatever
    # the estimator: 0.1 * (0.3 + 0.2, 0.2) / gap -> (0.05, 0.02) / gap.
    kl = torch.tensor([[0.3, 0.2], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.ones(4, 2)
    outcomes = [0.0, 1.0, 0.0, 1.0]
    process = [0.5 + o / 10 for o in outcomes]
    cases = [
        ("reinforce_pp", process, 0.1),
        ("reinforce_pp", outcomes, 1.0),
        ("outcome_only", outcomes, 1.0),
        ("grpo", process, 0.1),
        ("grpo", outcomes, 1.0),
    ]
    for name, rewards, gap in cases:
        adv = _estimate(name, rewards, kl, mask, beta=0.1)
        share = (adv[2] - adv[0]) / (adv[3] - adv[2])
        expected = torch.tensor([0.05, 0.02]) / gap
        torch.testing.assert_close(
            share, expected, rtol=1e-4, atol=0.0, msg=lambda m, n=name, g=gap: f"{n} gap {g}: {m}"
        )
    # (rloo's leave-one-out baseline stretches a reward gap by n/(n-1) and is unbiased for
    # it; it divides by nothing, so beta is in reward units there by construction)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_a_batch_of_equal_rewards_keeps_the_kl_in_reward_units(name: str) -> None:
    # Every reward equal: nothing is divided (min_reward_spread), so the advantages are the
    # KL penalty alone, at beta's own scale, linear in beta: centered for the whitening
    # estimators, as they are for the group ones.
    rewards = [0.5, 0.5, 0.5, 0.5]
    adv = _estimate(name, rewards, G_KL, G_MASK, 0.1, [0, 0, 1, 1])
    penalty = returns_to_go(-0.1 * G_KL * G_MASK, G_MASK)
    if name in ("reinforce_pp", "outcome_only"):
        penalty = (penalty - penalty[G_MASK > 0].mean()) * G_MASK
    torch.testing.assert_close(adv, penalty, rtol=0.0, atol=1e-6)
    tenfold = _estimate(name, rewards, G_KL, G_MASK, 1.0, [0, 0, 1, 1])
    torch.testing.assert_close(tenfold, 10 * adv, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_a_single_sample_keeps_the_kl_in_reward_units(name: str) -> None:
    # One action: no spread, no group. Its KL penalty is not divided by anything.
    kl, mask = G_KL[:1], G_MASK[:1]  # tokens -0.01, 0.02, -0.03 -> returns -0.02 -0.01 -0.03
    adv = _estimate(name, [0.9], kl, mask, 0.1)
    returns = torch.tensor([[-0.02, -0.01, -0.03]])
    expected = returns + 0.02 if name in ("reinforce_pp", "outcome_only") else returns
    torch.testing.assert_close(adv, expected, rtol=0.0, atol=1e-6)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_without_kl_the_advantages_are_the_former_ones(name: str) -> None:
    # beta 0: the rule has nothing to scale. The KL tensor is ignored bit for bit, and the
    # advantages are the textbook ones: whitened rewards (reinforce_pp, outcome_only), the
    # group-normalised (grpo) or leave-one-out (rloo) scalar on every token.
    rewards, prompt = [0.9, 0.3, 0.5, 0.7], [0, 0, 1, 1]
    adv = _estimate(name, rewards, G_KL, G_MASK, 0.0, prompt)
    assert torch.equal(adv, _estimate(name, rewards, torch.zeros_like(G_KL), G_MASK, 0.0, prompt))
    a = 0.70710678
    scalar = {  # per row, on every token
        "grpo": [a, -a, -a, a],  # +-0.3/sqrt(.18), -+0.1/sqrt(.02)
        "rloo": [0.6, -0.6, -0.2, 0.2],
    }
    if name in scalar:
        expected = torch.tensor(scalar[name])[:, None] * G_MASK
    else:  # 3 + 2 + 2 + 1 tokens: mean (2.7 + 0.6 + 1.0 + 0.7)/8 = 0.625
        centred = torch.tensor(rewards)[:, None] - 0.625
        std = float(centred.expand_as(G_MASK)[G_MASK > 0].std())
        expected = centred / std * G_MASK
    torch.testing.assert_close(adv, expected, rtol=0.0, atol=1e-6)


def test_whitening_scopes() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    ones = torch.ones(2, 2)
    per_agent = grouped_whiten(x, ones, torch.tensor([0, 1]))
    # [1,2]: mean 1.5, std sqrt(.5)=.707107 ; [3,5]: mean 4, std sqrt(2)=1.414214
    a = 0.70710678
    assert torch.allclose(per_agent, torch.tensor([[-a, a], [-a, a]]), atol=1e-5)
    pooled = grouped_whiten(x, ones, torch.tensor([0, 0]))
    # mean 2.75; squared deviations 3.0625+.5625+.0625+5.0625=8.75; var 8.75/3; std 1.707825
    s = math.sqrt(8.75 / 3)
    assert torch.allclose(pooled, torch.tensor([[-1.75, -0.75], [0.25, 2.25]]) / s, atol=1e-5)
    # a group with no row marked is centered, not divided: [1,2] -> -.5, .5
    part = grouped_whiten(x, ones, torch.tensor([0, 1]), divide=torch.tensor([False, True]))
    assert torch.allclose(part, torch.tensor([[-0.5, 0.5], [-a, a]]), atol=1e-5)


def _item(
    agent: str,
    task_type: str,
    task_id: str,
    score: float,
    correct: bool | None,
    truncated: bool = False,
    task: str = "t",
) -> tuple[Episode, Action]:
    ep = Episode("e", task_id, task, "1", task_type=task_type, correct=correct)
    act = Action(
        "e",
        agent,
        0,
        [1, 2],
        [3, 4, 5],
        [-0.1, -0.2, -0.3],
        "p",
        "c",
        truncated,
        coach=Score(score),
    )
    return ep, act


def test_build_batch_scopes_groups_rewards_and_truncation() -> None:
    items = [
        _item("a", "x", "t1", 8.0, True),
        _item("a", "y", "t1", 2.0, False),
        _item("b", "x", "t1", 6.0, None, truncated=True),
        _item("b", "x", "t2", 4.0, True),
        _item("a", "x", "t1", 5.0, True),
    ]

    def scope(name: str) -> list[int]:
        cfg = RLConfig.model_validate({"norm_scope": name})
        return build_batch(items, cfg).groups.scope.tolist()

    assert scope("agent") == [0, 0, 1, 1, 0]
    assert scope("global") == [0, 0, 0, 0, 0]
    assert scope("agent_tasktype") == [0, 1, 2, 2, 0]
    batch = build_batch(items, RLConfig(w_process=0.5, w_outcome=1.0))
    # 0.5*0.8+1 ; 0.5*0.2+0 ; 0.5*0.6+0 (no outcome) ; 0.5*0.4+1 ; 0.5*0.5+1
    assert torch.allclose(batch.groups.rewards, torch.tensor([1.4, 0.1, 0.3, 1.2, 1.25]))
    # (task, agent, turn); the task is its id and content, so t1 of type y is another task
    assert batch.groups.prompt.tolist() == [0, 1, 2, 3, 0]
    assert batch.loss_mask[2].sum() == 0 and batch.valid[2].sum() == 3
    assert build_batch(items, RLConfig(mask_truncated=False)).loss_mask[2].sum() == 3


def test_duplicate_task_ids_of_different_tasks_never_share_a_group() -> None:
    items = [
        _item("a", "x", "7", 8.0, True, task="2 + 2"),
        _item("a", "x", "7", 2.0, True, task="2 + 2"),
        _item("a", "x", "7", 6.0, True, task="3 + 5"),  # same id, another data set's task
        _item("a", "x", "7", 4.0, True, task="3 + 5"),
    ]
    assert build_batch(items, RLConfig()).groups.prompt.tolist() == [0, 0, 1, 1]
    check_group_sizes([ep for ep, _ in items], "grpo")  # two samples of each task: fine
    with pytest.raises(ValueError, match=r"train.samples_per_prompt >= 2"):
        check_group_sizes([ep for ep, _ in items[1:]], "rloo")  # "2 + 2" sampled once
    check_group_sizes([ep for ep, _ in items[1:]], "reinforce_pp")  # no groups needed


def test_whiten_degenerate_batches_are_finite() -> None:
    one = masked_whiten(torch.tensor([[3.0, 7.0]]), torch.tensor([[1.0, 0.0]]))
    assert torch.equal(one, torch.tensor([[0.0, 0.0]]))  # single token: centered only
    same = masked_whiten(torch.full((2, 3), 0.4), torch.ones(2, 3))
    assert same.abs().max() < 1e-3  # zero spread: divided by the floor eps, never by ~0
    empty = masked_whiten(torch.ones(2, 2), torch.zeros(2, 2))
    assert torch.equal(empty, torch.zeros(2, 2))
    # a spread below eps is scaled by 1/eps, not blown up to unit size
    tiny = masked_whiten(torch.tensor([[1.0, 1.0 + 2e-6]], dtype=torch.float64), torch.ones(1, 2))
    assert torch.allclose(tiny, torch.tensor([[-0.01, 0.01]], dtype=torch.float64))  # 1e-6/1e-4


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=40),
    st.sampled_from([1e-6, 1e-4, 1e-2]),
    st.data(),
)
def test_whiten_property(values: list[float], eps: float, data: st.DataObject) -> None:
    x = torch.tensor(values, dtype=torch.float64)[None, :]
    keep = data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values)))
    mask = torch.tensor(keep, dtype=torch.float64)[None, :]
    out = masked_whiten(x, mask, eps)
    assert torch.isfinite(out).all()
    assert (out[mask == 0] == 0).all()
    kept = x[mask > 0]
    if kept.numel() < 2:
        return
    sel = out[mask > 0]
    centered = kept - kept.mean()
    std = float(kept.std())
    assert abs(float(sel.mean())) < 1e-6
    # divided by max(std, eps): unit std when the spread is above the floor, else the
    # centered values over eps (never larger)
    assert torch.allclose(sel, centered / max(std, eps), atol=1e-9, rtol=1e-9)
    if std >= eps:
        assert abs(float(sel.std()) - 1.0) < 1e-6
    else:
        assert float(sel.std()) < 1.0 + 1e-9


LOGP = torch.tensor([[math.log(1.5), math.log(0.5), 0.0, 5.0]])  # last token is padding
OLD = torch.zeros(1, 4)
ADV = torch.tensor([[1.0, -1.0, 3.0, 100.0]])
LMASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


def test_policy_loss_symmetric_and_asymmetric_clip() -> None:
    loss, stats = policy_loss(LOGP, OLD, ADV, LMASK, LossConfig(0.2, 0.2))
    # t0: max(-1.5, -1.2)=-1.2 ; t1: max(0.5, 0.8)=0.8 ; t2: max(-3,-3)=-3 ; mean -3.4/3
    assert math.isclose(float(loss), -3.4 / 3, abs_tol=1e-6)
    assert math.isclose(stats["clip_frac"], 2 / 3, abs_tol=1e-6)
    assert math.isclose(
        stats["approx_kl"], 0.5 * (math.log(1.5) ** 2 + math.log(0.5) ** 2) / 3, abs_tol=1e-6
    )
    loss, _ = policy_loss(LOGP, OLD, ADV, LMASK, LossConfig(clip_eps_low=0.1, clip_eps_high=0.3))
    # t0: max(-1.5, -1.3)=-1.3 ; t1: max(0.5, 0.9)=0.9 ; t2: -3 ; mean -3.4/3
    assert math.isclose(float(loss), (-1.3 + 0.9 - 3) / 3, abs_tol=1e-6)
    loss_n, _ = policy_loss(LOGP, OLD, ADV, LMASK, LossConfig(), normalizer=6.0)
    assert math.isclose(float(loss_n), -3.4 / 6, abs_tol=1e-6)  # sum over a batch of 6 tokens


def test_policy_loss_sequence_mean_kl_in_loss_and_entropy() -> None:
    logp = torch.tensor([[math.log(1.5), math.log(0.5)], [0.0, 0.0]])
    adv = torch.tensor([[1.0, -1.0], [3.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = policy_loss(logp, torch.zeros(2, 2), adv, mask, LossConfig(agg="seq_mean"))
    # row0: (-1.2 + 0.8)/2 = -0.2 ; row1: -3/1 = -3 ; mean over rows (-3.2)/2 = -1.6
    assert math.isclose(float(loss), -1.6, abs_tol=1e-6)
    ref = torch.tensor([[0.0, 0.0], [-0.5, 0.0]])
    cfg = LossConfig(kl_beta_in_loss=0.5, kl_estimator="k1")
    loss, stats = policy_loss(
        logp,
        torch.zeros(2, 2),
        adv,
        mask,
        cfg,
        logp_ref=ref,
        entropy=torch.tensor([[1.0, 2.0], [3.0, 50.0]]),
    )
    # k1 per token: log1.5=.405465, log.5=-.693147, 0-(-0.5)=.5 ; token mean of
    # (-1.2+.5*.405465) + (0.8+.5*-.693147) + (-3+.5*.5) = -3.4 + 0.5*0.212318 -> /3
    assert math.isclose(float(loss), (-3.4 + 0.5 * 0.2123179) / 3, abs_tol=1e-6)
    assert math.isclose(stats["entropy"], 2.0, abs_tol=1e-6)  # (1+2+3)/3, padding ignored
    with pytest.raises(ValueError, match="reference"):
        policy_loss(logp, torch.zeros(2, 2), adv, mask, cfg)


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


def test_policy_loss_truncated_importance_weights_scale_the_policy_term_only() -> None:
    w = torch.tensor([[2.0, 0.5, 1.0, 7.0]])  # the last one sits on padding
    loss, stats = policy_loss(LOGP, OLD, ADV, LMASK, LossConfig(0.2, 0.2), is_weights=w)
    # clipped terms as above: -1.2, 0.8, -3 ; weighted: -2.4, 0.4, -3 ; mean -5.0/3
    assert math.isclose(float(loss), -5.0 / 3, abs_tol=1e-6)
    assert math.isclose(stats["clip_frac"], 2 / 3, abs_tol=1e-6)  # the weights clip nothing
    cfg = LossConfig(kl_beta_in_loss=0.5, kl_estimator="k1")
    ref = torch.zeros(1, 4)
    loss, _ = policy_loss(LOGP, OLD, ADV, LMASK, cfg, logp_ref=ref, is_weights=w)
    # KL term unweighted: + 0.5 * (log1.5 + log0.5 + 0) = 0.5 * -0.287682
    assert math.isclose(float(loss), (-5.0 + 0.5 * -0.2876821) / 3, abs_tol=1e-6)


DELTA = torch.tensor([0.0, 0.3, -0.2, 0.5, 0.0, 0.1, -0.4, 0.2])


def _drift(policy: FakeTablePolicy) -> None:
    """Move a's and b's tables away from the reference, as a previous step would have."""
    with torch.no_grad():
        policy.tables["a"] += DELTA
        policy.tables["b"] -= DELTA


def _episodes(
    policy: FakeTablePolicy,
    offsets: dict[str, float] | None = None,
    scores: tuple[float, ...] = (8.0, 3.0, 2.0, 9.0, 5.0),
) -> list[Episode]:
    """Two episodes. Each action's sampling log-probs are its agent's log-probs now plus the
    offset ``offsets[<episode>/<agent>]`` (a sampler's numerical gap; 0 by default).
    b's turn-1 action in e2 is flagged."""
    offsets = offsets or {}

    def act(ep: str, agent: str, turn: int, ids: list[int], score: float) -> Action:
        lp = torch.log_softmax(policy.tables[agent].detach(), -1)
        sample = (lp[ids] + offsets.get(f"{ep}/{agent}", 0.0)).tolist()
        flagged = turn == 1
        return Action(
            ep, agent, turn, [0], ids, sample, "p", "c", False, coach=Score(score, flagged=flagged)
        )

    s = scores
    e1 = Episode("e1", "t1", "task one", "1", correct=True)
    e1.actions = [act("e1", "a", 0, [1, 2, 3], s[0]), act("e1", "b", 0, [6, 7], s[1])]
    e2 = Episode("e2", "t2", "task two", "1", correct=False)
    e2.actions = [
        act("e2", "a", 0, [4, 5], s[2]),
        act("e2", "b", 0, [6], s[3]),
        act("e2", "b", 1, [2, 2], s[4]),
    ]
    return [e1, e2]


def _k1(policy: FakeTablePolicy, agent: str, ids: list[int]) -> list[float]:
    """log pi_agent - log pi_ref of each token: the k1 KL the experience should find."""
    lp = torch.log_softmax(policy.tables[agent].detach(), -1)
    return (lp[ids] - torch.log_softmax(policy.ref, -1)[ids]).tolist()


def test_experience_recomputes_old_logprobs_and_computes_the_kl_once() -> None:
    policy = FakeTablePolicy(["a", "b"])
    # sampled before the drift: the sampling log-probs are the reference's
    sampled = _episodes(policy)
    _drift(policy)
    items = scored_actions(sampled, exclude_flagged=True)
    assert [(a.agent, a.turn) for _, a in items] == [("a", 0), ("b", 0), ("a", 0), ("b", 0)]
    exp = make_experience(policy, items, RLConfig(), beta=0.1, temperature=1.0)
    # old log-probs per agent with its own adapter (micro-batch 4), then the reference
    # (adapters off) over the same per-agent micro-batches
    assert policy.calls == ["a", "b", None, None]
    ref = torch.log_softmax(policy.ref, -1)
    assert torch.allclose(exp.sample[0], ref[[1, 2, 3]])  # kept as sampled
    lp_a = torch.log_softmax(policy.tables["a"].detach(), -1)
    assert torch.allclose(exp.old[0], lp_a[[1, 2, 3]])  # recomputed, under the drifted table
    rows = [_k1(policy, "a", [1, 2, 3]), _k1(policy, "b", [6, 7]), _k1(policy, "a", [4, 5])]
    rows.append(_k1(policy, "b", [6]))
    expected_kl = torch.tensor([r + [0.0] * (3 - len(r)) for r in rows])  # 0 on padding
    assert torch.allclose(exp.kl, expected_kl, atol=1e-6)
    flat = [v for r in rows for v in r]
    assert math.isclose(exp.mean_kl(), sum(flat) / 8, abs_tol=1e-6)
    assert math.isclose(exp.mean_kl(exp.rows("a")), sum(rows[0] + rows[2]) / 5, abs_tol=1e-6)
    assert exp.advantages.shape == exp.returns.shape == exp.old.shape == (4, 3)
    # the gap: old - sample = the drift k1 on every token
    gap = exp.sampler_gap(None).metrics(None)
    assert math.isclose(gap["rl/logprob_gap_max"], max(abs(v) for v in flat), abs_tol=1e-6)
    assert math.isclose(gap["rl/logprob_gap_mean"], sum(abs(v) for v in flat) / 8, abs_tol=1e-6)
    assert "rl/tis_capped_frac" not in gap  # no cap, nothing capped to count


def test_experience_truncated_importance_weights() -> None:
    policy = FakeTablePolicy(["a", "b"])
    # a's e1 sample log-probs 1.0 below the training ones, b's e1 ones 0.5 above
    eps = _episodes(policy, offsets={"e1/a": -1.0, "e1/b": 0.5})
    items = scored_actions(eps, exclude_flagged=True)
    exp = make_experience(policy, items, RLConfig(tis_cap=2.0), beta=0.1, temperature=1.0)
    assert exp.is_weights is not None
    w = math.exp(-0.5)  # 0.606531
    expected = torch.tensor(
        [[2.0, 2.0, 2.0], [w, w, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    )  # min(e^1 = 2.718, 2) ; e^-0.5 ; on-policy 1 ; 0 on padding
    assert torch.allclose(exp.is_weights, expected, atol=1e-6)
    assert exp.sampler_gap(2.0).metrics(2.0) == pytest.approx(
        {
            "rl/logprob_gap_max": 1.0,
            "rl/logprob_gap_mean": (3 * 1.0 + 2 * 0.5) / 8,
            "rl/tis_capped_frac": 3 / 8,  # a's three tokens hit the cap
        }
    )
    off = make_experience(policy, items, RLConfig(tis_cap=None), beta=0.1, temperature=1.0)
    assert off.is_weights is None


def _mean_trainer_k1(policy: FakeTablePolicy) -> float:
    """Mean k1 of the trainer's tables against the reference over the trained tokens of
    ``_episodes`` (b's flagged action left out): what the KL rule measures."""
    rows = [_k1(policy, "a", [1, 2, 3]), _k1(policy, "b", [6, 7]), _k1(policy, "a", [4, 5])]
    rows.append(_k1(policy, "b", [6]))
    return sum(v for r in rows for v in r) / 8


@pytest.mark.parametrize("kl_beta", [0.1, 0.0])
def test_the_rewards_kl_is_the_trainers_whatever_the_sampler(kl_beta: float) -> None:
    """The KL rule (docs/algorithm.md §2): the policy side of the reward's KL is the
    trainer's old log-probs, from a pass before any step, on every path: the loop asks for
    no pass (``recompute_old`` false, as under ``rl.recompute_old_logprobs: auto`` for any
    engine) and the sampler stands off the trainer (another engine, another dtype). Without
    a KL nothing needs the old log-probs before the step: no pass, the update's forward
    supplies them."""
    policy = FakeTablePolicy(["a", "b"])
    _drift(policy)
    offsets = {"e1/a": 0.3, "e1/b": -0.2, "e2/a": 0.1, "e2/b": 0.4}  # the sampler's gap
    items = scored_actions(_episodes(policy, offsets=offsets), exclude_flagged=True)
    exp = make_experience(policy, items, RLConfig(kl_beta=kl_beta), kl_beta, 1.0, False)
    if kl_beta == 0.0:
        assert policy.calls == [] and exp.old is None and exp.kl is None
        return
    assert policy.calls == ["a", "b", None, None]  # the old pass, then the reference
    assert exp.kl is not None and exp.old is not None
    lp_a = torch.log_softmax(policy.tables["a"].detach(), -1)
    assert torch.equal(exp.old[0], lp_a[[1, 2, 3]])
    assert torch.allclose(exp.kl[0], torch.tensor(_k1(policy, "a", [1, 2, 3])), atol=1e-6)
    assert exp.mean_kl() == pytest.approx(_mean_trainer_k1(policy), abs=1e-6)


def test_with_the_kl_in_the_loss_beta_reads_the_kl_the_loss_penalises() -> None:
    """``kl_in_loss`` with a sampler that holds a copy (vLLM): the loss penalises
    k(log pi, log pi_ref) of the trainer, which at the first step's forward is the
    trainer's k(log pi_old, log pi_ref); the adaptive beta must read that same KL, not one
    taken on the sampling log-probs."""
    policy = FakeTablePolicy(["a", "b"])
    _drift(policy)
    expected = _mean_trainer_k1(policy)
    offsets = {"e1/a": 0.3, "e1/b": -0.2, "e2/a": 0.1, "e2/b": 0.4}
    cfg = RLConfig(kl_in_loss=True, kl_target=0.1, kl_horizon=100)
    kl_ctl = KLController(0.1, target=0.1, horizon=100)
    params = {n: [t] for n, t in policy.tables.items()}
    out = update_agents(
        policy,
        _episodes(policy, offsets=offsets),
        ["a", "b"],
        {n: torch.optim.SGD(p, lr=0.1) for n, p in params.items()},
        params,
        cfg,
        kl_ctl,
        exclude_flagged=True,
        temperature=1.0,
        recompute_old=False,  # as the loop asks under ``auto``, for every sampler
    )
    assert out["mean_kl"] == pytest.approx(expected, abs=1e-6)
    error = max(-0.2, min(0.2, (expected - 0.1) / 0.1))
    assert kl_ctl.beta == pytest.approx(0.1 * (1 + error * 8 / 100), rel=1e-6)


def test_a_kl_without_the_old_logprobs_is_refused() -> None:
    policy = FakeTablePolicy(["a", "b"])
    batch = build_batch(scored_actions(_episodes(policy), exclude_flagged=True), RLConfig())
    ref = torch.zeros_like(batch.sample)
    with pytest.raises(ValueError, match="old log-probs"):
        compute_advantages(batch, None, ref, RLConfig(), 0.1)


def test_no_second_step_over_one_experience_on_own_forward_old_logprobs() -> None:
    """The guard: only an agent's first optimizer step may take the old log-probs from its
    own forward; a second one over the same experience (a second mini-batch, or the step
    called again) would be an unclipped update against a policy that already moved."""
    policy = FakeTablePolicy(["a", "b"])
    items = scored_actions(_episodes(policy), exclude_flagged=True)
    params = [policy.tables["a"]]
    sgd = torch.optim.SGD(params, lr=0.1)
    cfg = RLConfig(kl_beta=0.0)
    single = make_experience(policy, items, cfg, 0.0, 1.0)
    assert single.old is None and len(single.layout["a"]) == 1  # the own forward serves it
    assert policy_step(policy, "a", single, sgd, params, cfg, 0.0).steps == 1
    with pytest.raises(StaleOldLogprobsError, match="'a' already took an optimizer step"):
        policy_step(policy, "a", single, sgd, params, cfg, 0.0)
    several = RLConfig(kl_beta=0.0, mini_batch_size=1)
    exp = make_experience(policy, items, several, 0.0, 1.0)
    assert exp.old is not None and len(exp.layout["a"]) == 2  # the pass before the first step
    before = policy.tables["a"].detach().clone()
    with pytest.raises(StaleOldLogprobsError):  # as if the pass were left out
        policy_step(policy, "a", dataclasses.replace(exp, old=None), sgd, params, several, 0.0)
    assert policy.tables["a"].detach().sub(before).abs().max() > 0  # the first step only
    assert policy_step(policy, "a", exp, sgd, params, several, 0.0).steps == 2


def test_each_update_empties_the_cuda_cache_for_the_engine_that_wakes_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fake CUDA (``is_available`` and ``empty_cache`` replaced): every agent's update ends
    by handing torch's cached blocks back, where a vLLM engine wakes next on the card."""
    emptied: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    policy = FakeTablePolicy(["a", "b"])
    items = scored_actions(_episodes(policy), exclude_flagged=True)
    cfg = RLConfig(kl_beta=0.0)
    exp = make_experience(policy, items, cfg, 0.0, 1.0)
    for n, agent in enumerate(["a", "b"], start=1):
        params = [policy.tables[agent]]
        policy_step(policy, agent, exp, torch.optim.SGD(params, lr=0.1), params, cfg, 0.0)
        assert len(emptied) == n


class FakeConcurrentTablePolicy(FakeTablePolicy):
    """A fake ``ConcurrentLogprobs``: records each batch of requests, then serves them."""

    def __init__(self, agents: list[str]) -> None:
        super().__init__(agents)
        self.batches: list[list[Any]] = []

    def completion_logprobs_many(self, requests: Any, temperature: float) -> list[Any]:
        self.batches.append(list(requests))
        return [
            self.completion_logprobs(r.agent, r.prompt_ids, r.completion_ids, temperature)
            for r in requests
        ]


def test_the_old_and_reference_passes_go_out_at_once_naming_each_rows_agent() -> None:
    """A policy that runs passes concurrently (Ray trainers) gets each pass's requests in one
    call, the reference's marked with the agent whose rows they are, and the experience is
    the one the pass-by-pass loop makes."""
    cfg = RLConfig(kl_beta=0.1, mini_batch_size=1, micro_batch_size=1)
    serial = FakeTablePolicy(["a", "b"])
    items = scored_actions(_episodes(serial), exclude_flagged=True)
    concurrent = FakeConcurrentTablePolicy(["a", "b"])
    concurrent.tables = serial.tables
    want = make_experience(serial, items, cfg, 0.1, 1.0)
    got = make_experience(concurrent, items, cfg, 0.1, 1.0)
    assert got.old is not None and want.old is not None and torch.equal(got.old, want.old)
    assert torch.equal(got.ref, want.ref)
    assert len(concurrent.batches) == 2  # the old pass, the reference pass
    old, ref = concurrent.batches
    assert [r.agent for r in old] == [r.owner for r in old] and len(old) > 2
    assert {r.agent for r in ref} == {None} and {r.owner for r in ref} == {"a", "b"}


def test_mini_batches_are_a_seeded_shuffle_of_every_row() -> None:
    from types import SimpleNamespace

    acts = [SimpleNamespace(prompt_ids=[0] * (i % 3 + 1), completion_ids=[0]) for i in range(10)]
    cfg = RLConfig(mini_batch_size=4, micro_batch_size=2)
    layout = step_layout(range(10), cfg, acts, "0/3/a")  # type: ignore[arg-type]
    assert layout == step_layout(range(10), cfg, acts, "0/3/a")  # type: ignore[arg-type]
    assert [sum(map(len, m)) for m in layout] == [4, 4, 2]
    rows = [i for m in layout for b in m for i in b]
    assert sorted(rows) == list(range(10)) and rows != list(range(10))
    others = {
        str(step_layout(range(10), cfg, acts, f"0/{s}/a"))  # type: ignore[arg-type]
        for s in range(4, 10)
    }
    assert len(others) > 1  # the order changes with the seed
    one = RLConfig(micro_batch_size=2)  # null: all rows, one step
    assert step_layout(range(10), one, acts, "x") == [micro_batches(range(10), 2, acts)]  # type: ignore[arg-type]


def test_micro_batches_hold_a_token_budget_in_every_pass() -> None:
    """With ``rl.micro_batch_tokens`` a micro-batch holds at most that many positions (rows x
    its longest row), a longer row alone, in the old and reference passes as in the update;
    the mini-batches are cut first (the same rows as without a budget)."""
    policy = FakeTablePolicy(["a"])
    lengths = [2, 9, 3, 7, 4, 8, 5, 6]  # prompt tokens; each completion is 1 token
    episodes = []
    for i, n in enumerate(lengths):
        ep = Episode(f"e{i}", f"t{i}", "task", "1", correct=bool(i % 2))
        ep.actions = [Action(f"e{i}", "a", 0, [0] * n, [1], [-1.0], "p", "c", False,
                             coach=Score(float(i), flagged=False))]  # fmt: skip
        episodes.append(ep)
    items = scored_actions(episodes, exclude_flagged=True)
    calls: list[list[int]] = []
    recorded = policy.completion_logprobs

    def record(agent, prompts, completions, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append([len(p) + len(c) for p, c in zip(prompts, completions, strict=True)])
        return recorded(agent, prompts, completions, *args, **kwargs)

    policy.completion_logprobs = record  # type: ignore[method-assign]
    budget, rows_only = 12, RLConfig(micro_batch_size=8, mini_batch_size=4, kl_beta=0.1)
    cfg = RLConfig(micro_batch_size=8, mini_batch_size=4, kl_beta=0.1, micro_batch_tokens=budget)
    exp = make_experience(policy, items, cfg, beta=0.1, temperature=1.0, seed="s")
    assert len(calls) == 2 * sum(len(mini) for mini in exp.layout["a"])  # old + reference
    assert all(len(c) == 1 or len(c) * max(c) <= budget for c in calls), calls
    assert any(len(c) > 1 for c in calls) and any(len(c) == 1 for c in calls)
    plain = make_experience(policy, items, rows_only, beta=0.1, temperature=1.0, seed="s")
    assert [sorted(i for m in mini for i in m) for mini in exp.layout["a"]] == [
        sorted(i for m in mini for i in m) for mini in plain.layout["a"]
    ]
    assert all(len(mini) == 1 for mini in plain.layout["a"])  # rows alone: one micro-batch
    sgd = torch.optim.SGD([policy.tables["a"]], lr=0.1)
    calls.clear()
    stats = policy_step(policy, "a", exp, sgd, [policy.tables["a"]], cfg, 0.1)
    assert stats.steps == len(exp.layout["a"]) == 2
    assert all(len(c) == 1 or len(c) * max(c) <= budget for c in calls), calls


def _update(
    policy: FakeTablePolicy,
    episodes: list[Episode],
    cfg: RLConfig,
    kl_ctl: KLController,
    agents: tuple[str, ...] = ("a", "b", "c"),
) -> dict[str, object]:
    optimizers = {n: torch.optim.Adam([t], lr=0.1) for n, t in policy.tables.items()}
    params = {n: [t] for n, t in policy.tables.items()}
    return update_agents(
        policy,
        episodes,
        list(agents),
        optimizers,
        params,
        cfg,
        kl_ctl,
        exclude_flagged=True,
        temperature=1.0,
    )


def test_update_agents_steps_each_agent_and_logs_the_step() -> None:
    policy = FakeTablePolicy(["a", "b", "c"])
    _drift(policy)
    before = {n: t.detach().clone() for n, t in policy.tables.items()}
    kl_ctl = KLController(0.1, target=0.1, horizon=100)
    rows = [_k1(policy, "a", [1, 2, 3]), _k1(policy, "b", [6, 7]), _k1(policy, "a", [4, 5])]
    rows.append(_k1(policy, "b", [6]))
    out = _update(policy, _episodes(policy), RLConfig(), kl_ctl)
    hidden = ("gap", "per_step")
    stat_keys = [
        f"rl/{n}/{f.name}" for n in "abc" for f in fields(UpdateStats) if f.name not in hidden
    ]
    assert list(out) == [
        "kl_beta",
        "trained_actions",
        *stat_keys,
        "mean_kl",
        "rl/logprob_gap_max",
        "rl/logprob_gap_mean",
        "rl/tis_capped_frac",
        "rl/unwhitened_scopes",
    ]
    assert out["kl_beta"] == 0.1 and out["trained_actions"] == 4  # beta used; flagged left out
    mean_kl = sum(v for r in rows for v in r) / 8
    assert out["mean_kl"] == pytest.approx(mean_kl, abs=1e-6)
    assert out["rl/a/mean_kl"] == pytest.approx(sum(rows[0] + rows[2]) / 5, abs=1e-6)
    assert (out["rl/a/actions"], out["rl/a/tokens"], out["rl/b/tokens"]) == (2, 5, 3)
    assert out["rl/c/skipped"] == "no actions" and out["rl/c/actions"] == 0
    assert out["rl/a/skipped"] == out["rl/b/skipped"] == ""
    # sampled from the tables trained on: no gap, no clipping
    assert out["rl/logprob_gap_max"] == 0.0 and out["rl/a/clip_frac"] == 0.0
    error = max(-0.2, min(0.2, (mean_kl - 0.1) / 0.1))
    assert math.isclose(kl_ctl.beta, 0.1 * (1 + error * 8 / 100), rel_tol=1e-6)
    assert not torch.equal(policy.tables["a"].detach(), before["a"])
    assert not torch.equal(policy.tables["b"].detach(), before["b"])
    assert torch.equal(policy.tables["c"].detach(), before["c"])

    assert _update(policy, [], RLConfig(), kl_ctl) == {
        "kl_beta": kl_ctl.beta,
        "trained_actions": 0,
        "mean_kl": None,
    }


def test_the_update_takes_old_logprobs_and_weights_from_its_own_forward() -> None:
    """Without a recompute pass each micro-batch's old log-probs are its own forward's,
    detached, and its importance weights are taken against the sampler there: the step and
    the logged gap are the recomputed update's (no KL, so no reward reads the old ones)."""
    offsets = {"e1/a": -1.0, "e1/b": 0.5}  # the sampler stands off the trainer
    cfg = RLConfig(tis_cap=2.0, kl_beta=0.0)
    tables, logged = {}, {}
    for recompute in (True, False):
        policy = FakeTablePolicy(["a", "b"])
        params = {n: [t] for n, t in policy.tables.items()}
        out = update_agents(
            policy,
            _episodes(policy, offsets=offsets),
            ["a", "b"],
            {n: torch.optim.SGD(p, lr=1.0) for n, p in params.items()},
            params,
            cfg,
            KLController(0.0),
            exclude_flagged=True,
            temperature=1.0,
            recompute_old=recompute,
        )
        assert out["rl/a/skipped"] == out["rl/b/skipped"] == ""
        assert policy.calls == (["a", "b"] if recompute else []) + ["a", "b"]  # + the update's
        tables[recompute] = {n: t.detach().clone() for n, t in policy.tables.items()}
        logged[recompute] = {k: v for k, v in out.items() if k.startswith("rl/")}
    for n in ("a", "b"):
        assert torch.allclose(tables[True][n], tables[False][n], atol=1e-7), n
    assert logged[False] == pytest.approx(logged[True])
    assert logged[False]["rl/tis_capped_frac"] == pytest.approx(3 / 8)


def test_an_agent_without_reward_signal_takes_no_step() -> None:
    policy = FakeTablePolicy(["a", "b"])
    _drift(policy)  # so the KL term is not zero: b's centered returns are small, not 0
    before = {n: t.detach().clone() for n, t in policy.tables.items()}
    # b's two trained actions tie at 3.0 (its turn-1 action is flagged out)
    out = _update(
        policy,
        _episodes(policy, scores=(8.0, 3.0, 2.0, 3.0, 5.0)),
        RLConfig(),
        KLController(0.1),
        ("a", "b"),
    )
    assert str(out["rl/b/skipped"]).startswith("no reward signal")
    assert out["rl/b/actions"] == 2 and out["rl/unwhitened_scopes"] == 1
    assert torch.equal(policy.tables["b"].detach(), before["b"])  # bit-identical
    assert not torch.equal(policy.tables["a"].detach(), before["a"])
    # a global scope with spread gives b signal through the others' rewards
    out = _update(
        policy,
        _episodes(policy, scores=(8.0, 3.0, 2.0, 3.0, 5.0)),
        RLConfig(norm_scope="global"),
        KLController(0.1),
        ("a", "b"),
    )
    assert out["rl/b/skipped"] == "" and out["rl/unwhitened_scopes"] == 0


def test_rewards_closer_than_min_reward_spread_take_no_step() -> None:
    policy = FakeTablePolicy(["a", "b"])
    _drift(policy)
    before = policy.tables["b"].detach().clone()
    # b's two trained actions score 3.0 and 3.05: rewards 0.3 and 0.305
    scores = (8.0, 3.0, 2.0, 3.05, 5.0)
    out = _update(
        policy, _episodes(policy, scores=scores), RLConfig(), KLController(0.1), ("a", "b")
    )
    assert str(out["rl/b/skipped"]).startswith("no reward signal")
    assert out["rl/unwhitened_scopes"] == 1
    assert torch.equal(policy.tables["b"].detach(), before)
    loose = RLConfig(min_reward_spread=0.0)
    out = _update(policy, _episodes(policy, scores=scores), loose, KLController(0.1), ("a", "b"))
    assert out["rl/b/skipped"] == "" and out["rl/unwhitened_scopes"] == 0


def test_a_run_without_kl_measures_and_logs_none() -> None:
    policy = FakeTablePolicy(["a", "b"])
    out = _update(policy, _episodes(policy), RLConfig(kl_beta=0.0), KLController(0.0), ("a", "b"))
    assert None not in policy.calls  # no reference pass at all
    assert out["mean_kl"] is None and out["rl/a/mean_kl"] is None and out["rl/b/mean_kl"] is None
    exp = make_experience(
        policy, scored_actions(_episodes(policy), True), RLConfig(kl_beta=0.0), 0.0, 1.0
    )
    assert exp.ref is None and exp.kl is None and exp.mean_kl() is None


def test_group_estimators_refuse_a_task_sampled_once() -> None:
    policy = FakeTablePolicy(["a", "b"])
    with pytest.raises(ValueError, match=r"rl.advantage=grpo .* train.samples_per_prompt >= 2"):
        _update(policy, _episodes(policy), RLConfig(advantage="grpo"), KLController(0.1))
    # the same episodes twice (two samples per task) train
    twice = _episodes(policy) + _episodes(policy, scores=(2.0, 9.0, 8.0, 1.0, 5.0))
    out = _update(policy, twice, RLConfig(advantage="rloo"), KLController(0.1), ("a", "b"))
    assert out["rl/a/skipped"] == out["rl/b/skipped"] == ""
    assert out["rl/singleton_groups"] == 0 and out["rl/flat_groups"] == 0


def test_rewards_without_coach_scores_ask_no_coach_and_train_every_action() -> None:
    """GRPO on outcomes (w_process 0) needs no coach, like outcome_only: the trainer asks
    none, so no action has a score; every action is trained, rewarded by its outcome."""
    cfg = RLConfig(advantage="grpo", w_process=0.0, w_outcome=1.0)
    assert not cfg.needs_coach and not RLConfig(advantage="outcome_only").needs_coach
    assert RLConfig(advantage="grpo").needs_coach and RLConfig(w_outcome=1.0).needs_coach
    policy = FakeTablePolicy(["a", "b"])
    episodes = _episodes(policy) + _episodes(policy)  # each task sampled twice
    for i, ep in enumerate(episodes):
        ep.correct = i in (0, 3)  # each task right once and wrong once: signal in each group
        for action in ep.actions:
            action.coach = None
    items = scored_actions(episodes, exclude_flagged=True, needs_score=cfg.needs_coach)
    assert len(items) == 10 and scored_actions(episodes, exclude_flagged=True) == []
    rewards = build_batch(items, cfg).groups.rewards.tolist()
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    out = _update(policy, episodes, cfg, KLController(0.1), ("a", "b"))
    assert out["trained_actions"] == 10
    assert out["rl/a/skipped"] == out["rl/b/skipped"] == ""


def test_a_reward_of_nothing_is_refused() -> None:
    for advantage in ("reinforce_pp", "grpo", "rloo"):
        with pytest.raises(ValueError, match="w_process and rl.w_outcome are both 0"):
            RLConfig(advantage=advantage, w_process=0.0)
    assert not RLConfig(advantage="outcome_only", w_process=0.0).needs_coach


def test_rl_imports_no_runner_trainer_evaluation_or_coach() -> None:
    code = "import sys, mappa.rl; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    forbidden = ("mappa.workflow.function", "mappa.run.loop", "mappa.run.evaluation", "mappa.coach")
    assert not [m for m in loaded if m.startswith(forbidden)]
