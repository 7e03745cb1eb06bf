"""Tests of mechanisms.zil: the ZIL sampler, clipping, consumer-side doubling, parameter checks.

Laws (docs/mechanisms.md §1.1–§1.2, §2.1; paper §3.1): SL_d(Σ) = √W·N(0, Σ) with W ~ Exp(1), Var = Σ,
d = 1 Laplace with scale sqrt(Σ/2); ZIL(δ, Σ) = 0 w.p. δ else SL_d(Σ); X̃₂ − X ~ SL_d(λ² diag(range²)).
Tolerances: 4 standard errors estimated from the same sample (the SE of a mean of squares is
std(squares)/√n); KS tests reject at p < 1e-5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from mechanisms.errors import ParameterError
from mechanisms.zil import ZILMechanism, sample_sl

LOW = np.array([0.0, -10.0, 100.0])
HIGH = np.array([1.0, 30.0, 2600.0])  # ranges 1, 40, 2500: the units differ per field
RANGE = HIGH - LOW


def _mean_within(sample: np.ndarray, truth, k: float = 4.0) -> None:
    """Assert each column mean of ``sample`` is within k standard errors of ``truth``."""
    mean = sample.mean(axis=0)
    se = sample.std(axis=0, ddof=1) / math.sqrt(sample.shape[0])
    assert np.all(np.abs(mean - truth) < k * se), (mean - truth) / se


def _inputs(rng, n):
    return LOW + RANGE * rng.random((n, 3))


def test_zero_fraction_and_shared_indicator():
    rng = np.random.default_rng(11)
    zp, n = 0.2, 200_000
    mech = ZILMechanism(zp, 0.7, LOW, HIGH)
    x = _inputs(rng, n)
    noise = mech.privatize(x, rng) - x
    exact = noise == 0.0
    # one zero indicator per report: a row is either exact in every field or in none
    assert np.array_equal(exact.any(axis=1), exact.all(axis=1))
    frac = exact.all(axis=1).mean()
    assert abs(frac - zp) < 4 * math.sqrt(zp * (1 - zp) / n)


def test_covariance_is_zero_inflated_sl():
    """Cov Z = (1 − δ) λ² diag(range²): per-coordinate variances and zero off-diagonals."""
    rng = np.random.default_rng(12)
    zp, lam, n = 0.1, 0.5, 400_000
    mech = ZILMechanism(zp, lam, LOW, HIGH)
    x = _inputs(rng, n)
    z = mech.privatize(x, rng) - x
    _mean_within(z, 0.0)
    _mean_within(z**2, (1 - zp) * lam**2 * RANGE**2)
    np.testing.assert_allclose(mech.noise_variance, lam**2 * RANGE**2)
    for i, j in [(0, 1), (0, 2), (1, 2)]:
        _mean_within((z[:, i] * z[:, j])[:, None], 0.0)


def test_common_w_across_coordinates():
    """A common W makes the squares correlated: Cov(Z₁², Z₂²) = (1 − δ)(1 + δ) σ₁²σ₂².

    Independent per-field draws (the bug this guards against) would give δ(1 − δ)σ₁²σ₂² only.
    """
    rng = np.random.default_rng(13)
    zp, lam, n = 0.1, 1.0, 400_000
    mech = ZILMechanism(zp, lam, [0.0, 0.0], [1.0, 1.0])
    x = rng.random((n, 2))
    z = mech.privatize(x, rng) - x
    s1, s2 = z[:, 0] ** 2, z[:, 1] ** 2
    prod = (s1 - s1.mean()) * (s2 - s2.mean())
    truth = (1 - zp) * (1 + zp) * lam**4
    se = prod.std(ddof=1) / math.sqrt(n)
    assert abs(prod.mean() - truth) < 4 * se
    assert prod.mean() - zp * (1 - zp) * lam**4 > 8 * se


def test_doubling_gives_sl_law():
    """X̃₂ − X ~ SL_d(λ² diag(range²)): variance λ²·range² and a Laplace projection (KS)."""
    rng = np.random.default_rng(14)
    zp, lam, n = 0.05, 0.8, 60_000
    mech = ZILMechanism(zp, lam, LOW, HIGH)
    x = _inputs(rng, n)
    x1 = mech.privatize(x, rng)
    x2 = mech.double(x1, rng)
    e2 = x2 - x
    _mean_within(e2**2, lam**2 * RANGE**2)
    a = np.array([0.6, -0.8, 0.3]) / RANGE  # fixed projection in original units
    sigma2 = float(a @ (mech.noise_variance * a))
    laplace = stats.laplace(scale=math.sqrt(sigma2 / 2))
    assert stats.kstest(e2 @ a, laplace.cdf).pvalue > 1e-5
    # the test has power: X̃₁ − X (ZIL, an atom at 0) and a Gaussian of the same variance fail it
    assert stats.kstest((x1 - x) @ a, laplace.cdf).pvalue < 1e-5
    gauss = rng.normal(0.0, math.sqrt(sigma2), n)
    assert stats.kstest(gauss, laplace.cdf).pvalue < 1e-5


def test_sample_sl_one_dimension_is_laplace():
    rng = np.random.default_rng(15)
    s = sample_sl(50_000, 1, 2.0, rng)
    assert s.shape == (50_000, 1)
    assert stats.kstest(s[:, 0], stats.laplace(scale=1.0).cdf).pvalue > 1e-5
    assert stats.kstest(s[:, 0], stats.laplace(scale=1.2).cdf).pvalue < 1e-5
    v = sample_sl(200_000, 2, np.array([1.0, 9.0]), rng)
    _mean_within(v**2, [1.0, 9.0])
    assert sample_sl(0, 3, 1.0, rng).shape == (0, 3)


def test_clipping_happens_before_noise():
    rng = np.random.default_rng(16)
    zp, lam, n = 0.3, 0.4, 100_000
    mech = ZILMechanism(zp, lam, LOW, HIGH)
    raw = np.array([-5.0, 100.0, 1000.0])  # below, above, inside
    clipped = np.array([0.0, 30.0, 1000.0])
    got, was = mech.clip(raw)
    np.testing.assert_array_equal(got, clipped)
    assert bool(was)
    out = mech.privatize(np.tile(raw, (n, 1)), rng)
    exact = np.all(out == clipped, axis=1)
    assert abs(exact.mean() - zp) < 4 * math.sqrt(zp * (1 - zp) / n)
    assert not np.any(out[:, :2] == raw[:2])
    _mean_within(out, clipped)  # noise is centred on the clipped value, not the raw one
    single = mech.privatize(raw, rng)
    assert single.shape == (3,)


def test_rng_handling():
    mech = ZILMechanism(0.1, 1.0, LOW, HIGH)
    x = np.tile((LOW + HIGH) / 2, (5, 1))
    np.testing.assert_array_equal(mech.privatize(x, 3), mech.privatize(x, 3))
    np.testing.assert_array_equal(mech.double(x, np.random.default_rng(4)), mech.double(x, 4))
    assert mech.privatize(x, None).shape == (5, 3)
    with pytest.raises(ValueError, match="rng"):
        mech.privatize(x, rng="seed")


def test_properties_and_repr():
    mech = ZILMechanism(0.05, 2.0, LOW, HIGH)
    assert mech.dim == 3
    assert mech.c_record == pytest.approx(math.sqrt(3) / 2.0)
    assert mech.c_attribute == pytest.approx(0.5)
    np.testing.assert_allclose(mech.coord_scale, 2.0 * RANGE)
    assert "zero_prob=0.05" in repr(mech)
    scalar = ZILMechanism(0.05, 2.0, 0.0, 1.0)
    assert scalar.dim == 1


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"zero_prob": 0.0}, "zero_prob"),
        ({"zero_prob": 1.0}, "zero_prob"),
        ({"zero_prob": 1.2}, "zero_prob"),
        ({"zero_prob": -0.1}, "zero_prob"),
        ({"zero_prob": float("nan")}, "zero_prob"),
        ({"scale": 0.0}, "scale"),
        ({"scale": -1.0}, "scale"),
        ({"scale": float("inf")}, "scale"),
        ({"scale": float("nan")}, "scale"),
        ({"low": [0.0, 5.0], "high": [1.0, 5.0]}, "low"),
        ({"low": [0.0, 6.0], "high": [1.0, 5.0]}, "low"),
        ({"low": [0.0, float("nan")], "high": [1.0, 5.0]}, "low"),
        ({"low": [0.0, 0.0], "high": [1.0, float("inf")]}, "high"),
        ({"low": [0.0, 0.0, 0.0], "high": [1.0, 1.0]}, "low and high"),
        ({"low": [], "high": []}, "low and high"),
    ],
)
def test_bad_parameters(kwargs, name):
    args = {"zero_prob": 0.1, "scale": 1.0, "low": [0.0, 0.0], "high": [1.0, 1.0], **kwargs}
    with pytest.raises(ValueError, match=name) as info:
        ZILMechanism(**args)
    assert isinstance(info.value, ParameterError)


@pytest.mark.parametrize(
    ("method", "x", "name"),
    [
        ("privatize", np.zeros((4, 3)), "x"),
        ("privatize", np.zeros(3), "x"),
        ("privatize", [[0.0, float("nan")]], "x"),
        ("privatize", [[0.0, float("inf")]], "x"),
        ("privatize", np.zeros((2, 2, 2)), "x"),
        ("double", np.zeros((4, 1)), "x1"),
        ("double", [[float("nan"), 0.0]], "x1"),
        ("clip", np.zeros((1, 5)), "x"),
    ],
)
def test_bad_inputs(method, x, name):
    mech = ZILMechanism(0.1, 1.0, [0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ParameterError, match=rf"^{name} "):
        getattr(mech, method)(x, np.random.default_rng(0)) if method != "clip" else mech.clip(x)


@pytest.mark.parametrize(
    ("args", "name"),
    [((-1, 2, 1.0), "n"), ((5, 0, 1.0), "dim"), ((5, 2, -1.0), "variance"), ((5, 2, [1.0]), "variance")],
)
def test_sample_sl_bad_parameters(args, name):
    with pytest.raises(ParameterError, match=name):
        sample_sl(*args, rng=np.random.default_rng(0))
