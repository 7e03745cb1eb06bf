"""Loss objects: gradients and x-Laplacians against finite differences, parameter checks."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.paper_losses import (
    abs_sin_2pi,
    abs_sin_2pi_loss,
    indicator_half_one,
    indicator_half_one_loss,
    relu,
    relu_loss,
)
from mechanisms.errors import ParameterError
from mechanisms.losses import (
    CheckLoss,
    HingeLoss,
    HuberLoss,
    LinearRegressionLoss,
    LogisticLoss,
    QuantileRegressionLoss,
    SquaredLoss,
    TransformSquaredLoss,
)

SIN = TransformSquaredLoss(
    lambda x: np.sin(x[:, 0]), lambda x: np.cos(x[:, 0]), lambda x: -np.sin(x[:, 0]), name="sin"
)


def _records(loss, rng, n=40):
    """Records and a parameter suited to each loss family."""
    if isinstance(loss, (SquaredLoss,)):
        x = rng.normal(size=(n, loss.dim))
        return x, rng.normal(size=loss.dim)
    if isinstance(loss, (CheckLoss, TransformSquaredLoss)):
        return rng.uniform(-1, 2, size=(n, 1)), np.array([0.3])
    x = rng.normal(size=(n, 3))
    if isinstance(loss, (LogisticLoss, HingeLoss)):
        x[:, -1] = rng.random(n) < 0.5
    return x, rng.normal(size=3)


ALL = [
    SquaredLoss(2),
    CheckLoss(0.3),
    SIN,
    relu_loss,
    indicator_half_one_loss,
    abs_sin_2pi_loss,
    LinearRegressionLoss(noised=(0, 1, 2)),
    LogisticLoss(noised=(0, 1)),
    HingeLoss(noised=(0,)),
    HuberLoss(0.8, noised=(1,)),
    QuantileRegressionLoss(0.7, noised=(0, 1)),
]
SMOOTH = [loss for loss in ALL if loss.smooth]


@pytest.mark.parametrize("loss", ALL, ids=lambda loss: loss.name)
def test_grad_matches_finite_differences(loss):
    rng = np.random.default_rng(1)
    x, theta = _records(loss, rng)
    x = loss.check_x(x)
    g = loss.grad(x, theta)
    assert g.shape == (x.shape[0], theta.size)
    assert loss.value(x, theta).shape == (x.shape[0],)
    h = 1e-6
    for k in range(theta.size):
        e = np.zeros(theta.size)
        e[k] = h
        fd = (loss.value(x, theta + e) - loss.value(x, theta - e)) / (2 * h)
        np.testing.assert_allclose(g[:, k], fd, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss", SMOOTH, ids=lambda loss: loss.name)
def test_laplacian_matches_finite_differences(loss):
    rng = np.random.default_rng(2)
    x, theta = _records(loss, rng)
    x = loss.check_x(x)
    w = rng.uniform(0.5, 2.0, size=len(loss.noised))
    lap = loss.laplacian_x(x, theta, w)
    h = 1e-4
    fd = np.zeros(x.shape[0])
    for wj, j in zip(w, loss.noised):
        xp, xm = x.copy(), x.copy()
        xp[:, j] += h
        xm[:, j] -= h
        fd += wj * (loss.value(xp, theta) - 2 * loss.value(x, theta) + loss.value(xm, theta)) / h**2
    np.testing.assert_allclose(lap, fd, rtol=1e-4, atol=1e-5)
    # θ-gradient of the Laplacian
    gl = loss.grad_laplacian_x(x, theta, w)
    assert gl.shape == (x.shape[0], theta.size)
    ht = 1e-6
    for k in range(theta.size):
        e = np.zeros(theta.size)
        e[k] = ht
        fdk = (loss.laplacian_x(x, theta + e, w) - loss.laplacian_x(x, theta - e, w)) / (2 * ht)
        np.testing.assert_allclose(gl[:, k], fdk, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "loss", [lo for lo in ALL if not lo.smooth and not isinstance(lo, TransformSquaredLoss)],
    ids=lambda lo: lo.name,
)
def test_nonsmooth_losses_refuse_laplacian(loss):
    rng = np.random.default_rng(3)
    x, theta = _records(loss, rng)
    with pytest.raises(ParameterError, match="DR is required"):
        loss.laplacian_x(x, theta, 1.0)


def test_paper_transforms():
    x = np.array([-0.5, 0.25, 0.5, 0.75, 1.0, 1.2])
    np.testing.assert_allclose(relu(x), [0, 0.25, 0.5, 0.75, 1.0, 1.2])
    np.testing.assert_allclose(indicator_half_one(x), [0, 0, 1, 1, 1, 0])
    np.testing.assert_allclose(abs_sin_2pi(x), np.abs(np.sin(2 * np.pi * x)), atol=1e-15)
    assert not relu_loss.smooth and not indicator_half_one_loss.smooth and not abs_sin_2pi_loss.smooth
    # a.e. derivatives (SL baseline of paper §7.1): d²/dx² |sin 2πx| = −4π²|sin 2πx| off the zeros
    xx = np.array([[0.1], [0.3], [0.7]])
    lap = abs_sin_2pi_loss.laplacian_x(xx, np.array([0.0]), 1.0)
    g, g1 = abs_sin_2pi(xx), 2 * np.pi * np.abs(np.cos(2 * np.pi * xx[:, 0]))
    np.testing.assert_allclose(lap, 2 * g1**2 - 2 * (0 - g) * (-4 * np.pi**2 * g))


def test_logistic_label_callable_makes_loss_dr_only():
    loss = LogisticLoss(noised=(0, 1), label=lambda x: x[:, 1] > 15, covariates=(0,))
    assert not loss.smooth
    x = np.array([[1.0, 20.0], [2.0, 3.0]])
    x = loss.check_x(x)
    assert loss.n_params(2) == 2
    np.testing.assert_allclose(loss.value(x, np.zeros(2)), np.log(2) * np.ones(2))


def test_linear_regression_laplacian_formula():
    loss = LinearRegressionLoss(noised=(0,))
    x = np.array([[1.0, 2.0, 3.0]])
    theta = np.array([0.5, -2.0, 3.0])
    # ∂²/∂x₀² (y − b0 − b1 x0 − b2 x1)² = 2 b1²
    assert loss.laplacian_x(x, theta, [0.7])[0] == pytest.approx(2 * 4.0 * 0.7)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: CheckLoss(0.0), "tau must be in"),
        (lambda: CheckLoss(1.2), "tau must be in"),
        (lambda: QuantileRegressionLoss(-0.1), "tau must be in"),
        (lambda: HuberLoss(0.0), "c must be"),
        (lambda: SquaredLoss(0), "dim must be"),
        (lambda: SquaredLoss(2, noised=(2,)), "noised"),
        (lambda: TransformSquaredLoss(3.0), "g must be callable"),
        (lambda: TransformSquaredLoss(np.sin, smooth=True), "requires both dg and d2g"),
        (lambda: LogisticLoss(noised=(-1,)), "noised"),
        (lambda: LogisticLoss(label=5), "label must be callable"),
    ],
)
def test_parameter_checks(make, match):
    with pytest.raises(ParameterError, match=match):
        make()


def test_record_checks():
    with pytest.raises(ParameterError, match="finite"):
        SquaredLoss().check_x([1.0, np.nan])
    with pytest.raises(ParameterError, match="logistic labels"):
        LogisticLoss().check_x([[0.1, 0.5]])
    with pytest.raises(ParameterError, match="cannot be noised"):
        LogisticLoss(noised=(1,)).check_x([[0.1, 1.0]])
    with pytest.raises(ParameterError, match="exactly 1 column"):
        CheckLoss().check_x(np.zeros((3, 2)))
    with pytest.raises(ParameterError, match="theta must have shape"):
        LinearRegressionLoss().check_theta([1.0], 3)


# ------------------------------------------------------------------ θ-Hessians (online one-step)
HESS = [loss for loss in ALL
        if loss.mean_hessian_theta(*_records(loss, np.random.default_rng(0))) is not None]
KINKED = [loss for loss in ALL if not loss.smooth_theta]


def test_hessian_families():
    """Analytic θ-Hessians exist exactly for the losses with a continuous θ-gradient."""
    assert {loss.name for loss in HESS} == {loss.name for loss in ALL if loss.smooth_theta}
    for loss in KINKED:
        x, theta = _records(loss, np.random.default_rng(0))
        assert loss.mean_hessian_theta(x, theta) is None


@pytest.mark.parametrize("loss", HESS, ids=lambda loss: loss.name)
def test_mean_hessian_matches_finite_differences_of_grad(loss):
    rng = np.random.default_rng(3)
    x, theta = _records(loss, rng, n=200)
    x = loss.check_x(x)
    H = loss.mean_hessian_theta(x, theta)
    q = theta.size
    assert H.shape == (q, q)
    np.testing.assert_allclose(H, H.T, atol=1e-12)
    h = 1e-6
    fd = np.empty((q, q))
    for k in range(q):
        e = np.zeros(q)
        e[k] = h
        fd[:, k] = (loss.grad(x, theta + e).mean(axis=0) - loss.grad(x, theta - e).mean(axis=0)) / (2 * h)
    # Huber's θ-gradient has kinks at |r| = c: none of the 200 records sits within 1e-6 of one
    np.testing.assert_allclose(H, fd, rtol=1e-5, atol=1e-6)


def test_logistic_hessian_formula():
    rng = np.random.default_rng(4)
    loss = LogisticLoss(noised=(0,))
    x, theta = _records(loss, rng, n=50)
    z = np.column_stack([np.ones(50), x[:, :2]])
    p = 1 / (1 + np.exp(-z @ theta))
    ref = sum(pi * (1 - pi) * np.outer(zi, zi) for pi, zi in zip(p, z)) / 50
    np.testing.assert_allclose(loss.mean_hessian_theta(x, theta), ref, rtol=1e-12)


@pytest.mark.parametrize("loss", KINKED, ids=lambda loss: loss.name)
def test_smoothed_hessian_ladder_matches_single_bandwidths(loss):
    rng = np.random.default_rng(5)
    x, theta = _records(loss, rng, n=300)
    x = loss.check_x(x)
    hs = np.array([1.0, 0.3, 0.05])
    lad = loss.smoothed_hessians(x, theta, hs)
    assert lad.shape == (3, theta.size, theta.size)
    for k, h in enumerate(hs):
        np.testing.assert_allclose(lad[k], loss.smoothed_hessian(x, theta, h), rtol=1e-12, atol=1e-15)


def test_smoothed_hessian_ladder_converges_to_the_density():
    """Median regression with N(0,1) errors: E K_h(r) z zᵀ → φ(0)·E z zᵀ as h → 0 (bias O(h²))."""
    rng = np.random.default_rng(6)
    n = 400_000
    a = rng.uniform(-1, 1, n)
    x = np.column_stack([a, 1 + 2 * a + rng.standard_normal(n)])
    loss = QuantileRegressionLoss(0.5, noised=(0, 1))
    lad = loss.smoothed_hessians(x, np.array([1.0, 2.0]), [0.5, 0.1])
    ez = np.array([[1.0, 0.0], [0.0, 1.0 / 3.0]])
    # convolution of N(0,1) with N(0,h²) at 0: 1/sqrt(2π(1+h²)); SE of the kernel mean < 0.3 %
    for k, h in enumerate((0.5, 0.1)):
        np.testing.assert_allclose(lad[k], ez / np.sqrt(2 * np.pi * (1 + h * h)), rtol=0.02, atol=5e-3)


def test_losses_without_smoothed_hessian_return_none():
    x, theta = _records(relu_loss, np.random.default_rng(7))
    assert relu_loss.smoothed_hessians(x, theta, [0.1, 0.2]) is None
    lg = LogisticLoss()
    assert lg.smoothed_hessians(*_records(lg, np.random.default_rng(7)), [0.1]) is None
