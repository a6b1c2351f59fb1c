"""KL estimators between the sampling policy and the reference policy, per token.

With d = logp - logp_ref evaluated at tokens sampled from the policy (Schulman's estimators of
KL(pi || pi_ref)):
    k1 = d                        unbiased, can be negative
    k2 = d^2 / 2                  biased, low variance
    k3 = exp(-d) - 1 + d          unbiased, always >= 0
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3"]


def kl_estimate(logp: Tensor, logp_ref: Tensor, estimator: KLEstimator = "k1") -> Tensor:
    """Per-token KL estimate (see module docstring); same shape as the inputs."""
    d = logp - logp_ref
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.expm1(-d) + d
    raise ValueError(f"unknown KL estimator {estimator!r}; expected k1, k2 or k3")


def kl_in_reward(logp_old: Tensor, logp_ref: Tensor, mask: Tensor, beta: float, estimator: KLEstimator) -> Tensor:
    """Token rewards from the KL penalty: -beta * kl(logp_old, logp_ref) on every sampled token."""
    return -beta * kl_estimate(logp_old, logp_ref, estimator) * mask
