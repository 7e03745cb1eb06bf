"""m_estimate, closed forms, DR CDF/quantiles, variance: exactness, consistency and bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from benchmarks.paper_losses import relu, relu_loss
from mechanisms.corrected import corrected_loss
from mechanisms.errors import ConvergenceWarning, ParameterError
from mechanisms.estimation import MEstimate, dr_cdf, dr_quantile, m_estimate, variance_estimate
from mechanisms.losses import (
    CheckLoss,
    LinearRegressionLoss,
    LogisticLoss,
    QuantileRegressionLoss,
    SquaredLoss,
    TransformSquaredLoss,
)
from mechanisms.zil import ZILMechanism


def _uniform(rng, n, d=0.2, lam=0.5):
    mech = ZILMechanism(d, lam, 0.0, 1.0)
    x = rng.uniform(0, 1, (n, 1))
    x1 = mech.privatize(x, rng)
    return mech, x, x1, mech.double(x1, rng)


def test_squared_loss_closed_forms_are_exact():
    rng = np.random.default_rng(20)
    mech, _x, x1, x2 = _uniform(rng, 500)
    d = mech.zero_prob
    kw = {"zero_prob": d, "scale": mech.coord_scale}
    sdr_theta = m_estimate(SquaredLoss(), x1, x2, method="sdr", **kw).theta[0]
    assert sdr_theta == pytest.approx(x1.mean(), abs=1e-14)
    sl_theta = m_estimate(SquaredLoss(), x1, x2, method="sl", **kw).theta[0]
    assert sl_theta == pytest.approx(x2.mean(), abs=1e-14)
    dr = m_estimate(SquaredLoss(), x1, x2, method="dr", **kw)
    assert dr.theta[0] == pytest.approx((x1.mean() - (1 - d) * x2.mean()) / d, abs=1e-12)
    # sandwich for a mean = variance of the per-record pseudo-values / n
    pseudo = (x1[:, 0] - (1 - d) * x2[:, 0]) / d
    assert dr.stderr[0] == pytest.approx(pseudo.std() / np.sqrt(500), rel=1e-6)
    sdr = m_estimate(SquaredLoss(), x1, x2, method="sdr", **kw)
    assert sdr.stderr[0] == pytest.approx(x1.std() / np.sqrt(500), rel=1e-6)
    assert sdr.converged and sdr.method == "sdr" and sdr.n == 500


def test_transform_dr_closed_form_minimises_the_corrected_objective():
    rng = np.random.default_rng(21)
    mech, _, x1, x2 = _uniform(rng, 800)
    d = mech.zero_prob
    est = m_estimate(relu_loss, x1, x2, zero_prob=d)
    assert est.theta[0] == pytest.approx((relu(x1).mean() - (1 - d) * relu(x2).mean()) / d, abs=1e-12)
    c = corrected_loss(relu_loss, "dr", d)
    assert abs(c.mean_grad(x1, x2, est.theta)[0]) < 1e-10


def test_smooth_transform_sdr_closed_form_matches_numerical_minimum():
    rng = np.random.default_rng(22)
    mech, _, x1, x2 = _uniform(rng, 800)
    loss = TransformSquaredLoss(
        lambda x: np.sin(2 * x[:, 0]), lambda x: 2 * np.cos(2 * x[:, 0]), lambda x: -4 * np.sin(2 * x[:, 0])
    )
    for method in ("sdr", "sl"):
        est = m_estimate(loss, x1, x2, zero_prob=mech.zero_prob, scale=mech.coord_scale, method=method)
        c = corrected_loss(loss, method, mech.zero_prob, mech.noise_variance)
        assert abs(c.mean_grad(x1, x2, est.theta)[0]) < 1e-10


def test_variance_estimate_formula():
    rng = np.random.default_rng(23)
    _mech, _x, x1, _ = _uniform(rng, 200_000, d=0.2, lam=0.4)
    est = variance_estimate(x1, zero_prob=0.2, scale=0.4)
    m1 = x1.mean()
    assert est.theta[0] == pytest.approx(np.mean(x1**2) - 0.8 * 0.16 - m1**2, abs=1e-12)
    assert abs(est.theta[0] - 1 / 12) < 4 * est.stderr[0]


def test_linear_regression_sdr_closed_form():
    rng = np.random.default_rng(24)
    n = 50_000
    mech = ZILMechanism(0.2, 0.1, [-3, -3], [3, 3])
    x = np.clip(rng.normal(size=(n, 2)), -3, 3)
    y = 1.0 + x @ [2.0, -1.0] + rng.normal(size=n)
    x1 = mech.privatize(x, rng)
    x2 = mech.double(x1, rng)
    s2 = mech.noise_variance
    z = np.c_[np.ones(n), x1]
    G = z.T @ z / n - 0.8 * np.diag([0.0, *s2])
    beta = np.linalg.solve(G, z.T @ y / n)
    est = m_estimate(LinearRegressionLoss(noised=(0, 1)), np.c_[x1, y], np.c_[x2, y], zero_prob=0.2,
                     scale=mech.coord_scale, method="sdr")
    np.testing.assert_allclose(est.theta, beta, rtol=1e-10)
    assert np.all(np.abs(est.theta - [1, 2, -1]) < 4 * est.stderr)
    naive = m_estimate(LinearRegressionLoss(noised=(0, 1)), np.c_[x1, y], method="naive")
    assert abs(naive.theta[1] - 2) > 6 * naive.stderr[1]  # attenuation: the test can fail


def test_dr_cdf_unbiased_at_several_points():
    rng = np.random.default_rng(25)
    n = 200_000
    _mech, _x, x1, x2 = _uniform(rng, n, d=0.25, lam=0.5)
    ts = np.array([0.1, 0.4, 0.75])
    F = dr_cdf(x1, x2, ts, 0.25)
    d = 0.25
    for t, f in zip(ts, F):
        psi = ((x1[:, 0] <= t) - (1 - d) * (x2[:, 0] <= t)) / d
        se = psi.std() / np.sqrt(n)
        assert abs(f - t) < 4 * se, (t, f, se)
    assert isinstance(dr_cdf(x1, x2, 0.5, 0.25), float)


def test_dr_quantile_consistent_and_isotonic():
    rng = np.random.default_rng(26)
    _mech, _, x1, x2 = _uniform(rng, 100_000, d=0.3, lam=0.3)
    est = dr_quantile(x1, x2, [0.1, 0.5, 0.9], 0.3)
    truth = np.array([0.1, 0.5, 0.9])
    assert np.all(np.abs(est.theta - truth) < 4 * est.stderr)
    assert np.all(np.diff(est.theta) > 0)
    assert est.cov.shape == (3, 3)
    # the exact DR check-loss minimiser agrees to within a standard error
    chk = m_estimate(CheckLoss(0.5), x1, x2, zero_prob=0.3)
    assert abs(chk.theta[0] - est.theta[1]) < est.stderr[1]


def test_x2_is_drawn_when_missing():
    _mech, _, x1, _ = _uniform(np.random.default_rng(27), 2000)
    a = m_estimate(SquaredLoss(), x1, zero_prob=0.2, scale=0.5, method="dr", rng=5)
    b = m_estimate(SquaredLoss(), x1, zero_prob=0.2, scale=0.5, method="dr", rng=5)
    c = m_estimate(SquaredLoss(), x1, zero_prob=0.2, scale=0.5, method="dr", rng=6)
    assert a.theta[0] == b.theta[0] != c.theta[0]


def test_iterative_logistic_fits_stationary_and_warns_on_failure():
    rng = np.random.default_rng(28)
    n = 3000
    mech = ZILMechanism(0.3, 0.1, [-3, -3], [3, 3])
    x = np.clip(rng.normal(size=(n, 2)), -3, 3)
    y = (rng.random(n) < 1 / (1 + np.exp(-(0.5 + x @ [1.0, -1.0])))).astype(float)
    x1 = mech.privatize(x, rng)
    x2 = mech.double(x1, rng)
    loss = LogisticLoss(noised=(0, 1))
    for method in ("sdr", "dr", "sl"):
        est = m_estimate(
            loss, np.c_[x1, y], np.c_[x2, y], zero_prob=0.3, scale=mech.coord_scale, method=method
        )
        assert est.converged
        c = corrected_loss(loss, method, 0.3, mech.noise_variance)
        assert np.max(np.abs(c.mean_grad(np.c_[x1, y], np.c_[x2, y], est.theta))) < 1e-6
        assert np.all(np.abs(est.theta - [0.5, 1, -1]) < 4.5 * est.stderr)
    # a separable data set has no minimiser: must warn, never return silently
    xs = np.linspace(-1, 1, 50)[:, None]
    with pytest.warns(ConvergenceWarning):
        bad = m_estimate(LogisticLoss(), np.c_[xs, xs[:, 0] > 0], method="oracle")
    assert not bad.converged


def test_median_regression_dr_runs_and_is_near_truth():
    rng = np.random.default_rng(29)
    n = 4000
    mech = ZILMechanism(0.3, 0.1, [-3, -3], [3, 3])
    x = np.clip(rng.normal(size=(n, 2)), -3, 3)
    y = 1.0 + x @ [1.0, -1.0] + rng.normal(size=n)
    x1 = mech.privatize(x, rng)
    x2 = mech.double(x1, rng)
    est = m_estimate(QuantileRegressionLoss(0.5, noised=(0, 1)), np.c_[x1, y], np.c_[x2, y], zero_prob=0.3)
    assert est.converged
    assert np.all(np.abs(est.theta - [1, 1, -1]) < 4.5 * est.stderr)


def test_mestimate_is_frozen_and_ci():
    est = MEstimate(np.array([1.0, 2.0]), np.diag([0.04, 0.09]), 10, "dr")
    lo, hi = est.ci()
    np.testing.assert_allclose(hi - lo, 2 * 1.959963984540054 * np.array([0.2, 0.3]))
    lo90, _ = est.ci(0.9)
    assert np.all(lo90 > lo)
    with pytest.raises(AttributeError):
        est.n = 3
    with pytest.raises(ValueError):
        est.theta[0] = 5.0
    with pytest.raises(ParameterError, match="level"):
        est.ci(1.0)
    assert "MEstimate" in repr(est)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"zero_prob": 1.2, "scale": 1.0}, r"zero_prob must be in \(0, 1\), got 1.2"),
        ({"zero_prob": 0.0, "scale": 1.0}, "zero_prob must be in"),
        ({"zero_prob": 0.2, "scale": 0.0}, "scale must be > 0"),
        ({"zero_prob": 0.2, "scale": [1.0, 2.0]}, "scale must be a scalar or have shape"),
        ({"zero_prob": 0.2, "scale": 1.0, "method": "mle"}, "method must be one of"),
        ({"zero_prob": 0.2, "scale": 1.0, "level": 1.5}, "level must be in"),
        ({"scale": 1.0}, "x2 was not given"),
        ({"zero_prob": 0.2, "scale": np.nan}, "scale must contain only finite"),
    ],
)
def test_bad_parameters(kwargs, match):
    x1 = np.random.default_rng(30).normal(size=(20, 1))
    with pytest.raises(ParameterError, match=match):
        m_estimate(SquaredLoss(), x1, **kwargs)


def test_bad_data():
    x1 = np.random.default_rng(31).normal(size=(20, 1))
    with pytest.raises(ParameterError, match="x1 must contain only finite"):
        m_estimate(SquaredLoss(), np.r_[x1, [[np.inf]]], zero_prob=0.2, scale=1.0)
    with pytest.raises(ParameterError, match="x2 must have the same shape"):
        m_estimate(SquaredLoss(), x1, x1[:10], zero_prob=0.2, scale=1.0)
    with pytest.raises(ParameterError, match="x2 must have the same shape"):
        dr_cdf(x1, x1[:5], 0.0, 0.2)
    with pytest.raises(ParameterError, match="tau must be in"):
        dr_quantile(x1, x1, [0.5, 1.0], 0.2)
    with pytest.raises(ParameterError, match="zero_prob must be in"):
        dr_quantile(x1, x1, 0.5, 1.0)
    with pytest.raises(ParameterError, match="DR is required"):
        m_estimate(CheckLoss(), x1, x1, zero_prob=0.2, scale=1.0, method="sdr")
    with pytest.raises(ParameterError, match="scale must be > 0"):
        variance_estimate(x1, zero_prob=0.2, scale=-1.0)
    with pytest.raises(ParameterError, match="theta must have shape"):
        m_estimate(LogisticLoss(), np.c_[x1, x1 > 0], method="naive", theta0=[0.0])


def test_no_warning_on_well_posed_fits():
    rng = np.random.default_rng(32)
    _mech, _x, x1, x2 = _uniform(rng, 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m_estimate(CheckLoss(0.3), x1, x2, zero_prob=0.2)
        dr_quantile(x1, x2, 0.5, 0.2)
