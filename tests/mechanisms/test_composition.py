"""Composition of repeated reports (mechanisms.privacy.composition, docs/privacy.md §7).

Each accountant output is compared with a computation that shares no code with it: for one
numeric field an FFT convolution of the Laplace privacy loss written here, bracketed from both
sides by rounding the loss down and up; for several fields a Monte Carlo of the composed ZIL
release itself (the accountant must bound it from above); for ε-DP the binomial closed form of
composed randomized response.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import signal, special

from mechanisms.errors import ParameterError
from mechanisms.privacy import delta_for_epsilon
from mechanisms.privacy.composition import (
    MAX_REPORTS,
    calibrate_composed,
    calibrate_composed_epsilon,
    compose_pure,
    compose_zil,
    exact_release_prob,
)
from mechanisms.privacy.tradeoff import _sl_log_density
from mechanisms.zil import sample_sl

EPSILONS = (0.25, 1.0, 2.0, 4.0, 8.0, 16.0)


# ---------------------------------------------------------------------------------------------
# one numeric field: an independent convolution, bracketed
# ---------------------------------------------------------------------------------------------
def _laplace_loss_pmf(eps1: float, h: float, up: bool) -> tuple[np.ndarray, int]:
    """The Laplace privacy loss under P on the grid h·k, rounded up (``up``) or down.

    The loss of Lap(0, b) against Lap(D, b) is (|y − D| − |y|)/b: ε₁ for y ≤ 0 (mass ½), −ε₁ for
    y ≥ D (mass e^{−ε₁}/2), and (D − 2y)/b in between, where y is uniform-exponential. Integrating
    the density of y over each cell of the loss grid gives the masses; returns (pmf, k of pmf[0]).
    """
    k_lo, k_hi = math.floor(-eps1 / h) - 1, math.ceil(eps1 / h) + 1
    ks = np.arange(k_lo, k_hi + 1)
    edges = ks * h
    # P(L <= l) for l in (-eps1, eps1): y >= b(eps1 - l)/2, i.e. exp(-(eps1 - l)/2)/2
    inside = 0.5 * np.exp(-(eps1 - np.clip(edges, -eps1, eps1)) / 2)
    cdf = np.where(edges >= eps1, 1.0, np.where(edges < -eps1, 0.0, inside))
    cell = np.diff(cdf)  # mass in (edges[i], edges[i+1]]
    pmf = np.zeros(ks.size)
    if up:
        pmf[1:] = cell  # to the upper edge
    else:
        pmf[:-1] = cell  # to the lower edge
    return pmf, k_lo


def _convolved_delta(eps1: float, zero_prob: float, reports: int, epsilons, h: float, up: bool) -> np.ndarray:
    pmf, k0 = _laplace_loss_pmf(eps1, h, up)
    total, t0 = np.array([1.0]), 0
    for _ in range(reports):
        total = np.clip(signal.fftconvolve(total, pmf), 0.0, None)
        t0 += k0
    losses = (np.arange(total.size) + t0) * h
    finite = (1.0 - zero_prob) ** reports
    out = []
    for e in epsilons:
        m = losses > e
        lap = float(np.sum(total[m] * -np.expm1(e - losses[m])))
        out.append(1.0 - finite + finite * lap)
    return np.array(out)


@pytest.mark.parametrize("zero_prob, scale, reports", [(0.2, 1.0, 1), (0.05, 1.4, 2), (0.05, 2.0, 10),
                                                        (0.01, 4.0, 24)])
def test_one_field_equals_an_independent_convolution_from_both_sides(zero_prob, scale, reports):
    eps1 = math.sqrt(2.0) / scale
    got = np.array(compose_zil(zero_prob, scale, dim=1, reports=reports, epsilons=EPSILONS).deltas)
    lower = _convolved_delta(eps1, zero_prob, reports, EPSILONS, 2e-4, up=False)
    upper = _convolved_delta(eps1, zero_prob, reports, EPSILONS, 2e-4, up=True)
    assert np.all(lower <= upper + 1e-12)
    # the accountant is an upper bound (never below the truth, which is >= lower) ...
    assert np.all(got >= lower - 1e-9), (got, lower)
    # ... and tight: within the bracket, up to the floating error of the FFTs
    assert np.all(got <= upper + 1e-7), (got, upper)
    assert np.max(upper - lower) < 5e-3 * reports


def test_one_report_equals_the_closed_form():
    got = compose_zil(0.1, 0.94, dim=1, reports=1, epsilons=(0.5, 1.0, 1.504, 2.0)).deltas
    want = delta_for_epsilon([0.5, 1.0, 1.504, 2.0], 1 / 0.94, 0.1, dim=1)
    np.testing.assert_allclose(got, want, atol=2e-4)
    # beyond the pure epsilon sqrt(2)/0.94 = 1.504 only the exact releases remain
    assert got[3] == pytest.approx(0.1, abs=1e-12)


def test_exact_release_prob_is_the_floor_of_every_delta():
    assert exact_release_prob(0.2, 10) == pytest.approx(1 - 0.8 ** 10, rel=1e-14)  # 0.8926
    g = compose_zil(0.2, 1.0, diameter=math.sqrt(5), dim=5, reports=10, epsilons=(1.0, 100.0))
    assert g.exact_release_prob == pytest.approx(0.892626, abs=1e-6)
    assert all(d >= g.exact_release_prob - 1e-12 for d in g.deltas)
    # one field: beyond T·sqrt(2)·c = 14.1 only the exact releases remain
    one = compose_zil(0.2, 1.0, dim=1, reports=10, epsilons=(14.0, 14.2, 100.0))
    assert one.deltas[0] > one.exact_release_prob + 1e-6
    assert one.deltas[1] == pytest.approx(one.exact_release_prob, abs=1e-9)
    assert one.deltas[2] == pytest.approx(one.exact_release_prob, abs=1e-9)


# ---------------------------------------------------------------------------------------------
# several fields: the beta_c bound against a Monte Carlo of the composed release
# ---------------------------------------------------------------------------------------------
def _monte_carlo_delta(zero_prob, c, dim, reports, epsilons, n, rng):
    """δ(ε) = E_P[(1 − e^{ε − L})₊] of T ZIL reports of x = 0 against x′ = c·e₁, and its SE.

    Each report is exact with probability zero_prob (loss +∞: the term is 1), else SL_d noise;
    L is the sum of the exact log-likelihood ratios of the noisy reports.
    """
    shift = np.zeros(dim)
    shift[0] = c
    loss = np.zeros(n)
    exact = np.zeros(n, dtype=bool)
    for _ in range(reports):
        exact |= rng.random(n) < zero_prob
        x = sample_sl(n, dim, 1.0, rng)
        loss += _sl_log_density(x, dim) - _sl_log_density(x - shift, dim)
    out, se = [], []
    for e in epsilons:
        terms = np.where(exact, 1.0, np.clip(-np.expm1(e - loss), 0.0, None))
        out.append(terms.mean())
        se.append(terms.std(ddof=1) / math.sqrt(n))
    return np.array(out), np.array(se)


@pytest.mark.parametrize("dim, c, zero_prob, reports",
                         [(2, 1.0, 0.1, 3), (5, 0.5, 0.05, 10), (20, 1.0, 0.02, 4)])
def test_several_fields_bound_the_monte_carlo_from_above(dim, c, zero_prob, reports):
    rng = np.random.default_rng(20261202 + dim)
    eps = (0.5, 1.0, 2.0, 4.0)
    mc, se = _monte_carlo_delta(zero_prob, c, dim, reports, eps, 200_000, rng)
    g = compose_zil(zero_prob, 1.0 / c, diameter=1.0, dim=dim, reports=reports, epsilons=eps)
    bound = np.array(g.deltas)
    # one-sided at 4.5 SE: a valid bound fails this less than once in 10^5 per value
    assert np.all(bound >= mc - 4.5 * se), (bound, mc, se)
    if dim == 20:  # beta_c is the d -> infinity limit: close at d = 20 (measured slack 0.01-0.045)
        assert np.all(bound - mc < 0.06 + 4.5 * se), (bound, mc)


def test_one_report_of_several_fields_equals_the_beta_c_statement():
    eps = (0.5, 1.0, 2.0, 4.0, 16.0)
    got = compose_zil(0.2, 1.0, diameter=math.sqrt(5), dim=5, reports=1, epsilons=eps).deltas
    np.testing.assert_allclose(got, delta_for_epsilon(list(eps), math.sqrt(5), 0.2), atol=2e-4)
    assert np.all(np.array(got) >= delta_for_epsilon(list(eps), math.sqrt(5), 0.2) - 1e-12)


def test_composition_is_monotone_in_reports_and_scale():
    a = compose_zil(0.05, 2.0, diameter=2.0, reports=3).deltas
    b = compose_zil(0.05, 2.0, diameter=2.0, reports=6).deltas
    c = compose_zil(0.05, 4.0, diameter=2.0, reports=6).deltas
    assert all(x <= y for x, y in zip(a, b)) and all(x >= y for x, y in zip(b, c))


# ---------------------------------------------------------------------------------------------
# pure epsilon: randomized response, composed, in closed form
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("epsilon, reports", [(1.0, 1), (1.0, 10), (0.5, 24)])
def test_pure_epsilon_equals_the_binomial_closed_form(epsilon, reports):
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    j = np.arange(reports + 1)
    weights = np.exp(special.gammaln(reports + 1) - special.gammaln(j + 1) - special.gammaln(reports - j + 1)
                     + j * math.log(p) + (reports - j) * math.log1p(-p))
    loss = epsilon * (2 * j - reports)
    eps = (0.1, 1.0, 3.0, epsilon * reports)
    want = [float(np.sum(weights * np.clip(-np.expm1(e - loss), 0, None))) for e in eps]
    got = compose_pure(epsilon, reports=reports, epsilons=eps).deltas
    np.testing.assert_allclose(got, want, atol=1e-4 * reports)
    assert np.all(np.array(got) >= np.array(want) - 1e-12)  # pessimistic
    assert got[-1] == pytest.approx(0.0, abs=1e-9)  # basic composition: T·ε is pure


# ---------------------------------------------------------------------------------------------
# calibration
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim, diameter", [(1, 1.0), (5, math.sqrt(5))])
def test_calibration_meets_the_target_and_no_smaller_scale_does(dim, diameter):
    eps, delta, z, t = 6.0, 0.5, 0.05, 10
    lam = calibrate_composed(eps, delta, z, diameter=diameter, dim=dim, reports=t)
    at = compose_zil(z, lam, diameter=diameter, dim=dim, reports=t, epsilons=(eps,)).deltas[0]
    below = compose_zil(z, lam * (1 - 2e-3), diameter=diameter, dim=dim, reports=t, epsilons=(eps,)).deltas[0]
    assert at <= delta < below


def test_calibration_refuses_a_delta_below_the_exact_release_floor():
    with pytest.raises(ParameterError, match=r"delta must exceed 0.892626.*memoize"):
        calibrate_composed(1.0, 0.5, 0.2, reports=10)


def test_categorical_calibration_beats_basic_composition():
    e1 = calibrate_composed_epsilon(4.0, 1e-6, reports=10)
    assert e1 >= 0.4 - 1e-9
    assert compose_pure(e1, reports=10, epsilons=(4.0,)).deltas[0] <= 1e-6
    e2 = calibrate_composed_epsilon(4.0, 1e-2, reports=100)
    assert e2 > 4.0 / 100 * 1.5  # advanced composition: well above ε/T at a moderate δ
    assert compose_pure(e2, reports=100, epsilons=(4.0,)).deltas[0] <= 1e-2
    assert compose_pure(e2 * 1.01, reports=100, epsilons=(4.0,)).deltas[0] > 1e-2


@pytest.mark.parametrize("kwargs, match", [
    ({"reports": 0}, "reports must be an integer in"),
    ({"reports": MAX_REPORTS + 1}, "reports must be an integer in"),
    ({"reports": True}, "reports must be an integer in"),
    ({"reports": 2.0}, "reports must be an integer in"),
    ({"scale": -1.0}, "scale must be a finite number > 0"),
    ({"zero_prob": 1.0}, r"zero_prob must be in \(0, 1\)"),
    ({"epsilons": [-1.0]}, "epsilon must be a finite number >= 0"),
    ({"diameter": 0.0}, "diameter must be a finite number > 0"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    args = {"zero_prob": 0.1, "scale": 1.0, "reports": 2} | kwargs
    with pytest.raises(ParameterError, match=match):
        compose_zil(args.pop("zero_prob"), args.pop("scale"), **args)
