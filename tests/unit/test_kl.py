"""Unit tests for horizonrl.algos.kl. Golden values are worked out by hand."""

import math

import pytest
import torch

from horizonrl.algos.kl import kl_estimate, kl_in_reward

torch.set_num_threads(1)

TOL = dict(rtol=1e-6, atol=1e-6)

# two tokens: d = logp - logp_ref = 0.3 and -0.5
LOGP = torch.tensor([-0.7, -2.1], dtype=torch.float64)
LOGP_REF = torch.tensor([-1.0, -1.6], dtype=torch.float64)

EXPECTED = {
    "k1": [0.3, -0.5],
    "k2": [0.5 * 0.3 * 0.3, 0.5 * 0.5 * 0.5],  # 0.045, 0.125
    # k3 = exp(-d) - 1 + d ; e^-0.3 = 0.7408182206817179, e^0.5 = 1.6487212707001282
    "k3": [0.7408182206817179 - 1.0 + 0.3, 1.6487212707001282 - 1.0 - 0.5],  # 0.04081822, 0.14872127
}


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_by_hand(estimator):
    out = kl_estimate(LOGP, LOGP_REF, estimator)
    torch.testing.assert_close(out, torch.tensor(EXPECTED[estimator], dtype=torch.float64), **TOL)


def test_kl_estimators_float32():
    out = kl_estimate(LOGP.float(), LOGP_REF.float(), "k3")
    torch.testing.assert_close(out, torch.tensor(EXPECTED["k3"], dtype=torch.float32), **TOL)


def test_default_estimator_is_k1():
    torch.testing.assert_close(kl_estimate(LOGP, LOGP_REF), torch.tensor(EXPECTED["k1"], dtype=torch.float64))


def test_k3_is_nonnegative():
    gen = torch.Generator().manual_seed(0)
    for scale in (1e-6, 1e-3, 0.1, 1.0, 5.0, 20.0):
        for dtype in (torch.float32, torch.float64):
            logp = (torch.randn(20000, generator=gen) * scale).to(dtype)
            logp_ref = (torch.randn(20000, generator=gen) * scale).to(dtype)
            out = kl_estimate(logp, logp_ref, "k3")
            assert torch.all(out >= 0), (scale, dtype, out.min().item())
    zero = kl_estimate(torch.tensor([-1.3]), torch.tensor([-1.3]), "k3")
    assert zero.item() == 0.0


def test_unknown_estimator_raises():
    with pytest.raises(ValueError):
        kl_estimate(LOGP, LOGP_REF, "k4")


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_in_reward_scales_by_minus_beta_and_masks(estimator):
    logp_old = torch.tensor([[-0.7, -2.1, -0.4]], dtype=torch.float64)
    logp_ref = torch.tensor([[-1.0, -1.6, -3.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    beta = 0.05
    out = kl_in_reward(logp_old, logp_ref, mask, beta, estimator)
    e0, e1 = EXPECTED[estimator]
    expected = torch.tensor([[-0.05 * e0, -0.05 * e1, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(out, expected, **TOL)
    assert out[0, 2].item() == 0.0


def test_k3_bounds_the_log_ratio_at_20_and_the_estimate_at_10_as_verl_does():
    """d = logp - logp_ref = -95 and +95 (float32, where exp(95) overflows to inf): the log-ratio is clamped to
    [-20, 20] and k3 itself to [-10, 10] (verl's kl_penalty, "low_var_kl"), so k3(-95) = 10 where the log-ratio
    bound alone gave e^20 - 21 = 4.85e8, a loss term that swamps the step; k3(95) = min(e^-20 + 19, 10) = 10;
    d = -3 gives e^3 - 4 = 16.1, also past the bound: 10. No gradient flows beyond either bound. Inside both,
    d = -2 keeps the exact k3 = e^2 - 1 - 2 and its gradient d k3 / d logp = 1 - e^-d = 1 - e^2."""
    logp = torch.tensor([-100.0, -5.0, -4.0, -3.0], requires_grad=True)
    logp_ref = torch.tensor([-5.0, -100.0, -1.0, -1.0])
    k3 = kl_estimate(logp, logp_ref, "k3")
    torch.testing.assert_close(k3, torch.tensor([10.0, 10.0, 10.0, math.exp(2) - 3]), rtol=1e-6, atol=1e-6)
    k3.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 0.0, 0.0, 1 - math.exp(2)]), rtol=1e-6, atol=1e-6)
