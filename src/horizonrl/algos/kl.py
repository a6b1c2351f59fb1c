"""KL estimators between the sampling policy and the reference policy, per token.

With d = logp - logp_ref evaluated at tokens sampled from the policy (Schulman's estimators of
KL(pi || pi_ref)):
    k1 = d                        unbiased, can be negative
    k2 = d^2 / 2                  biased, low variance
    k3 = exp(-d) - 1 + d          unbiased, always >= 0; d clamped to [-20, 20] first, k3 to [-10, 10] after

Every log-ratio that is exponentiated (k3 here, PPO's rho in losses.py) is first clamped to
[-LOG_RATIO_BOUND, LOG_RATIO_BOUND] = [-20, 20], verl's bound: exp(20) ~ 4.9e8 is finite, where exp in
float32 or bfloat16 overflows to inf past ~88.7 (an inf k3 makes the loss inf and its gradient NaN). Beyond
the bound the estimate is the bound's and its gradient 0. k3 itself is then clamped to [-K3_BOUND, K3_BOUND] =
[-10, 10], as verl's kl_penalty ("low_var_kl") does: the log-ratio bound alone leaves k3(-20) = e^20 - 21 = 4.85e8,
a loss term that swamps the step; k3 reaches 10 at d = -2.61 and d = 11 (past those, gradient 0). The clamp
simplifies: beyond it k3 no longer estimates the KL, it only says "far".
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3"]
LOG_RATIO_BOUND = 20.0
K3_BOUND = 10.0


def bounded_log_ratio(logp: Tensor, logp_other: Tensor) -> Tensor:
    """clamp(logp - logp_other, -LOG_RATIO_BOUND, LOG_RATIO_BOUND): a log-ratio safe to exponentiate."""
    return (logp - logp_other).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def kl_estimate(logp: Tensor, logp_ref: Tensor, estimator: KLEstimator = "k1") -> Tensor:
    """Per-token KL estimate (see module docstring); same shape as the inputs."""
    d = logp - logp_ref
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        d = bounded_log_ratio(logp, logp_ref)
        return (torch.expm1(-d) + d).clamp(-K3_BOUND, K3_BOUND)
    raise ValueError(f"unknown KL estimator {estimator!r}; expected k1, k2 or k3")


def kl_in_reward(logp_old: Tensor, logp_ref: Tensor, mask: Tensor, beta: float, estimator: KLEstimator) -> Tensor:
    """Token rewards from the KL penalty: -beta * kl(logp_old, logp_ref) on every sampled token."""
    return -beta * kl_estimate(logp_old, logp_ref, estimator) * mask
