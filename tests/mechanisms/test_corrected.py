"""Corrected losses: unbiasedness identities (docs/mechanisms.md §2.3–§2.5) by Monte Carlo, SE-based
tolerances."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.paper_losses import abs_sin_2pi_loss, indicator_half_one_loss, relu_loss
from mechanisms.corrected import corrected_loss
from mechanisms.errors import ParameterError
from mechanisms.losses import (
    CheckLoss,
    HingeLoss,
    LogisticLoss,
    QuantileRegressionLoss,
    SquaredLoss,
    TransformSquaredLoss,
)
from mechanisms.zil import ZILMechanism

SIN = TransformSquaredLoss(
    lambda x: np.sin(3 * x[:, 0]), lambda x: 3 * np.cos(3 * x[:, 0]), lambda x: -9 * np.sin(3 * x[:, 0])
)


def _assert_unbiased(diff: np.ndarray) -> None:
    """mean(diff) within 4 standard errors of 0."""
    se = diff.std(ddof=1) / np.sqrt(diff.size)
    assert abs(diff.mean()) < 4 * se, (diff.mean(), se)


def _one_dim(rng, n, zero_prob=0.2, scale=0.6):
    mech = ZILMechanism(zero_prob, scale, 0.0, 1.0)
    x = rng.uniform(0, 1, size=(n, 1))
    x1 = mech.privatize(x, rng)
    return mech, x, x1, mech.double(x1, rng)


@pytest.mark.parametrize(
    "loss", [relu_loss, indicator_half_one_loss, abs_sin_2pi_loss, CheckLoss(0.3), SIN],
    ids=lambda lo: lo.name,
)
def test_dr_is_unbiased_for_any_continuous_loss(loss):
    rng = np.random.default_rng(10)
    mech, x, x1, x2 = _one_dim(rng, 400_000)
    c = corrected_loss(loss, "dr", mech.zero_prob)
    theta = np.array([0.4])
    _assert_unbiased(c.value(x1, x2, theta) - loss.value(x, theta))
    g = c.grad(x1, x2, theta) - loss.grad(x, theta)
    _assert_unbiased(g[:, 0])


@pytest.mark.parametrize("method", ["sl", "sdr"])
def test_sl_and_sdr_are_unbiased_for_a_smooth_loss(method):
    rng = np.random.default_rng(11)
    mech, x, x1, x2 = _one_dim(rng, 400_000)
    c = corrected_loss(SIN, method, mech.zero_prob, mech.noise_variance)
    theta = np.array([0.2])
    _assert_unbiased(c.value(x1, x2, theta) - SIN.value(x, theta))
    _assert_unbiased((c.grad(x1, x2, theta) - SIN.grad(x, theta))[:, 0])


def test_naive_is_biased_for_the_same_loss():
    """The identity tests above can fail: the uncorrected loss is detectably biased."""
    rng = np.random.default_rng(12)
    _mech, x, x1, x2 = _one_dim(rng, 400_000)
    c = corrected_loss(SIN, "naive")
    theta = np.array([0.2])
    d = c.value(x1, x2, theta) - SIN.value(x, theta)
    assert abs(d.mean()) > 10 * d.std() / np.sqrt(d.size)


@pytest.mark.parametrize("method", ["dr", "sdr", "sl"])
def test_logistic_corrected_losses_unbiased(method):
    rng = np.random.default_rng(13)
    n = 300_000
    mech = ZILMechanism(0.3, 0.15, [-3, -3], [3, 3])
    x = np.clip(rng.normal(size=(n, 2)), -3, 3)
    y = (rng.random(n) < 1 / (1 + np.exp(-(0.3 + x @ [1.0, -1.0])))).astype(float)
    x1 = mech.privatize(x, rng)
    x2 = mech.double(x1, rng)
    loss = LogisticLoss(noised=(0, 1))
    c = corrected_loss(loss, method, mech.zero_prob, mech.noise_variance)
    theta = np.array([0.2, 0.8, -1.2])
    r, r1, r2 = np.c_[x, y], np.c_[x1, y], np.c_[x2, y]
    _assert_unbiased(c.value(r1, r2, theta) - loss.value(r, theta))
    g = c.grad(r1, r2, theta) - loss.grad(r, theta)
    for k in range(3):
        _assert_unbiased(g[:, k])


@pytest.mark.parametrize("loss", [QuantileRegressionLoss(0.5, noised=(0,)), HingeLoss(noised=(0,))])
def test_dr_unbiased_for_kinked_regression_losses(loss):
    rng = np.random.default_rng(14)
    n = 300_000
    mech = ZILMechanism(0.25, 0.2, -2.0, 2.0)
    x = np.clip(rng.normal(size=(n, 1)), -2, 2)
    y = (x[:, 0] + rng.normal(size=n) > 0).astype(float)
    x1 = mech.privatize(x, rng)
    x2 = mech.double(x1, rng)
    c = corrected_loss(loss, "dr", mech.zero_prob)
    theta = np.array([0.1, 0.7])
    _assert_unbiased(c.value(np.c_[x1, y], np.c_[x2, y], theta) - loss.value(np.c_[x, y], theta))


def test_bernoulli_variance_identities():
    """docs/mechanisms.md §3.1 / paper §6 (Bernoulli model): Var X̃₁ = Var X + (1−δ)σ², Var X̃₂ = Var X + σ²,
    i.e. the variances of the SDR (mean of X̃₁) and SL (mean of X̃₂) estimators of a mean."""
    rng = np.random.default_rng(15)
    n, p, d, lam = 400_000, 0.3, 0.2, 0.8
    mech = ZILMechanism(d, lam, 0.0, 1.0)
    x = (rng.random((n, 1)) < p).astype(float)
    x1 = mech.privatize(x, rng)
    x2 = mech.double(x1, rng)
    for sample, target in ((x1[:, 0], p * (1 - p) + (1 - d) * lam**2), (x2[:, 0], p * (1 - p) + lam**2)):
        c = sample - sample.mean()
        v = np.mean(c**2)
        se = np.sqrt((np.mean(c**4) - v**2) / n)
        assert abs(v - target) < 4 * se, (v, target, se)


def test_sdr_squared_loss_gradient_is_the_mean_of_x1():
    rng = np.random.default_rng(16)
    mech, _, x1, x2 = _one_dim(rng, 1000)
    c = corrected_loss(SquaredLoss(), "sdr", mech.zero_prob, mech.noise_variance)
    theta = np.array([x1.mean()])
    assert abs(c.mean_grad(x1, x2, theta)[0]) < 1e-12


def test_errors():
    with pytest.raises(ParameterError, match="DR is required"):
        corrected_loss(CheckLoss(), "sdr", 0.2, 1.0)
    with pytest.raises(ParameterError, match="DR is required"):
        corrected_loss(relu_loss, "sl", None, 1.0)
    with pytest.raises(ParameterError, match="method must be one of"):
        corrected_loss(SquaredLoss(), "dR", 0.2)
    with pytest.raises(ParameterError, match=r"zero_prob must be in \(0, 1\)"):
        corrected_loss(SquaredLoss(), "dr", 1.2)
    with pytest.raises(ParameterError, match="zero_prob is required"):
        corrected_loss(SquaredLoss(), "dr")
    with pytest.raises(ParameterError, match="noise_var is required"):
        corrected_loss(SquaredLoss(), "sl")
    with pytest.raises(ParameterError, match="noise_var must be >= 0"):
        corrected_loss(SquaredLoss(), "sl", None, -1.0)
    with pytest.raises(ParameterError, match="noise_var must be a scalar or have shape"):
        corrected_loss(SquaredLoss(2), "sl", None, [1.0, 2.0, 3.0])
    with pytest.raises(ParameterError, match="loss must be"):
        corrected_loss("squared", "dr", 0.2)
