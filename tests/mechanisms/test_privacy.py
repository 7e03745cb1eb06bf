"""Tests of mechanisms.privacy: trade-off functions, (ε, δ̃) conversion, calibration, guarantees.

Reference numbers: tests/reference/reference_values.json (computed independently with scipy; see its README).
Formulas: docs/privacy.md §2; paper Prop. 3.1–3.2, Thm 3.1–3.3, Fig. 1, §7.1.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import pathlib

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from mechanisms.errors import ParameterError
from mechanisms.privacy import (
    ZILGuarantee,
    calibrate_c,
    calibrate_zil,
    delta_c,
    delta_for_epsilon,
    epsilon_for_delta,
    tradeoff_epsilon_delta,
    tradeoff_laplace,
    tradeoff_sl_limit,
    tradeoff_sl_monte_carlo,
    tradeoff_zil,
    zil_guarantee,
)
from mechanisms.zil import ZILMechanism

REF_PATH = pathlib.Path(__file__).resolve().parents[1] / "reference" / "reference_values.json"
REF = json.loads(REF_PATH.read_text())


# ------------------------------------------------------------------ reference values


def test_calibration_paper_fig1b():
    """ε = 0.8, δ′ = 0.17, zero_prob = 0.05 → c = 0.5025 ± 0.001 (paper says 0.5)."""
    r = REF["zil_calibration_paper_fig1b"]
    c = calibrate_c(0.8, 0.17, 0.05)
    assert abs(c - 0.5025) < 0.001
    assert abs(c - r["c"]) < 1e-3 * r["c"]
    assert calibrate_zil(0.8, 0.17, 0.05, diameter=1.0) == pytest.approx(1.0 / c, rel=1e-12)
    assert calibrate_zil(0.8, 0.17, 0.05, diameter=3.0) == pytest.approx(3.0 / c, rel=1e-12)


@pytest.mark.parametrize("row", REF["zil_calibration_more"], ids=lambda r: f"eps={r['epsilon']}")
def test_calibration_reference(row):
    c = calibrate_c(row["epsilon"], row["delta"], row["zero_prob"])
    assert abs(c / row["c"] - 1.0) < 1e-3
    # the solved c really gives δ̃ = δ′
    got = float(delta_for_epsilon(row["epsilon"], c, row["zero_prob"]))
    assert got == pytest.approx(row["delta"], abs=1e-10)


@pytest.mark.parametrize("row", REF["zil_delta_tilde"], ids=lambda r: f"c={r['c']}")
def test_delta_tilde_reference(row):
    got = float(delta_for_epsilon(row["epsilon"], row["c"], row["zero_prob"]))
    assert abs(got - row["delta_tilde"]) < 1e-4


def test_beta_c_reference():
    for r in REF["beta_c"]:
        assert abs(float(tradeoff_sl_limit(r["alpha"], r["c"])) - r["beta"]) < 1e-4, r


def test_beta_c_delta_reference():
    for r in REF["beta_c_delta"]:
        got = float(tradeoff_zil(r["alpha"], r["c"], r["zero_prob"]))
        assert abs(got - r["beta"]) < 1e-4, r


def test_laplace_tradeoff_reference():
    for r in REF["laplace_tradeoff_d1"]:
        assert abs(float(tradeoff_laplace(r["alpha"], r["c"])) - r["T"]) < 1e-6, r
        # tradeoff_zil with dim=1 uses it (shrinkage of the exact curve)
        zp = 0.1
        a = r["alpha"] * (1 - zp)
        assert float(tradeoff_zil(a, r["c"], zp, dim=1)) == pytest.approx((1 - zp) * r["T"], abs=1e-12)


@pytest.mark.parametrize("row", REF["zil_d1_pure_epsilon"], ids=lambda r: f"zp={r['zero_prob']}")
def test_d1_pure_epsilon_paper_71(row):
    """Paper §7.1: (0.1, 0.94) on [0, 1] is (1.504, 0.1)-DP, (0.05, 1.4) is (1.010, 0.05)-DP."""
    zp, lam = row["zero_prob"], row["scale"]
    g = zil_guarantee(zp, lam, dim=1)
    assert abs(g.pure_epsilon - row["epsilon"]) < 1e-3 * row["epsilon"]
    c = row["diameter"] / lam
    assert abs(epsilon_for_delta(zp, c, zp, dim=1) - row["epsilon"]) < 1e-9
    # exact conversion: δ̃ = δ at and above √2c, strictly above just below it
    eps = row["epsilon"]
    assert float(delta_for_epsilon(eps, c, zp, dim=1)) == pytest.approx(zp, abs=1e-15)
    assert float(delta_for_epsilon(eps + 1.0, c, zp, dim=1)) == zp
    assert float(delta_for_epsilon(eps - 0.05, c, zp, dim=1)) > zp + 0.02
    # calibration in d = 1 inverts it
    assert calibrate_zil(eps, zp + 1e-12, zp, diameter=1.0, dim=1) == pytest.approx(lam, rel=1e-6)


# ------------------------------------------------------------------ trade-off function properties

ALPHA = np.linspace(0.0, 1.0, 161)


def _curves():
    yield "laplace c=0.5", tradeoff_laplace(ALPHA, 0.5)
    yield "laplace c=2", tradeoff_laplace(ALPHA, 2.0)
    for c in (0.2, 0.5, 1.0, 3.0):
        yield f"beta c={c}", tradeoff_sl_limit(ALPHA, c)
    yield "zil beta", tradeoff_zil(ALPHA, 0.5, 0.05)
    yield "zil d=1", tradeoff_zil(ALPHA, 1.0, 0.1, dim=1)


CURVES = list(_curves())


@pytest.mark.parametrize(("name", "curve"), CURVES, ids=[name for name, _ in CURVES])
def test_tradeoff_is_valid(name, curve):
    """Trade-off functions are convex, non-increasing, within [0, 1 − α] (Dong–Roth–Su Prop 2.2)."""
    assert np.all(curve >= -1e-15)
    assert np.all(curve <= 1.0 - ALPHA + 1e-12)
    assert np.all(np.diff(curve) <= 1e-12)
    second = curve[:-2] - 2 * curve[1:-1] + curve[2:]
    assert np.all(second >= -1e-9), second.min()
    # strictly below 1 − α somewhere (the mechanism is not perfectly private)
    assert np.max(1.0 - ALPHA - curve) > 0.01


def test_tradeoff_endpoints_and_shape():
    assert tradeoff_sl_limit(0.0, 0.5) == 1.0 and tradeoff_sl_limit(1.0, 0.5) == 0.0
    assert tradeoff_laplace(0.0, 0.5) == 1.0 and tradeoff_laplace(1.0, 0.5) == 0.0
    a = np.array([[0.1, 0.2], [0.3, 0.4]])
    for f in (tradeoff_sl_limit(a, 1.0), tradeoff_laplace(a, 1.0), tradeoff_zil(a, 1.0, 0.1)):
        assert f.shape == (2, 2)
    # above 1 − zero_prob the ZIL trade-off is exactly 0 (the exact releases)
    assert np.all(tradeoff_zil(np.array([0.951, 0.99, 1.0]), 0.5, 0.05) == 0.0)
    assert float(tradeoff_zil(0.9, 0.5, 0.05)) > 0.0


@pytest.mark.parametrize("c", [0.3, 0.5, 1.0, 2.0])
def test_beta_c_symmetric(c):
    """β_c(β_c(α)) = α (Prop. 3.2(ii)); also T₁ for Laplace."""
    a = np.linspace(0.01, 0.99, 41)
    assert np.max(np.abs(tradeoff_sl_limit(tradeoff_sl_limit(a, c), c) - a)) < 1e-9
    assert np.max(np.abs(tradeoff_laplace(tradeoff_laplace(a, c), c) - a)) < 1e-12


def test_monotone_in_c_and_bound_below_laplace():
    """T decreases as c grows (Prop 3.1(i)); β_c ≤ T_{1,c} (Thm 3.2(ii))."""
    a = np.linspace(0.02, 0.98, 25)
    b = [tradeoff_sl_limit(a, c) for c in (0.2, 0.5, 0.8, 1.0)]
    for lo, hi in zip(b[1:], b[:-1]):
        assert np.all(lo < hi)
    for c in (0.2, 0.5, 1.0, 2.0):
        assert np.all(tradeoff_sl_limit(a, c) <= tradeoff_laplace(a, c) + 1e-12)


def test_beta_c_against_direct_quadrature():
    """β_c via an independent formulation: adaptive quad for F_c, brentq for the threshold."""
    c, alpha = 0.7, 0.13

    def surv(t):  # P(cY/√W − c²/(2W) > t), integrated in w with quad
        def f(w):
            return stats.norm.sf(math.sqrt(w) * t / c + c / (2 * math.sqrt(w))) * math.exp(-w)

        return integrate.quad(f, 0, np.inf, points=None, limit=200, epsabs=1e-13)[0]

    t = optimize.brentq(lambda x: surv(x) - alpha, -20, 20, xtol=1e-12)

    def g(w):
        return stats.norm.cdf(math.sqrt(w) * t / c - c / (2 * math.sqrt(w))) * math.exp(-w)

    beta = integrate.quad(g, 0, 1e-3, limit=200)[0] + integrate.quad(g, 1e-3, np.inf, limit=200)[0]
    assert abs(float(tradeoff_sl_limit(alpha, c)) - beta) < 1e-8


# ------------------------------------------------------------------ (ε, δ) conversion


@pytest.mark.slow
@pytest.mark.parametrize(("c", "eps"), [(0.5, 0.0), (0.5, 0.8), (1.0, 1.0), (2.0, 2.0), (0.5, 3.0)])
def test_delta_c_equals_sup_over_tradeoff(c, eps):
    """δ_c(ε) = sup_α 1 − e^ε α − β_c(α), the sup found numerically on β_c (Thm 3.3)."""
    grid = np.concatenate([np.geomspace(1e-7, 0.5, 400), np.linspace(0.5, 1, 200)])
    vals = 1.0 - math.exp(eps) * grid - tradeoff_sl_limit(grid, c)
    k = int(np.argmax(vals))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, grid.size - 1)]
    res = optimize.minimize_scalar(
        lambda a: -(1.0 - math.exp(eps) * a - float(tradeoff_sl_limit(a, c))),
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-12},
    )
    sup = max(-res.fun, vals[k])
    assert abs(sup - float(delta_c(eps, c))) < 1e-7


def test_delta_c_d1_equals_sup_over_laplace():
    c = 0.8
    a = np.linspace(0, 1, 200001)
    for eps in (0.0, 0.3, 1.0, 1.2):
        sup = np.max(1 - math.exp(eps) * a - tradeoff_laplace(a, c))
        assert abs(sup - float(delta_c(eps, c, dim=1))) < 1e-4
    assert float(delta_c(math.sqrt(2) * c + 1e-9, c, dim=1)) == 0.0


def test_delta_c_vanishing_c_is_zero_not_nan():
    """c → 0 (a huge scale): both tails of the β_c integrand underflow; δ_c must go to 0, not nan
    (−∞ − (−∞)), and the ZIL guarantee's δ̃ to zero_prob (found: ``privacy guarantee --scale 1e154``
    printed nan)."""
    eps = np.array([0.0, 0.5, 4.0, 50.0])
    upper = delta_c(eps, 1e-3)
    for c in (1e-300, 1e-200, 1e-154, 1e-100, 1e-20):
        d = delta_c(eps, c)
        assert np.all(np.isfinite(d)), (c, d)
        assert np.all((d >= 0.0) & (d <= upper)) and float(d.max()) < 1e-15, (c, d)
    for scale in (1e100, 1e154, 1e300):
        g = zil_guarantee(0.2, scale, dim=5)
        assert np.all(np.isfinite(g.delta_record)) and np.all(np.isfinite(g.delta_attribute))
        assert g.delta_record == pytest.approx([0.2] * len(g.epsilons), abs=1e-15)
        assert g.delta_attribute == pytest.approx([0.2] * len(g.epsilons), abs=1e-15)


# c over the whole float range, from a vanishing shift (huge scale) to a huge one (tiny scale)
EXTREME_C = (1e-300, 1e-154, 1e-20, 1.0, 1e20, 1e154, 1e300, 1.7e308)
EXTREME_EPS = np.array([0.0, 1e-300, 1e-9, 1.0, 1e9, 1e300, 1.7e308])


def _delta_c_laplace(eps: float, c: float) -> float:
    """δ_c of the d = 1 (Laplace, pure ε₀ = √2·c) trade-off, written out with Python floats."""
    eps0 = math.sqrt(2) * c  # inf for c > 1.27e308
    return 0.0 if eps >= eps0 else -math.expm1((eps - eps0) / 2)


@pytest.mark.parametrize("dim", [None, 1])
def test_delta_c_extreme_epsilon_and_c_has_the_limits(dim):
    """Every (ε, c) across the float range: finite, in [0, 1], no RuntimeWarning (the suite turns
    warnings into errors), and the right limits (found: ``privacy guarantee --scale 1e300
    --epsilons 0,1e-9,1e9`` overflowed e^ε / ε√w/c, and printed nan with other numpy builds).

    Independent checks: d = 1 against the closed form above; the bound against
    (i) δ_c(ε) → P(W < c²/(2ε)) = 1 − e^(−c²/(2ε)) as ε → ∞ (the privacy loss exceeds ε only
    when c²/(2W) > ε), (ii) δ_c(ε) ≤ δ_c(0) = TV ≤ E[c/√(2πW)] = c/√2 (2Φ(x) − 1 ≤ x√(2/π)),
    (iii) δ_c(ε) ≥ the Laplace δ_c(ε) (β_c ≤ T_{1,c}, Thm 3.2(ii)), which is 1 for c ≫ ε.
    """
    for c in EXTREME_C:
        got = delta_c(EXTREME_EPS, c, dim)
        assert np.all(np.isfinite(got)) and np.all((got >= 0.0) & (got <= 1.0)), (c, got)
        assert np.all(np.diff(got) <= 1e-15), (c, got)  # non-increasing in ε
        for eps, d in zip(EXTREME_EPS.tolist(), got):
            lap = _delta_c_laplace(eps, c)
            if dim == 1:
                assert d == pytest.approx(lap, rel=1e-12, abs=1e-300), (c, eps)
                continue
            assert d >= lap - 1e-12, (c, eps, d, lap)
            assert d <= c / math.sqrt(2) + 1e-16, (c, eps, d)
            if eps >= 1e9:
                ratio = c / math.sqrt(2) / math.sqrt(eps)  # c²/(2ε) = ratio·ratio (may be inf)
                limit = -math.expm1(-ratio * ratio)
                assert d == pytest.approx(limit, rel=1e-6, abs=1e-300), (c, eps, d, limit)
    # the ZIL δ̃ tends to zero_prob, exactly at the float level
    assert np.all(delta_for_epsilon(np.array([1e9, 1e300, 1.7e308]), 1e-300, 0.2, dim) == 0.2)


def _delta_c_quad(eps: float, c: float) -> float:
    """δ_c(ε) = E_W[Φ̄(a) − e^ε Φ̄(b)] by adaptive quadrature in s = log w, with breakpoints around
    w* = c²/(2ε), where the integrand falls from 1 to 0 within Δs ≈ 1/√(ε/2)."""

    def f(s):
        sw = math.exp(s / 2)
        a = eps * sw / c - c / (2 * sw)
        b = eps * sw / c + c / (2 * sw)
        return (stats.norm.sf(a) - math.exp(eps + stats.norm.logsf(b))) * math.exp(s - math.exp(s))

    s_star, width = math.log(c * c / (2 * eps)), 1 / math.sqrt(eps / 2)
    pts = sorted({-80.0, 6.0, *(s_star + k * width for k in (-40, -10, -3, -1, 0, 1, 3, 10, 40))})
    pts = [x for x in pts if -80.0 <= x <= 6.0]
    return sum(integrate.quad(f, lo, hi, limit=500, epsabs=1e-17, epsrel=1e-13)[0]
               for lo, hi in itertools.pairwise(pts))


def test_delta_c_large_epsilon_against_quadrature_and_limit():
    """Large ε (≈ c²), where the integrand has a step at w* that a fixed log-w grid does not resolve: δ_c is
    within 1e-10 of adaptive quadrature, for moderate ε too; and for c → ∞ at ε = k·c² it tends to P(W <
    1/(2k)) = 1 − e^(−1/(2k)), the limit of the privacy loss (c/√W)·(Y − c/(2√W))."""
    cases = [(0.5, 8.0), (3.0, 20.0), (3.0, 50.0), (10.0, 374.0)]
    cases += [(c, k * c * c) for c in (100.0, 300.0, 1000.0) for k in (0.25, 1.0, 3.0)]
    for c, eps in cases:
        assert float(delta_c(eps, c)) == pytest.approx(_delta_c_quad(eps, c), abs=1e-10), (c, eps)
    for c in (1e8, 1e100, 1e150):
        for k in (0.25, 1.0, 3.0):
            assert float(delta_c(k * c * c, c)) == pytest.approx(-math.expm1(-0.5 / k), rel=1e-9), (c, k)


def test_tradeoff_vanishing_c_is_the_identity():
    """c → 0 (a huge scale): β_c(α) → 1 − α, and T_{c,δ}(α) → max(0, 1 − δ − α) (the exact
    releases only). Before the threshold was solved in units of c, the Newton step's absolute
    tolerance stopped at once: β_c(0.5) was 0.49998 at c = 1e-9 and 1 at c = 1e-100, and c = 1e-300
    overflowed (``privacy curve --c 1e-300``). Independent bound: 0 ≤ 1 − α − β_c(α) ≤ δ_c(0) ≤
    c/√2 (see the δ_c test above)."""
    alpha = np.array([0.0, 1e-300, 1e-9, 0.01, 0.13, 0.5, 0.9, 0.999, 1.0])
    for c in (1e-9, 1e-12, 1e-20, 1e-100, 1e-300):
        gap = 1.0 - alpha - tradeoff_sl_limit(alpha, c)
        assert np.all(gap >= -1e-12) and np.all(gap <= c / math.sqrt(2) + 1e-12), (c, gap)
        zil = tradeoff_zil(alpha, c, 0.2)
        assert np.allclose(zil, np.maximum(0.0, 0.8 - alpha), rtol=0, atol=c + 1e-12), (c, zil)
        assert np.max(np.abs(tradeoff_sl_limit(tradeoff_sl_limit(alpha, c), c) - alpha)) < 1e-9


def test_tradeoff_huge_c_is_zero():
    """c → ∞ (a tiny scale): every trade-off is 0 on (0, 1] — exactly, in floats, from c ≈ 1100 on,
    because β_c ≤ T_{1,c} and T_{1,c}(α) ≤ ½·e^(744.5 − √2·c) for α ≥ 5e-324. c ≥ 1e154 used to
    overflow (c², (c/2)/√w) and the Monte Carlo curve took K_ν beyond scipy's range (nan)."""
    alpha = np.array([0.0, 5e-324, 1e-300, 1e-9, 0.5, 1.0])
    for c in (1100.0, 1e20, 1e154, 1e300, 1.7e308):
        for curve in (tradeoff_sl_limit(alpha, c), tradeoff_laplace(alpha, c)):
            assert curve[0] == 1.0 and np.all(curve[1:] == 0.0), (c, curve)
        for dim in (None, 1):
            z = tradeoff_zil(alpha, c, 0.2, dim)
            assert z[0] == 0.8 and np.all(z[1:] == 0.0), (c, dim, z)
        for d in (1, 2, 3):
            mc = tradeoff_sl_monte_carlo(alpha, c, d, n=500, rng=np.random.default_rng(d))
            assert np.all(mc[1:] == 0.0), (c, d, mc)


def test_envelope_huge_epsilon():
    """f_{ε,δ}(α) = max(0, 1 − δ − e^ε α, e^(−ε)(1 − δ − α)) for ε beyond e^ε's range (``privacy
    curve --epsilons 1e9`` raised OverflowError): 1 − δ at α = 0, e^(−ε)(1 − δ − α)⁺ elsewhere."""
    a = np.array([0.0, 1e-300, 0.1, 0.8, 1.0])
    for eps in (709.8, 1e9, 1.7e308):
        want = np.where(a == 0.0, 0.8, np.maximum(0.0, math.exp(-eps) * (0.8 - a)))
        assert np.array_equal(tradeoff_epsilon_delta(a, eps, 0.2), want), eps


def test_inverse_and_calibration_across_the_float_range():
    """ε for a δ′ needing more than 1e14 (the old search limit) is found; c for an ε up to 1e300;
    answers beyond the float range are refused with a message, never returned as inf.
    Independent values from the large-c limit δ_c(k·c²) → 1 − e^(−1/(2k))."""
    # δ_c = (0.3 − 0.2)/0.8 = 0.125 at c = 1e8  ⇒  ε ≈ c²/(2·(−log(1 − 0.125)))
    eps = epsilon_for_delta(0.3, 1e8, 0.2)
    assert eps == pytest.approx(1e16 / (2 * -math.log1p(-0.125)), rel=1e-9)
    assert float(delta_for_epsilon(eps, 1e8, 0.2)) == pytest.approx(0.3, abs=1e-12)
    # δ_c = 0.94/0.95 at ε = 1e300  ⇒  c ≈ √(2ε·(−log(1 − 0.94/0.95)))
    c = calibrate_c(1e300, 0.99, 0.05)
    assert c == pytest.approx(math.sqrt(2e300 * -math.log1p(-0.94 / 0.95)), rel=1e-9)
    with pytest.raises(ParameterError, match="float range"):
        epsilon_for_delta(0.3, 1e300, 0.2)  # ε would be ~ c² = 1e600
    with pytest.raises(ParameterError, match="float range"):
        epsilon_for_delta(0.3, 1.7e308, 0.2, dim=1)  # √2·c overflows (returned inf)
    with pytest.raises(ParameterError, match="scale = diameter / c"):
        calibrate_zil(0.8, 0.17, 0.05, diameter=1e308)  # scale 2e308 (returned inf)
    with pytest.raises(ParameterError, match="scale = diameter / c"):
        calibrate_zil(1.7e308, 0.99, 0.05, diameter=1.0, dim=1)  # c = 1.2e308: scale subnormal
    assert calibrate_zil(0.8, 0.17, 0.05, diameter=1e-300) == pytest.approx(1e-300 / 0.50252129305, rel=1e-9)
    with pytest.raises(ParameterError, match="scale=1e-310 is too small"):
        zil_guarantee(0.05, 1e-310, 3)  # c_I overflows (the message named c, not scale)
    with pytest.raises(ParameterError, match="dim must be at most"):
        zil_guarantee(0.05, 1.0, 10**400)  # math.sqrt raised OverflowError


def test_delta_tilde_properties():
    eps = np.array([0.0, 0.5, 1.0, 2.0, 5.0, 20.0])
    for zp in (0.01, 0.2):
        dt = delta_for_epsilon(eps, 0.7, zp)
        assert dt.shape == eps.shape
        assert np.all(dt >= zp) and np.all(dt <= 1.0)
        assert np.all(np.diff(dt) < 0)  # decreasing in ε
    # increasing in c, and the bound (any d) is weaker than exact d = 1
    assert np.all(delta_for_epsilon(eps, 1.0, 0.1) > delta_for_epsilon(eps, 0.5, 0.1))
    assert np.all(delta_for_epsilon(eps, 0.5, 0.1) >= delta_for_epsilon(eps, 0.5, 0.1, dim=1) - 1e-15)


def test_epsilon_for_delta_inverts_delta_for_epsilon():
    for c, zp, dl in [(0.5, 0.05, 0.17), (1.0, 0.1, 0.2), (2.0, 0.01, 0.5)]:
        eps = epsilon_for_delta(dl, c, zp)
        assert float(delta_for_epsilon(eps, c, zp)) == pytest.approx(dl, abs=1e-10)
        e1 = epsilon_for_delta(dl, c, zp, dim=1)
        assert float(delta_for_epsilon(e1, c, zp, dim=1)) == pytest.approx(dl, abs=1e-12)
    # δ′ above δ̃(0) needs no ε at all
    assert epsilon_for_delta(0.99, 0.5, 0.05) == 0.0


def test_envelope_is_dominated():
    """β_{c,δ} lies above the f_{ε, δ̃(ε)} polyline of each ε (Fig. 1(a))."""
    a = np.linspace(0, 1, 2001)
    curve = tradeoff_zil(a, 0.5, 0.05)
    for eps in (0.5, 0.8, 1.6, 2.8):
        dt = float(delta_for_epsilon(eps, 0.5, 0.05))
        env = tradeoff_epsilon_delta(a, eps, dt)
        assert np.all(curve >= env - 1e-9)
        # and touches it (tight): a slightly smaller δ is violated
        assert np.any(curve < tradeoff_epsilon_delta(a, eps, dt - 1e-3))


# ------------------------------------------------------------------ Monte Carlo T_d


def test_monte_carlo_d1_matches_exact_laplace():
    rng = np.random.default_rng(20250131)
    n = 100_000
    a = np.array([0.05, 0.2, 0.5, 0.8])
    mc = tradeoff_sl_monte_carlo(a, 0.5, 1, n=n, rng=rng)
    exact = tradeoff_laplace(a, 0.5)
    # SE of an empirical ROC point: sqrt(β(1−β)/n + slope²·α(1−α)/n), slope ≤ e^{√2 c}
    se = np.sqrt((exact * (1 - exact) + math.exp(2 * math.sqrt(2) * 0.5) * a * (1 - a)) / n)
    assert np.all(np.abs(mc - exact) < 4 * se), (mc - exact) / se


@pytest.mark.slow
def test_monte_carlo_d40_close_to_beta_c():
    """T_{40,c} ≥ β_c (Thm 3.2(ii)) and close to it (Thm 3.2(i)); T_4 is visibly above."""
    rng = np.random.default_rng(7)
    n = 100_000
    c = 0.5
    a = np.array([0.05, 0.2, 0.5])
    beta = tradeoff_sl_limit(a, c)
    slope = 3.0  # |β_c′| ≤ 3 on [0.05, 0.5] for c = 0.5 (β_c(0.04) − β_c(0.05) ≈ 0.02)
    se = np.sqrt((beta * (1 - beta) + slope**2 * a * (1 - a)) / n)
    t40 = tradeoff_sl_monte_carlo(a, c, 40, n=n, rng=rng)
    assert np.all(t40 - beta > -4 * se), (t40 - beta) / se
    assert np.all(t40 - beta < 0.005 + 4 * se), t40 - beta
    t4 = tradeoff_sl_monte_carlo(a, c, 4, n=n, rng=rng)
    assert t4[0] - t40[0] > 8 * se[0]
    # shrinkage through tradeoff_zil's monte_carlo method
    z = tradeoff_zil(a, c, 0.05, dim=40, method="monte_carlo", rng=rng, n=n)
    assert np.all(np.abs(z - tradeoff_zil(a, c, 0.05)) < 0.005 + 4 * se)


# ------------------------------------------------------------------ privacy on both sides of the bound


def _hockey_stick_zil_d1(eps: float, zero_prob: float, scale: float) -> float:
    """sup_S P(S) − e^ε Q(S) for ZIL outputs of inputs 0 and 1, by direct numerical integration.

    P = δ·point(0) + (1−δ)·Lap(0, b), Q = δ·point(1) + (1−δ)·Lap(1, b), b = λ/√2: the atom of
    P at 0 is a null set for Q (contributes δ), Q's atom contributes nothing.
    """
    b = scale / math.sqrt(2)

    def f(y):
        return max(0.0, stats.laplace.pdf(y, 0, b) - math.exp(eps) * stats.laplace.pdf(y, 1, b))

    pieces = [(-60, 0), (0, 1), (1, 60)]
    cont = sum(integrate.quad(f, lo, hi, limit=200, epsabs=1e-13)[0] for lo, hi in pieces)
    return zero_prob + (1 - zero_prob) * cont


@pytest.mark.parametrize(("zero_prob", "scale"), [(0.1, 0.94), (0.05, 1.4)])
def test_d1_privacy_claim_analytic_both_sides(zero_prob, scale):
    eps_star = math.sqrt(2) / scale
    assert abs(_hockey_stick_zil_d1(eps_star, zero_prob, scale) - zero_prob) < 1e-9
    below = _hockey_stick_zil_d1(eps_star - 0.05, zero_prob, scale)
    assert below > zero_prob + 0.02
    formula = float(delta_for_epsilon(eps_star - 0.05, 1 / scale, zero_prob, dim=1))
    assert below == pytest.approx(formula, abs=1e-9)


def test_d1_privacy_claim_empirical_both_sides():
    """Audit the real ZILMechanism: inputs 0 and 1 on [0, 1], (δ, λ) = (0.1, 0.94).

    At ε* = √2/λ no Neyman–Pearson set S = {y < u} violates P(S) − e^ε Q(S) ≤ δ beyond
    sampling error; at ε* − 0.05 one does, by > 5 standard errors.
    """
    rng = np.random.default_rng(97531)
    zp, lam = 0.1, 0.94
    mech = ZILMechanism(zp, lam, 0.0, 1.0)
    n = 1_000_000
    y_p = np.sort(mech.privatize(np.zeros((n, 1)), rng)[:, 0])
    y_q = np.sort(mech.privatize(np.ones((n, 1)), rng)[:, 0])
    assert np.mean(y_p == 0.0) == pytest.approx(zp, abs=4 * math.sqrt(zp * (1 - zp) / n))
    eps_star = math.sqrt(2) / lam
    cuts = np.concatenate([np.linspace(-2.0, 0.0, 21), np.linspace(1e-9, 0.5, 30)])

    def worst(eps):
        p = np.searchsorted(y_p, cuts, side="right") / n  # P(Y ≤ u): includes the atom at 0
        q = np.searchsorted(y_q, cuts, side="right") / n
        d = p - math.exp(eps) * q
        se = np.sqrt(p * (1 - p) / n + math.exp(2 * eps) * q * (1 - q) / n)
        return d, se

    d, se = worst(eps_star)
    assert np.all(d - zp < 5 * se), np.max((d - zp) / se)
    d, se = worst(eps_star - 0.05)
    k = int(np.argmax((d - zp) / se))
    assert (d[k] - zp) / se[k] > 5
    assert d[k] - zp > 0.015  # the analytic excess is 0.9·(1 − e^(−0.025)) ≈ 0.022


# ------------------------------------------------------------------ guarantee object


def test_zil_guarantee_fields_and_summary():
    g = zil_guarantee(0.05, 2.0, dim=4, epsilons=(0.5, 1.0, 2.0))
    assert isinstance(g, ZILGuarantee)
    assert g.c_record == pytest.approx(1.0) and g.c_attribute == pytest.approx(0.5)
    assert g.c_record == pytest.approx(ZILMechanism(0.05, 2.0, [0] * 4, [1] * 4).c_record)
    assert g.pure_epsilon is None and not g.exact
    assert all(dr >= da >= 0.05 for dr, da in zip(g.delta_record, g.delta_attribute))
    assert g.delta_record[1] == pytest.approx(float(delta_for_epsilon(1.0, 1.0, 0.05)))
    d = g.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["epsilons"] == [0.5, 1.0, 2.0]
    text = g.summary()
    assert "0.05" in text and "exactly" in text.lower() and "no noise" in text.lower()
    # δ̃ with six significant digits like every other number (it was :.4g)
    for e, dr, da in zip(g.epsilons, g.delta_record, g.delta_attribute):
        assert f"({e:.6g}, {dr:.6g})" in text and f"({e:.6g}, {da:.6g})" in text
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.scale = 3.0  # type: ignore[misc]


def test_zil_guarantee_d1_pure_statement():
    g = zil_guarantee(0.1, 0.94, dim=1)
    assert g.exact and g.c_record == g.c_attribute
    assert g.pure_epsilon == pytest.approx(1.5044825131628672, rel=1e-12)
    assert "(1.50448, 0.1)" in g.summary()


# ------------------------------------------------------------------ parameter checks


@pytest.mark.parametrize(
    ("call", "word"),
    [
        (lambda: calibrate_c(0.8, 0.05, 0.05), "zero_prob"),
        (lambda: calibrate_c(0.8, 0.01, 0.05), "delta must exceed zero_prob"),
        (lambda: calibrate_c(-1.0, 0.2, 0.05), "epsilon"),
        (lambda: calibrate_c(0.8, 1.0, 0.05), "delta"),
        (lambda: calibrate_c(0.8, 0.2, 0.0), "zero_prob"),
        (lambda: calibrate_zil(0.8, 0.2, 0.05, diameter=0.0), "diameter"),
        (lambda: calibrate_zil(0.8, 0.2, 0.05, diameter=1.0, dim=0), "dim"),
        (lambda: tradeoff_sl_limit(1.5, 0.5), "alpha"),
        (lambda: tradeoff_sl_limit(float("nan"), 0.5), "alpha"),
        (lambda: tradeoff_laplace(0.5, 0.0), "c"),
        (lambda: tradeoff_zil(0.5, 0.5, 1.0), "zero_prob"),
        (lambda: tradeoff_zil(0.5, 0.5, 0.1, method="magic"), "method"),
        (lambda: tradeoff_zil(0.5, 0.5, 0.1, dim=2, method="exact"), "dim"),
        (lambda: tradeoff_zil(0.5, 0.5, 0.1, method="monte_carlo"), "dim"),
        (lambda: tradeoff_sl_monte_carlo(0.5, 0.5, 2, n=10), "n"),
        (lambda: delta_for_epsilon(-0.1, 0.5, 0.1), "epsilon"),
        (lambda: delta_for_epsilon(float("inf"), 0.5, 0.1), "epsilon"),
        (lambda: epsilon_for_delta(0.04, 0.5, 0.05), "zero_prob"),
        (lambda: epsilon_for_delta(0.04, 0.5, 0.05, dim=1), "zero_prob"),
        (lambda: zil_guarantee(0.05, -1.0, 2), "scale"),
        (lambda: zil_guarantee(0.05, 1.0, 2, epsilons=()), "epsilons"),
        (lambda: tradeoff_epsilon_delta(0.5, 1.0, 1.5), "delta"),
    ],
)
def test_parameter_errors(call, word):
    with pytest.raises(ParameterError, match=word) as info:
        call()
    assert isinstance(info.value, ValueError)
