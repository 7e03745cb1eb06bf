"""Tests of ``mechanisms.planning``: predicted interval half-widths against simulations of the
project's own estimators (docs/mechanisms.md §8), and the argument checks.

The simulations (``benchmarks.planning``) privatize raw values with the schema's mechanisms, fold
them into the aggregator's states (``MomentsState``, ``HistogramState``, ``CountsState``, through
``build_state``) or ``mechanisms.estimation.dr_quantile``, and compare with the prediction (i) z·SD
of the R estimates and (ii) the mean reported half-width — each within 10 %.

How R and the tolerance are chosen (a correct implementation must fail less than once in 10⁴):

* (i) The sample SD of R estimates has relative standard error ``1/√(2(R − 1))`` (asymptotically
  normal estimates; their kurtosis is ≈ 3). The mean and frequency estimators are sample means, so
  their SD is exactly the predicted one at any n: with ``R_EXACT = 1000`` (SE 2.24 %) the 10 %
  band is 4.47 SE wide, P(fail) ≈ 8·10⁻⁶ per comparison. The quantile's z·SE is asymptotic
  (``z·sqrt(A/n)/f``): in the settings below the SD of 4000 windows was within 1.6 % of it
  (docs/mechanisms.md §8.4, MC SE 1.1 %), so with ``R_QUANTILE = 2000`` (SE 1.58 %) and a 3 %
  allowance for its finite-n bias the margin is 7 % = 4.4 SE, P(fail) ≈ 10⁻⁵ per comparison.
* (ii) The mean of R reported half-widths has a Monte Carlo error of (coefficient of variation
  of one window's half-width, ≤ 0.17 for the Woodruff interval, ≤ 0.02 for the others) / √R
  ≤ 0.4 %; its bias was at most 1.1 %, so (ii) fails a correct implementation only through a
  systematic error of 9 %.

Each test makes two comparisons, so it fails a correct implementation with probability below
2·10⁻⁵. The settings where the quantile's prediction is not reached (small δ·n) are in the
benchmark's ``LIMIT_SETTINGS``, not here.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from benchmarks import planning as bp
from mechanisms import planning
from mechanisms.errors import ParameterError
from mechanisms.uldp import URAP, URR
from mechanisms.zil import ZILMechanism

TOL = 0.10
R_EXACT = 1000
R_QUANTILE = 2000
Z = bp.Z95


def _close(simulated: float, predicted: float, what: str) -> None:
    assert abs(simulated / predicted - 1.0) < TOL, \
        f"{what}: simulated {simulated:.6g}, predicted {predicted:.6g}"


# ---------------------------------------------------------------------------------------------
# prediction against simulation
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("setting", bp.MEAN_SETTINGS, ids=lambda s: s.label)
def test_mean_halfwidth_matches_the_moments_state(setting):
    sim = bp.simulate(setting, R_EXACT, np.random.default_rng(1000 + bp.MEAN_SETTINGS.index(setting)))
    pred = setting.predicted()
    _close(sim.sd_halfwidth, pred, "1.96·SD of the mean")
    _close(sim.reported_halfwidth, pred, "mean reported half-width")


@pytest.mark.slow
@pytest.mark.parametrize("setting", bp.QUANTILE_SETTINGS, ids=lambda s: s.label)
def test_quantile_halfwidth_matches_the_histogram_state_and_dr_quantile(setting):
    sim = bp.simulate(setting, R_QUANTILE, np.random.default_rng(2000 + bp.QUANTILE_SETTINGS.index(setting)))
    _close(sim.sd_halfwidth, setting.predicted_sd(), "1.96·SD of the quantile vs z·sqrt(A/n)/f")
    _close(sim.reported_halfwidth, setting.predicted(), "mean reported half-width")


@pytest.mark.slow
@pytest.mark.parametrize("setting", bp.FREQUENCY_SETTINGS, ids=lambda s: s.label)
def test_frequency_halfwidth_matches_the_counts_state(setting):
    sim = bp.simulate(setting, R_EXACT, np.random.default_rng(3000 + bp.FREQUENCY_SETTINGS.index(setting)))
    pred = setting.predicted()
    _close(sim.sd_halfwidth, pred, "1.96·SD of the frequency")
    _close(sim.reported_halfwidth, pred, "mean reported half-width")


# ---------------------------------------------------------------------------------------------
# the formulas
# ---------------------------------------------------------------------------------------------


def test_sandwich_score_variance_matches_monte_carlo():
    """A = Var g(ξ) against 10⁶ simulated DR indicators (4 Monte Carlo SE), ξ and f exact."""
    rng = np.random.default_rng(11)
    d, lam, lo, hi = 0.1, 0.4, 0.0, 10.0
    sw = planning.dr_quantile_sandwich(d, lam, lo, hi, 0.7, data_sd=2.0, data_mean=4.0)
    z70 = 0.5244005127080407  # Φ⁻¹(0.7)
    assert sw.quantile == pytest.approx(4.0 + 2.0 * z70, rel=1e-12)
    assert sw.density == pytest.approx(math.exp(-0.5 * z70**2) / (2.0 * math.sqrt(2 * math.pi)))
    zil = ZILMechanism(d, lam, lo, hi)
    x1 = zil.privatize(rng.normal(4.0, 2.0, (1_000_000, 1)), rng)
    x2 = zil.double(x1, rng)
    g = ((x1[:, 0] <= sw.quantile) - (1 - d) * (x2[:, 0] <= sw.quantile)) / d
    se = np.sqrt(np.var((g - g.mean()) ** 2) / g.size)
    assert abs(g.var() - sw.score_variance) < 4 * se
    assert abs(g.mean() - 0.7) < 4 * g.std() / np.sqrt(g.size)


@pytest.mark.parametrize("q", [0.1, 0.5, 0.8])
def test_sandwich_limits_without_and_with_huge_noise(q):
    """λ → 0: A → q(1 − q) (the oracle's); λ → ∞: A → q(1 − q) + (1 − δ)/(2δ^{3/2})."""
    d = 0.05
    small = planning.dr_quantile_sandwich(d, 1e-9, 0.0, 1.0, q)  # A − q(1−q) = O(λ)
    assert small.score_variance == pytest.approx(q * (1 - q), rel=1e-5)
    big = planning.dr_quantile_sandwich(d, 1e7, 0.0, 1.0, q)
    assert big.score_variance == pytest.approx(q * (1 - q) + (1 - d) / (2 * d**1.5), rel=1e-5)


def test_quantile_halfwidth_is_the_asymptotic_sandwich_plus_half_a_bin():
    d, lam, n = 0.2, 0.5, 10_000
    sw = planning.dr_quantile_sandwich(d, lam, -1.0, 3.0, 0.5)
    wald = Z * math.sqrt(sw.score_variance / n) / sw.density
    assert planning.predict_quantile_halfwidth(d, lam, -1.0, 3.0, n, bins=None) == pytest.approx(wald)
    # uniform data: F⁻¹ is linear, so the Woodruff form is the Wald one plus half a bin
    binned = planning.predict_quantile_halfwidth(d, lam, -1.0, 3.0, n, bins=400)
    assert binned == pytest.approx(wald + 0.5 * 4.0 / 400, rel=1e-12)
    # one more decimal of n: √10 narrower
    far = planning.predict_quantile_halfwidth(d, lam, -1.0, 3.0, 10 * n, bins=None)
    assert far == pytest.approx(wald / math.sqrt(10))


def test_mean_variance_formulas():
    d, lam, lo, hi = 0.2, 1.0, -60.0, 240.0
    sigma2 = (lam * (hi - lo)) ** 2
    uni = (hi - lo) ** 2 / 12
    v = {e: planning.mean_variance_per_report(d, lam, lo, hi, estimator=e) for e in planning.MEAN_ESTIMATORS}
    assert v["sdr"] == v["naive"] == pytest.approx(uni + (1 - d) * sigma2)
    assert v["sl"] == pytest.approx(uni + sigma2)
    assert v["dr"] == pytest.approx(uni + (1 - d) * sigma2 / d)
    # the flights schema's comment: sqrt(Var X + (1−δ)λ²range²)/√n ≈ 0.48 min for arr_delay
    # (SD 44.6 min) at n ≈ 3.3·10⁵ — the clipped normal's SD is a little below 44.6
    hw = planning.predict_mean_halfwidth(d, lam, lo, hi, 327_346, data_sd=44.6, data_mean=7.0)
    assert hw / Z == pytest.approx(math.sqrt(44.6**2 + (1 - d) * sigma2) / math.sqrt(327_346), rel=0.002)
    assert 0.47 < hw / Z < 0.48
    # a sample: its own variance (after clipping into the box)
    x = np.random.default_rng(3).normal(100.0, 80.0, 5000)
    got = planning.mean_variance_per_report(d, lam, lo, hi, data_sample=x)
    assert got == pytest.approx(np.var(np.clip(x, lo, hi), ddof=1) + (1 - d) * sigma2, rel=1e-12)


def test_a_large_sample_predicts_like_its_distribution():
    """data_sample from N(5, 2²) against data_sd=2: the same predictions within 2 %."""
    x = np.random.default_rng(5).normal(5.0, 2.0, 200_000)
    for q in (0.25, 0.5, 0.9):
        a = planning.predict_quantile_halfwidth(0.1, 0.3, 0.0, 10.0, 10_000, q, data_sample=x)
        b = planning.predict_quantile_halfwidth(0.1, 0.3, 0.0, 10.0, 10_000, q, data_sd=2.0)
        assert a == pytest.approx(b, rel=0.02), q
    a = planning.predict_mean_halfwidth(0.1, 0.3, 0.0, 10.0, 10_000, data_sample=x)
    b = planning.predict_mean_halfwidth(0.1, 0.3, 0.0, 10.0, 10_000, data_sd=2.0)
    assert a == pytest.approx(b, rel=0.01)


@pytest.mark.parametrize(("mech", "eps", "k", "s", "theta"), [
    ("urr", 1.0, 4, 2, None), ("urr", 0.5, 100, 100, None), ("urap", 1.0, 6, 3, None),
    ("urap", 2.0, 50, 10, 0.5), ("urap", 1.0, 5, 5, None),
])
def test_frequency_halfwidth_is_the_empirical_stderr_of_the_mechanism(mech, eps, k, s, theta):
    """z·sqrt(m(1−m)/n)/b with the mechanism's own intercept and slope (docs/frequency.md §5)."""
    m = URR(k, range(s), eps) if mech == "urr" else URAP(k, range(s), eps, theta)
    a, b = m._intercept_slope()
    n = 12_345
    for code, p in ((0, 0.03), (k - 1, 0.2)):
        out = a[code] + b[code] * p
        want = Z * math.sqrt(out * (1 - out) / n) / b[code]
        got = planning.predict_frequency_halfwidth(mech, eps, k, s, p, n, sensitive=code < s, theta=theta)
        assert got == pytest.approx(want, rel=1e-12)


def test_predictions_are_fast():
    """A planner call takes well under a second, even with a 10⁵-value sample."""
    x = np.random.default_rng(0).gamma(2.0, 15.0, 100_000) - 20.0
    t0 = time.perf_counter()
    planning.predict_quantile_halfwidth(0.05, 2.0, -60.0, 240.0, 10**6, 0.9, data_sample=x)
    planning.predict_quantile_halfwidth(0.05, 0.01, -60.0, 240.0, 10**6, 0.5, data_sd=44.6)
    planning.predict_mean_halfwidth(0.05, 2.0, -60.0, 240.0, 10**6, data_sample=x)
    planning.predict_frequency_halfwidth("urap", 1.0, 10_000, 100, 0.01, 10**6)
    assert time.perf_counter() - t0 < 1.0


def test_the_prediction_does_not_depend_on_dim():
    """The planning functions take no dimension: one field of an SL_d draw is SL_1 (§1.1); the
    d = 3 settings of the simulations above check it end to end."""
    import inspect

    for f in (planning.predict_mean_halfwidth, planning.predict_quantile_halfwidth):
        assert "dim" not in inspect.signature(f).parameters
    assert any(s.dim > 1 for s in bp.MEAN_SETTINGS) and any(s.dim > 1 for s in bp.QUANTILE_SETTINGS)


# ---------------------------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------------------------

NUM = {"zero_prob": 0.2, "scale": 0.5, "low": 0.0, "high": 1.0, "n": 1000}


@pytest.mark.parametrize(("change", "name"), [
    ({"zero_prob": 0.0}, "zero_prob"), ({"zero_prob": 1.0}, "zero_prob"), ({"zero_prob": "x"}, "zero_prob"),
    ({"scale": 0.0}, "scale"), ({"scale": math.inf}, "scale"), ({"scale": -1.0}, "scale"),
    ({"low": 1.0}, "low must be < high"), ({"high": math.nan}, "high"), ({"low": -math.inf}, "low"),
    ({"n": 1}, "n must be an integer >= 2"), ({"n": 10.5}, "n must be"), ({"n": True}, "n must be"),
    ({"n": "100"}, "n must be"),
    ({"level": 1.0}, "level"), ({"level": 0.0}, "level"),
    ({"data_sd": 0.0}, "data_sd"), ({"data_sd": -1.0}, "data_sd"),
    ({"data_mean": 0.5}, "data_mean needs data_sd"),
    ({"data_sd": 1.0, "data_mean": math.inf}, "data_mean"),
    ({"data_sample": [0.5]}, "data_sample"), ({"data_sample": [0.5, 0.5]}, "data_sample"),
    ({"data_sample": [[0.1, 0.2]]}, "data_sample"), ({"data_sample": [0.1, math.nan]}, "data_sample"),
    ({"data_sample": [2.0, 3.0]}, "data_sample"),
    ({"data_sample": [0.1, 0.2], "data_sd": 1.0}, "data_sample"),
])
@pytest.mark.parametrize("func", ["mean", "quantile"])
def test_bad_numeric_arguments_raise_parameter_error(func, change, name):
    kw = {**NUM, **change}
    f = planning.predict_mean_halfwidth if func == "mean" else planning.predict_quantile_halfwidth
    with pytest.raises(ParameterError, match=name):
        f(kw.pop("zero_prob"), kw.pop("scale"), kw.pop("low"), kw.pop("high"), kw.pop("n"), **kw)


@pytest.mark.parametrize(("kw", "name"), [
    ({"estimator": "oracle"}, "estimator must be one of"),
])
def test_bad_mean_estimator(kw, name):
    with pytest.raises(ParameterError, match=name):
        planning.predict_mean_halfwidth(0.2, 0.5, 0.0, 1.0, 100, **kw)


@pytest.mark.parametrize(("args", "kw", "name"), [
    ((0.0,), {}, "q must be in"), ((1.0,), {}, "q must be in"), ((0.5,), {"bins": 8}, "bins must be"),
    ((0.5,), {"bins": 2000.0}, "bins must be"), ((0.5,), {"bins": True}, "bins must be"),
    # 31 % of N(2, 4²) is clipped onto low = 0: the 0.25-quantile is the bound itself
    ((0.25,), {"data_sd": 4.0, "data_mean": 2.0, "low": 0.0, "high": 10.0}, "q = 0.25 falls on the values"),
    ((0.95,), {"data_sample": [0.2, 0.5, 1.0, 1.0, 3.0], "low": 0.0, "high": 1.0}, "falls on the values"),
])
def test_bad_quantile_arguments(args, kw, name):
    lo, hi = kw.pop("low", 0.0), kw.pop("high", 1.0)
    with pytest.raises(ParameterError, match=name):
        planning.predict_quantile_halfwidth(0.2, 0.5, lo, hi, 1000, *args, **kw)
    if "bins" not in kw:
        with pytest.raises(ParameterError, match=name):
            planning.dr_quantile_sandwich(0.2, 0.5, lo, hi, *args, **kw)


@pytest.mark.parametrize(("args", "kw", "name"), [
    (("rr", 1.0, 4, 2, 0.1, 100), {}, "mechanism must be one of"),
    (("urr", 0.0, 4, 2, 0.1, 100), {}, "epsilon"),
    (("urr", 1.0, 1, 1, 0.1, 100), {}, "k must be an integer >= 2"),
    (("urr", 1.0, 4.0, 2, 0.1, 100), {}, "k must be an integer"),
    (("urr", 1.0, 4, 0, 0.1, 100), {}, "sensitive_size must be an integer >= 1"),
    (("urr", 1.0, 4, 5, 0.1, 100), {}, r"sensitive_size must be an integer in \[1, k\]"),
    (("urr", 1.0, 4, 2, 1.5, 100), {}, r"p must be a frequency in \[0, 1\]"),
    (("urr", 1.0, 4, 2, -0.1, 100), {}, "p must be"),
    (("urr", 1.0, 4, 2, math.nan, 100), {}, "p must be"),
    (("urr", 1.0, 4, 2, 0.1, 1), {}, "n must be"),
    (("urr", 1.0, 4, 4, 0.1, 100), {"sensitive": False}, "sensitive must be True when sensitive_size == k"),
    (("urr", 1.0, 4, 2, 0.1, 100), {"sensitive": "yes"}, "sensitive must be True or False"),
    (("urr", 1.0, 4, 2, 0.1, 100), {"theta": 0.5}, "theta applies to uRAP only"),
    (("urap", 1.0, 4, 2, 0.1, 100), {"theta": 1.0}, "theta"),
    (("urap", 1.0, 4, 2, 0.1, 100), {"level": 2.0}, "level"),
])
def test_bad_frequency_arguments(args, kw, name):
    with pytest.raises(ParameterError, match=name):
        planning.predict_frequency_halfwidth(*args, **kw)
