"""KL estimators, registered by name, and the KL coefficient controller.

Every per-token KL estimate in ``mappa.rl`` goes through ``kl_estimate``. An estimator is a
pure function of the log-ratio ``d = log pi - log pi_ref`` of the sampled token
(Schulman, "Approximating KL divergence", 2020): the MAPPA reward uses ``k1`` (the paper's,
``DEFAULT_KL_ESTIMATOR``); ``rl.kl_estimator`` picks another.

Clamps (as verl's ``kl_penalty``):

- ``d`` is clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` = [-20, 20] before any
  estimator. A log-ratio of 20 is a probability ratio of e^20 ~ 4.9e8; sampled tokens in
  training typically have |d| < 1, so no number in a normal range changes; the clamp only
  keeps an extreme or infinite reference log-prob (a token the reference all but forbids)
  from turning the token rewards, returns and whitening into inf or nan. verl applies this
  clamp inside k3 only; here it holds for every estimator, so k1 and k2 are guarded too.
- ``k3`` is clamped to ``[-K3_CLAMP, K3_CLAMP]`` = [-10, 10] (k3 >= 0, so in effect
  ``<= 10``): exp(-d) grows fast for negative d; k3 reaches 10 at d ~ -2.6 (the reference
  13.6 times likelier than the policy) or d ~ 11. verl clamps the same way.

Both clamps cut the gradient outside their range, as in verl; that matters only when the KL
lives in the loss (``rl.kl_in_loss``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mappa.rl.registry import Registry

KLEstimator = Callable[[torch.Tensor], torch.Tensor]
"""Per-token estimate of KL(pi || pi_ref) from the (clamped) log-ratio ``d``."""

KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")
register_kl_estimator = KL_ESTIMATORS.register
get_kl_estimator = KL_ESTIMATORS.lookup

DEFAULT_KL_ESTIMATOR = "k1"
"""The paper's estimator; the default of ``RLConfig.kl_estimator`` and ``LossConfig``."""

LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


@register_kl_estimator("k1")
def k1(d: torch.Tensor) -> torch.Tensor:
    """k1 = d: unbiased, can be negative (MAPPA's reference code).

    >>> k1(torch.tensor([0.5, -0.5])).tolist()
    [0.5, -0.5]
    """
    return d


@register_kl_estimator("k2")
def k2(d: torch.Tensor) -> torch.Tensor:
    """k2 = d^2 / 2: biased, low variance, non-negative.

    >>> k2(torch.tensor([0.5, -2.0])).tolist()
    [0.125, 2.0]
    """
    return 0.5 * d**2


@register_kl_estimator("k3")
def k3(d: torch.Tensor) -> torch.Tensor:
    """k3 = exp(-d) - 1 + d: unbiased and non-negative; clamped to [-10, 10].

    >>> [round(x, 6) for x in k3(torch.tensor([0.5, 0.0, -5.0])).tolist()]
    [0.106531, 0.0, 10.0]
    """
    return torch.clamp(torch.expm1(-d) + d, -K3_CLAMP, K3_CLAMP)


def kl_estimate(
    logp: torch.Tensor, logp_ref: torch.Tensor, estimator: str = DEFAULT_KL_ESTIMATOR
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' log-probs.

    The log-ratio is clamped to [-20, 20] first (see the module docstring).

    >>> kl_estimate(torch.tensor([-1.0]), torch.tensor([-1.5])).tolist()  # k1
    [0.5]
    >>> kl_estimate(torch.tensor([0.0]), torch.tensor([-float("inf")]), "k2").tolist()
    [200.0]
    """
    fn = get_kl_estimator(estimator)
    return fn(torch.clamp(logp - logp_ref, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


class KLController:
    """The KL coefficient beta: fixed, or adapted toward a target KL (Ziegler et al. 2019).

    Adaptive update after each step: beta *= 1 + clip((kl - target) / target, -0.2, 0.2) * n /
    horizon, with ``n`` the tokens of the step, so beta grows when the policy drifts too far.

    >>> ctl = KLController(0.1, target=0.05, horizon=100)
    >>> round(ctl.update(observed_kl=0.1, n_tokens=50), 6)  # error clipped to +0.2
    0.11
    """

    def __init__(self, beta: float, target: float | None = None, horizon: int = 10_000) -> None:
        self.beta = beta
        self.target = target
        self.horizon = horizon

    def update(self, observed_kl: float, n_tokens: int) -> float:
        if self.target is not None:
            error = max(-0.2, min(0.2, (observed_kl - self.target) / self.target))
            self.beta *= 1.0 + error * n_tokens / self.horizon
        return self.beta
