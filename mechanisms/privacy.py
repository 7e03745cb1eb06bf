"""Privacy accounting of the ZIL mechanism in the f-DP framework of Dong, Roth & Su.

Source: Lu, Chen & Qiu, "Versatile differentially private learning for general loss functions"
(arXiv 2501.15127), §3.2 (Theorems 3.1–3.3, Propositions 3.1–3.2, Fig. 1); restated in DESIGN §2
"Privacy accounting (f-DP, Dong–Roth–Su)".

Vocabulary (the names used in code, CLI and docs):

* A **trade-off function** ``T(α)`` is the smallest type-II error of any test of "the input was
  x" against "the input was x′" whose type-I error is at most ``α``. ``1 − α`` means the two are
  indistinguishable; the lower the curve, the weaker the privacy.
* ``c`` is the shift between the two hypotheses in noise units: ``c = diameter / scale``.
  Record level (one whole report): ``c_I = √d / λ`` on the standardized box ``[0, 1]^d``;
  attribute level (one field of a report): ``c_A = 1 / λ``.
* ``zero_prob`` (δ) is the probability that a report is released **exactly, without noise**.
  Every trade-off is "shrunk" by it: ``T_δ(α) = (1 − δ)·T(α/(1 − δ))`` for ``α ≤ 1 − δ``, else 0,
  and every (ε, δ̃) statement has ``δ̃ ≥ δ``.

Trade-off functions provided:

* ``d = 1`` (exact): ``T_{1,c}(α) = F_Lap(F_Lap⁻¹(1 − α) − √2·c)`` — pure ε = √2·c.
* any ``d`` (lower bound, tight as ``d → ∞``): ``β_c`` computed by 1-d quadrature over
  ``W ~ Exp(1)``.
* a given ``d ≥ 1`` by Monte Carlo (Neyman–Pearson test on the exact SL_d likelihood ratio).

Numerics: every expectation over ``W ~ Exp(1)`` is a trapezoid rule in ``s = log w`` on
``[−45, 4.5]`` with step 0.025 (1981 nodes). The integrands are smooth in ``s`` and decay
doubly-exponentially at both ends, so the rule converges geometrically; against adaptive
``scipy.integrate.quad`` (split at the integrand's transition) the largest difference seen over
``c ∈ [0.01, 100]``, ``c·h ∈ [−1000, 1000]`` was 6e-14. Exception: ``δ_c(ε)`` for ``ε ≥ 8``,
whose W-integrand steps too sharply for that grid, is an integral over a Gaussian variable
instead (see :func:`delta_c`).

Extreme values: every function is finite, warning-free and has the right limit over the whole
range of doubles — ``c → 0`` (trade-off ``1 − α``, ``δ_c → 0``), ``c → ∞`` (trade-off 0 on
(0, 1], ``δ_c → 1``), ``ε → ∞`` (``δ_c → 0``, so ``δ̃ → zero_prob``). Quantities are formed so
that an overflow can only produce the limiting ``±∞`` (never ``∞ − ∞``), and answers that
themselves leave the double range (an ε beyond 1.8e308, a scale below 2.2e-308) raise
``ParameterError`` instead of returning ``inf`` or ``0``.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize, special

from mechanisms._validate import check_open_unit, check_positive
from mechanisms.errors import ParameterError
from mechanisms.rng import RngLike, as_generator
from mechanisms.zil import sample_sl

__all__ = [
    "DEFAULT_EPSILONS",
    "ZILGuarantee",
    "calibrate_c",
    "calibrate_zil",
    "delta_c",
    "delta_for_epsilon",
    "epsilon_for_delta",
    "tradeoff_epsilon_delta",
    "tradeoff_laplace",
    "tradeoff_sl_limit",
    "tradeoff_sl_monte_carlo",
    "tradeoff_zil",
    "zil_guarantee",
]

#: ε values at which :func:`zil_guarantee` reports δ̃ by default.
DEFAULT_EPSILONS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)

_SQRT2 = math.sqrt(2.0)
_METHODS = ("auto", "exact", "bound", "monte_carlo")
_CHUNK = 256  # rows of α / ε evaluated at once against the quadrature grid
_FLOAT_MAX = sys.float_info.max  # searches for ε or c stop here: beyond it no answer is a float
_ALPHA_FLOOR = 1e-300  # β_c(α) is evaluated at max(α, this): 1 − F_c is not resolved below it
_EPS_SPLIT = 8.0  # δ_c(ε): the log-w quadrature below this ε, the u-form (see delta_c) from it on


# ---------------------------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------------------------


def _check_alpha(alpha) -> np.ndarray:
    try:
        a = np.asarray(alpha, dtype=np.float64)
    except (TypeError, ValueError):
        raise ParameterError(
            f"alpha must be a number or an array of numbers in [0, 1], got {alpha!r}"
        ) from None
    if a.size and not (np.all(np.isfinite(a)) and np.all((a >= 0.0) & (a <= 1.0))):
        raise ParameterError("alpha must lie in [0, 1] (type-I error), got values outside it or NaN")
    return a


def _check_epsilon_array(epsilon) -> np.ndarray:
    try:
        e = np.asarray(epsilon, dtype=np.float64)
    except (TypeError, ValueError):
        raise ParameterError(f"epsilon must be a finite number >= 0, got {epsilon!r}") from None
    if e.size and not (np.all(np.isfinite(e)) and np.all(e >= 0.0)):
        raise ParameterError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    return e


def _check_dim(dim) -> int | None:
    if dim is None:
        return None
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ParameterError(f"dim must be None or an integer >= 1, got {dim!r}")
    return int(dim)


def _check_delta_target(delta, zero_prob: float) -> float:
    d = check_open_unit("delta", delta)
    if d <= zero_prob:
        raise ParameterError(
            f"delta must exceed zero_prob: delta={d} <= zero_prob={zero_prob} is impossible, because "
            "with probability zero_prob a report is released exactly, so every (epsilon, delta) "
            "guarantee of ZIL has delta > zero_prob (delta = zero_prob only for dim=1 at "
            "epsilon = sqrt(2)*c). Lower zero_prob or raise delta."
        )
    return d


# ---------------------------------------------------------------------------------------------
# quadrature over W ~ Exp(1)
# ---------------------------------------------------------------------------------------------


@functools.cache
def _w_grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nodes ``w``, ``sqrt(w)`` and weights of ``∫₀^∞ g(w) e^(−w) dw`` (trapezoid in log w)."""
    step = 0.025
    s = np.arange(-45.0, 4.5 + step / 2, step)
    w = np.exp(s)
    weights = step * np.exp(s - w)
    for arr in (w, weights):
        arr.setflags(write=False)
    sw = np.sqrt(w)
    sw.setflags(write=False)
    return w, sw, weights


@functools.cache
def _u_grid() -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``u`` and weights ``φ(u)·du`` of ``∫ g(u) φ(u) du`` (trapezoid, step 0.05, ±38.5)."""
    step = 0.05
    u = np.arange(-38.5, 38.5 + step / 2, step)  # φ(38.5) ≈ 1e-322: nothing lies beyond
    weights = step * np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)
    for arr in (u, weights):
        arr.setflags(write=False)
    return u, weights


def _expect_w(fn, x: np.ndarray) -> np.ndarray:
    """``E_W fn(x, W)`` for each element of the 1-d array ``x`` (chunked over ``x``)."""
    w, sw, weights = _w_grid()
    out = np.empty(x.shape, dtype=np.float64)
    for start in range(0, x.size, _CHUNK):
        xs = x[start : start + _CHUNK, None]
        out[start : start + _CHUNK] = fn(xs, w, sw) @ weights
    return out


def _half_c_over_sqrt_w(c: float) -> np.ndarray:
    """``c/(2√w)`` on the quadrature nodes; ``+∞`` where it exceeds the float range (``c ≳ 6e298``).

    That ``∞`` is the right limit: every Gaussian tail it enters is then exactly 0 or 1.
    """
    _, sw, _ = _w_grid()
    with np.errstate(over="ignore"):
        return (0.5 * c) / sw


def _survival_p(h: np.ndarray, c: float) -> np.ndarray:
    """``1 − F_c(c·h) = P(Y/√W − c/(2W) > h)``: type-I error of the LLR test with threshold c·h."""
    v = _half_c_over_sqrt_w(c)
    return _expect_w(lambda x, w, sw: special.ndtr(-(sw * x + v)), h)


def _survival_and_density_p(h: np.ndarray, c: float) -> tuple[np.ndarray, np.ndarray]:
    """``1 − F_c(c·h)`` and its derivative's negative ``c·F_c′(c·h)`` (density in ``h``), one pass."""
    _, sw, weights = _w_grid()
    v = _half_c_over_sqrt_w(c)
    surv = np.empty(h.shape)
    dens = np.empty(h.shape)
    for start in range(0, h.size, _CHUNK):
        arg = sw * h[start : start + _CHUNK, None] + v
        surv[start : start + _CHUNK] = special.ndtr(-arg) @ weights
        with np.errstate(over="ignore"):  # arg² beyond the float range: the density there is 0
            dens[start : start + _CHUNK] = (np.exp(-0.5 * arg * arg) * sw) @ weights
    return surv, dens / math.sqrt(2.0 * math.pi)


def _beta_at_threshold(h: np.ndarray, c: float) -> np.ndarray:
    """``P(Y/√W + c/(2W) ≤ h)``: type-II error of the LLR test with threshold c·h."""
    v = _half_c_over_sqrt_w(c)
    return _expect_w(lambda x, w, sw: special.ndtr(sw * x - v), h)


def _llr_threshold(alpha: np.ndarray, c: float) -> np.ndarray:
    """Solve ``1 − F_c(c·h) = α`` for ``h = t/c`` (every α strictly inside (0, 1)), vectorised.

    The threshold is sought in units of ``c`` (DESIGN §2's ``h = F_c⁻¹(1 − α)/c``): the privacy
    loss ``cY/√W − c²/(2W)`` has scale ``c``, so as ``c → 0`` the threshold ``t`` shrinks with it
    while ``h`` tends to a quantile of ``Y/√W``; an absolute tolerance on ``t`` would stop at once.
    A table of ``log(1 − F_c)`` on an asinh-spaced grid gives each α a valid bracket and a
    starting point; safeguarded Newton on ``log(1 − F_c(c·h)) − log α`` (bisection fallback)
    then converges in a few steps. ``|h|`` stays below ``4e300``, so ``√w·h`` is finite.
    """
    a_max, a_min = float(alpha.max()), float(alpha.min())
    lo, hi = -min(1.0 + c, 1e300), min(1.0 + c, 1e300)
    while _survival_p(np.array([lo]), c)[0] < a_max and lo > -1e300:
        lo *= 4.0
    while _survival_p(np.array([hi]), c)[0] > a_min and hi < 1e300:
        hi *= 4.0
    grid = np.sinh(np.linspace(np.arcsinh(lo), np.arcsinh(hi), 257))
    log_s = np.log(np.maximum(_survival_p(grid, c), 1e-320))  # decreasing in h
    target = np.log(alpha)
    # bracket: grid[k] <= h <= grid[k+1] with log_s[k] >= target >= log_s[k+1]
    k = np.clip(np.searchsorted(-log_s, -target, side="right") - 1, 0, grid.size - 2)
    lo_b, hi_b = grid[k].copy(), grid[k + 1].copy()
    span = log_s[k] - log_s[k + 1]
    frac = np.where(span > 0, (log_s[k] - target) / np.where(span > 0, span, 1.0), 0.5)
    t = lo_b + np.clip(frac, 0.0, 1.0) * (hi_b - lo_b)
    active = np.ones(alpha.shape, dtype=bool)
    for _ in range(100):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        ti = t[idx]
        surv, dens = _survival_and_density_p(ti, c)
        g = np.log(np.maximum(surv, 1e-320)) - target[idx]
        converged = np.abs(g) <= 1e-15
        # S is decreasing in h: g > 0 means h is too small
        lo_b[idx] = np.where(g > 0, ti, lo_b[idx])
        hi_b[idx] = np.where(g < 0, ti, hi_b[idx])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            newton = ti + g * surv / dens
        ok = np.isfinite(newton) & (newton > lo_b[idx]) & (newton < hi_b[idx])
        new = np.where(converged, ti, np.where(ok, newton, 0.5 * (lo_b[idx] + hi_b[idx])))
        t[idx] = new
        tol = 1e-13 * (1.0 + np.abs(new))
        done = converged | (np.abs(new - ti) <= tol) | (hi_b[idx] - lo_b[idx] <= tol)
        active[idx[done]] = False
    return t


# ---------------------------------------------------------------------------------------------
# trade-off functions
# ---------------------------------------------------------------------------------------------


def tradeoff_laplace(alpha, c: float) -> np.ndarray:
    """Exact trade-off function ``T_{1,c}`` of the one-dimensional SL (Laplace) mechanism.

    ``T_{1,c}(α) = F_Lap(F_Lap⁻¹(1 − α) − √2·c)`` with ``F_Lap`` the standard Laplace CDF: the
    trade-off between ``Lap(0, 1/√2)`` and ``Lap(c, 1/√2)`` (unit variance, shift ``c``). It is
    the trade-off of pure ``ε = √2·c`` differential privacy.

    Parameters
    ----------
    alpha : float or array of any shape
        Type-I errors in [0, 1].
    c : float
        Shift in noise standard deviations, ``c = diameter / scale`` > 0.

    Returns
    -------
    ndarray, same shape as ``alpha``
        Smallest type-II error at each α (``T(0) = 1``, ``T(1) = 0``).

    Raises
    ------
    ParameterError
        If ``alpha`` is outside [0, 1] or NaN, or ``c`` is not a finite number > 0.

    Notes
    -----
    Source: paper §3.2 (text after Prop. 3.1); DESIGN §2 "d = 1 exact".
    """
    a = _check_alpha(alpha)
    c = check_positive("c", c)
    mu = _SQRT2 * c  # +∞ for c > 1.27e308: then T = 0 on (0, 1], the limit c → ∞
    with np.errstate(divide="ignore"):
        # F⁻¹(1 − α): −log(2α) for α ≤ ½, log(2(1 − α)) otherwise (accurate in both tails)
        q = np.where(a <= 0.5, -np.log(2.0 * a), np.log(2.0 * (1.0 - a)))
    # α = 0: q = +∞ and T(0) = 1 for every c; x stays +∞ there, never ∞ − ∞ = nan
    x = np.full(a.shape, np.inf)
    np.subtract(q, mu, out=x, where=a > 0.0)
    with np.errstate(over="ignore"):
        out = np.where(x < 0.0, 0.5 * np.exp(np.minimum(x, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(x, 0.0)))
    return np.asarray(out, dtype=np.float64)


def tradeoff_sl_limit(alpha, c: float) -> np.ndarray:
    """Asymptotic (d → ∞) trade-off function ``β_c``, a lower bound of ``T_{d,c}`` for every d.

    With ``W ~ Exp(1)``, ``Y ~ N(0, 1)``:
    ``F_c(x) = ∫₀^∞ Φ(√w·x/c + c/(2√w)) e^(−w) dw`` (CDF of the privacy loss ``cY/√W − c²/(2W)``)
    and ``β_c(α) = ∫₀^∞ Φ(√w·h − c/(2√w)) e^(−w) dw`` with ``h = F_c⁻¹(1 − α)/c``.
    The threshold is solved for ``h`` directly, so the result is right at both ends of the float
    range: ``β_c(α) → 1 − α`` as ``c → 0`` and ``β_c(α) → 0`` on (0, 1] as ``c → ∞``.

    Parameters
    ----------
    alpha : float or array of any shape
        Type-I errors in [0, 1].
    c : float
        Shift ``c = diameter / scale`` > 0.

    Returns
    -------
    ndarray, same shape as ``alpha``
        ``β_c(α)``; ``β_c(0) = 1``, ``β_c(1) = 0``. Absolute error below 1e-9 (quadrature in
        ``log W`` plus a Newton solve of ``F_c⁻¹`` to 1e-13 relative). An α in (0, 1e-300) is
        evaluated at 1e-300, where ``1 − F_c`` still is a normal float: β_c is decreasing, so
        that value is smaller — still a valid (conservative) lower bound of every ``T_{d,c}``.

    Raises
    ------
    ParameterError
        If ``alpha`` is outside [0, 1] or NaN, or ``c`` is not a finite number > 0.

    Notes
    -----
    Source: paper Prop. 3.2 and Thm 3.2; DESIGN §2 "Any d (lower bound, tight as d → ∞)".
    """
    a = _check_alpha(alpha)
    c = check_positive("c", c)
    flat = a.ravel()
    out = np.where(flat <= 0.0, 1.0, 0.0)
    inner = (flat > 0.0) & (flat < 1.0)
    if inner.any():
        h = _llr_threshold(np.maximum(flat[inner], _ALPHA_FLOOR), c)
        out[inner] = np.clip(_beta_at_threshold(h, c), 0.0, 1.0)
    return out.reshape(a.shape)


def tradeoff_sl_monte_carlo(
    alpha, c: float, dim: int, *, n: int = 100_000, rng: RngLike = None
) -> np.ndarray:
    """Monte Carlo trade-off function ``T_{d,c}`` of ``SL_d(I)`` versus ``c·e₁ + SL_d(I)``.

    Draws ``n`` samples under each hypothesis, evaluates the exact log-likelihood ratio
    (SL density ``∝ r^v K_v(√2 r)``, ``v = (2 − d)/2``) and returns the type-II error of the
    (randomised) Neyman–Pearson test at each α: the piecewise-linear empirical ROC curve.

    Parameters
    ----------
    alpha : float or array of any shape
        Type-I errors in [0, 1].
    c : float
        Shift ``c`` > 0.
    dim : int
        Dimension ``d ≥ 1``.
    n : int, keyword-only
        Samples per hypothesis (≥ 100); standard error ≈ ``sqrt(T(1 − T)/n)`` plus a
        threshold term of the same order.
    rng : Generator, int or None
        Random source; ``None`` seeds from OS entropy.

    Returns
    -------
    ndarray, same shape as ``alpha``

    Raises
    ------
    ParameterError
        On α outside [0, 1], ``c ≤ 0``, ``dim < 1`` or ``n < 100``.

    Notes
    -----
    Source: paper §3.2 ("Simulation is a viable approach…", Fig. 1(a)); DESIGN §2.
    """
    a = _check_alpha(alpha)
    c = check_positive("c", c)
    d = _check_dim(dim)
    if d is None:
        raise ParameterError("dim must be an integer >= 1 for method='monte_carlo', got None")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 100:
        raise ParameterError(f"n must be an integer >= 100, got {n!r}")
    gen = as_generator(rng)
    shift = np.zeros(d)
    shift[0] = c
    x_p = sample_sl(int(n), d, 1.0, gen)
    x_q = sample_sl(int(n), d, 1.0, gen) + shift
    llr_p = np.sort(_sl_log_density(x_p - shift, d) - _sl_log_density(x_p, d))
    llr_q = np.sort(_sl_log_density(x_q - shift, d) - _sl_log_density(x_q, d))
    thr = np.unique(np.concatenate([llr_p, llr_q]))
    type1 = 1.0 - np.searchsorted(llr_p, thr, side="right") / llr_p.size  # P(L > t)
    type2 = np.searchsorted(llr_q, thr, side="right") / llr_q.size  # Q(L ≤ t)
    type1 = np.concatenate([[1.0], type1, [0.0]])
    type2 = np.concatenate([[0.0], type2, [1.0]])
    order = np.lexsort((type2, type1))
    xs, first = np.unique(type1[order], return_index=True)
    ys = type2[order][first]
    return np.interp(a, xs, ys)


def _sl_log_density(x: np.ndarray, d: int) -> np.ndarray:
    """Log density of ``SL_d(I)`` at the rows of ``x`` up to an additive constant.

    ``log(r^v K_ν(√2 r))`` with ``v = (2 − d)/2``, ``ν = |v|``. scipy's ``kve`` is ``∞`` as
    ``z = √2 r → 0`` and nan beyond ``z ≈ 1.09e9`` (a shift ``c ≳ 1e9``); there the small- and
    large-argument forms of ``K_ν`` take over, so the result is never nan.
    """
    with np.errstate(over="ignore"):
        r = np.sqrt(np.einsum("ij,ij->i", x, x))
    huge = np.isinf(r)
    if huge.any():  # |x|² beyond the float range (a shift c ≳ 1e154): overflow-free hypot instead
        r[huge] = np.hypot.reduce(x[huge], axis=1)
    v = (2.0 - d) / 2.0
    nu = abs(v)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        z = _SQRT2 * r  # +∞ only for r > 1.27e308, where the density is 0 (log −∞)
        kve = special.kve(nu, z)
        log_k = np.log(kve) - z
        far = np.isnan(kve)  # Hankel: K_ν(z) ≈ √(π/(2z)) e^(−z) (1 + (4ν² − 1)/(8z)), z ≥ 1.09e9
        if far.any():
            zf = z[far]
            hankel = np.log1p((4.0 * nu * nu - 1.0) / (8.0 * zf))
            log_k[far] = 0.5 * np.log(math.pi / (2.0 * zf)) - zf + hankel
        out = v * np.log(r) + log_k
        small = np.isposinf(kve)  # K_ν(z) ≈ Γ(ν)/2·(2/z)^ν as z → 0 (ν > 0): r^v K_ν ∝ r^(v − ν)
        if small.any():
            nu_ = max(nu, 1e-300)
            const = special.gammaln(nu_) - math.log(2.0) + nu_ * math.log(_SQRT2)
            # v − ν is 0 for d ≤ 2 (finite density at 0, no 0·log 0) and 2v < 0 for d ≥ 3 (a pole)
            out[small] = const + (2.0 * v * np.log(r[small]) if v < 0 else 0.0)
    return out


def _shrink(alpha: np.ndarray, zero_prob: float, base) -> np.ndarray:
    """``(1 − δ)·T(α/(1 − δ))`` for ``α ≤ 1 − δ``, else 0 (paper (3.3))."""
    keep = 1.0 - zero_prob
    inside = alpha <= keep
    out = np.zeros(alpha.shape)
    if inside.any():
        out[inside] = keep * base(np.minimum(alpha[inside] / keep, 1.0))
    return out


def tradeoff_zil(
    alpha,
    c: float,
    zero_prob: float,
    dim: int | None = None,
    *,
    method: str = "auto",
    rng: RngLike = None,
    n: int = 100_000,
) -> np.ndarray:
    """Trade-off function ``T_{d,c,δ}`` of the ZIL mechanism (δ = zero_prob).

    ``T_{d,c,δ}(α) = (1 − δ)·T_{d,c}(α/(1 − δ))`` for ``α ≤ 1 − δ`` and 0 otherwise: with
    probability δ the report is exact, and then an attacker identifies the input for free.

    Parameters
    ----------
    alpha : float or array of any shape
        Type-I errors in [0, 1].
    c : float
        ``c = diameter / scale`` > 0 (``√d/λ`` record level, ``1/λ`` attribute level).
    zero_prob : float
        δ ∈ (0, 1), the probability that a report is released unperturbed.
    dim : int or None
        Number of numeric fields d. ``None`` means "any d" (the β_c lower bound).
    method : {"auto", "exact", "bound", "monte_carlo"}
        ``"auto"``: exact Laplace trade-off for ``dim == 1``, β_c bound otherwise.
        ``"exact"``: only for ``dim == 1``. ``"bound"``: β_c (valid for every d, tight for large d).
        ``"monte_carlo"``: simulate ``T_{dim,c}`` (needs ``dim``; uses ``rng`` and ``n``).
    rng : Generator, int or None
        Random source for ``"monte_carlo"``; ``None`` seeds from OS entropy.
    n : int
        Samples per hypothesis for ``"monte_carlo"``.

    Returns
    -------
    ndarray, same shape as ``alpha``

    Raises
    ------
    ParameterError
        On α outside [0, 1], ``c ≤ 0``, zero_prob ∉ (0, 1), bad ``dim``, an unknown method or
        ``method="exact"`` with ``dim != 1``.

    Notes
    -----
    Source: paper (3.3), Thm 3.1, Thm 3.2; DESIGN §2 "Shrinkage".
    """
    a = _check_alpha(alpha)
    c = check_positive("c", c)
    zp = check_open_unit("zero_prob", zero_prob)
    d = _check_dim(dim)
    if method not in _METHODS:
        raise ParameterError(f"method must be one of {', '.join(_METHODS)}, got {method!r}")
    if method == "exact" and d != 1:
        raise ParameterError(f"method='exact' needs dim=1 (no closed form for d >= 2), got dim={d}")
    if method == "monte_carlo":
        if d is None:
            raise ParameterError("dim must be an integer >= 1 for method='monte_carlo', got None")

        def base(x):
            return tradeoff_sl_monte_carlo(x, c, d, n=n, rng=rng)
    elif d == 1 and method in ("auto", "exact"):

        def base(x):
            return tradeoff_laplace(x, c)
    else:

        def base(x):
            return tradeoff_sl_limit(x, c)

    return _shrink(a.ravel(), zp, base).reshape(a.shape)


def tradeoff_epsilon_delta(alpha, epsilon: float, delta: float) -> np.ndarray:
    """Trade-off function ``f_{ε,δ}`` of (ε, δ)-differential privacy.

    ``f_{ε,δ}(α) = max(0, 1 − δ − e^ε α, e^(−ε)(1 − δ − α))`` — the "envelope" polyline a
    mechanism's trade-off curve must stay above to be (ε, δ)-DP.

    Parameters
    ----------
    alpha : float or array of any shape
        Type-I errors in [0, 1].
    epsilon : float
        ε ≥ 0.
    delta : float
        δ ∈ [0, 1].

    Returns
    -------
    ndarray, same shape as ``alpha``

    Raises
    ------
    ParameterError
        On α outside [0, 1], ε < 0 or not finite, δ outside [0, 1].

    Notes
    -----
    Source: Dong, Roth & Su (2022) Prop. 2.4 / paper Prop. 2.1.
    """
    a = _check_alpha(alpha)
    eps = float(_check_epsilon_array(epsilon))
    dl = float(delta)
    if not 0.0 <= dl <= 1.0:
        raise ParameterError(f"delta must be in [0, 1], got {delta!r}")
    try:
        growth = math.exp(eps)
    except OverflowError:  # ε > 709.78: e^ε·α is +∞ for every α > 0, and that line is 0 after max
        growth = math.inf
    slope = np.zeros(a.shape)
    np.multiply(growth, a, out=slope, where=a > 0.0)  # e^ε·0 = 0 even when e^ε = ∞ (not nan)
    lines = [np.zeros(a.shape), 1.0 - dl - slope, math.exp(-eps) * (1.0 - dl - a)]
    return np.maximum.reduce(lines)


# ---------------------------------------------------------------------------------------------
# (ε, δ) conversion
# ---------------------------------------------------------------------------------------------


def delta_c(epsilon, c: float, dim: int | None = None) -> np.ndarray:
    """``δ_c(ε) = sup_α 1 − e^ε α − T(α)`` of the *un-inflated* SL trade-off (no zero_prob).

    For ``dim == 1`` (Laplace, pure ε₀ = √2·c): ``max(0, 1 − exp((ε − ε₀)/2))``. Otherwise the
    β_c bound: ``E_W[Φ̄((ε − c²/(2W))√W/c) − e^ε Φ̄((ε + c²/(2W))√W/c)]``, a mixture over W of
    Gaussian-mechanism δ's; evaluated in log form so small values keep their relative accuracy.
    Finite for every finite ε ≥ 0 and c > 0, with the right limits: ``δ_c(ε) → 0`` as ``ε → ∞``
    or ``c → 0``, ``δ_c(ε) → 1`` as ``c → ∞``, and ``δ_c(k·c²) → 1 − e^(−1/(2k))`` as ``c → ∞``.

    Parameters
    ----------
    epsilon : float or array of any shape
        ε ≥ 0.
    c : float
        ``c`` > 0.
    dim : int or None
        ``1`` for the exact Laplace value, anything else for the β_c bound (valid for all d).

    Returns
    -------
    ndarray, same shape as ``epsilon``, values in [0, 1]

    Raises
    ------
    ParameterError
        On ε < 0 / not finite, ``c ≤ 0`` or bad ``dim``.

    Notes
    -----
    Source: paper Thm 3.3(i); DESIGN §2 "(ε, δ̃) conversion".

    Numerics. For ``ε < 8`` the W-expectation is the log-w trapezoid rule of the module
    docstring. For larger ε its integrand falls from 1 to 0 within ``Δ log w ≈ 1/√(ε/2)`` of
    ``w* = c²/(2ε)``, too sharp for that grid (errors up to 1.7e-3 at ``c = 1000, ε = c²``).
    There the same expectation is taken over ``U = a(W)`` instead (``a`` is increasing in
    ``w``, ``b² − a² = 2ε`` and ``e^ε φ(b) = φ(a)``); integrating by parts,
    ``δ_c(ε) = ∫ φ(u)·(1 − u/b)·(1 − exp(−c²/(b − u)²)) du`` with ``b = √(u² + 2ε)``. The
    integrand is positive (no cancellation) and analytic in a strip of half-width ``√(2ε)``;
    a trapezoid rule in ``u`` (step 0.05 on [−38.5, 38.5]) matches adaptive quadrature to 1e-13
    for ``ε ≥ 0.25`` and every c tried (1e-3 … 1e3), and keeps the relative accuracy of tiny
    values (``δ_c(ε) ≈ 1 − e^(−c²/(2ε))`` as ``ε → ∞``).
    """
    e = _check_epsilon_array(epsilon)
    c = check_positive("c", c)
    d = _check_dim(dim)
    if d == 1:
        # e^((ε − ε₀)/2) overflows for ε ≫ ε₀ (δ_c = 0 there); ε₀ = √2·c is +∞ for c > 1.27e308
        return 0.0 - np.expm1(np.minimum((e - _SQRT2 * c) / 2.0, 0.0))  # 0 − …: +0.0, never −0.0

    v = _half_c_over_sqrt_w(c)  # c/(2√w), +∞ only for c ≳ 6e298

    def integrand(x, w, sw):
        # a, b = ε√w/c ∓ c/(2√w), without c² (overflows for c ≳ 1e154). ε√w/c is +∞ only where it
        # exceeds the float range (c → 0 or ε huge: Φ̄(a) = Φ̄(b) = 0, the term is 0); it and
        # c/(2√w) are never both ∞ (their product is ε/2), so a and b are never nan.
        with np.errstate(over="ignore"):
            p = (x / c) * sw
        a = p - v
        b = p + v
        la = special.log_ndtr(-a)
        lb = special.log_ndtr(-b)
        # b ≥ a, so where Φ̄(a) underflows (c → 0: a and b → ∞) Φ̄(b) does too and the term is 0;
        # lb − la would be −∞ − (−∞) = nan there
        gone = np.isneginf(la)
        diff = np.zeros(np.broadcast(la, lb).shape)
        np.subtract(lb, la, out=diff, where=~gone)
        return np.where(gone, 0.0, np.exp(la) * -np.expm1(np.minimum(x + diff, 0.0)))

    flat = e.ravel()
    out = np.empty(flat.shape)
    low = flat < _EPS_SPLIT
    if low.any():
        out[low] = _expect_w(integrand, flat[low])
    if not low.all():
        out[~low] = _delta_c_large_epsilon(flat[~low], c)
    return np.clip(out, 0.0, 1.0).reshape(e.shape)


def _delta_c_large_epsilon(eps: np.ndarray, c: float) -> np.ndarray:
    """``δ_c(ε) = ∫ φ(u)·(1 − u/b)·(1 − exp(−c²/(b − u)²)) du``, ``b = √(u² + 2ε)`` (see delta_c).

    Every piece is formed without cancellation or overflow for ε up to the float range:
    ``b − u = r²/(b + u)`` for ``u > 0`` (``r = √(2ε)``, as ``√2·√ε``), ``c/(b − u)`` may be
    ``+∞`` (``c`` huge: the factor is 1) or underflow (``c`` tiny: 0).
    """
    u, weights = _u_grid()
    out = np.empty(eps.shape)
    for start in range(0, eps.size, _CHUNK):
        r = _SQRT2 * np.sqrt(eps[start : start + _CHUNK, None])  # ≥ 4 here, so b + u > 0 below
        b = np.hypot(u, r)
        b_minus_u = np.where(u <= 0.0, b - u, r * (r / (b + u)))
        with np.errstate(over="ignore"):
            t = c / b_minus_u
            cdf_w = -np.expm1(-t * t)  # P(W ≤ w(u)) with w(u) = (c/(b − u))², the inverse of a(w)
        out[start : start + _CHUNK] = (b_minus_u / b * cdf_w) @ weights
    return out


def delta_for_epsilon(epsilon, c: float, zero_prob: float, dim: int | None = None) -> np.ndarray:
    """δ̃ such that the ZIL mechanism is (ε, δ̃)-DP: ``δ̃ = 1 − (1 − δ)(1 − δ_c(ε))``.

    Parameters
    ----------
    epsilon : float or array of any shape
        ε ≥ 0.
    c : float
        ``c = diameter / scale`` > 0.
    zero_prob : float
        δ ∈ (0, 1).
    dim : int or None
        ``1``: exact (``δ̃ = δ`` for ``ε ≥ √2·c``). ``None`` or ``≥ 2``: the β_c bound (δ̃ is
        then a valid, slightly conservative, upper bound for that d).

    Returns
    -------
    ndarray, same shape as ``epsilon``; every value ≥ zero_prob.

    Raises
    ------
    ParameterError
        On ε < 0, ``c ≤ 0``, zero_prob ∉ (0, 1) or bad ``dim``.

    Notes
    -----
    Source: paper Thm 3.3; DESIGN §2.
    """
    zp = check_open_unit("zero_prob", zero_prob)
    dc = delta_c(epsilon, c, dim)
    return zp + (1.0 - zp) * dc  # = 1 − (1 − δ)(1 − δ_c), exact δ when δ_c = 0


def epsilon_for_delta(delta: float, c: float, zero_prob: float, dim: int | None = None) -> float:
    """Smallest ε with ``δ̃_{c,δ}(ε) ≤ delta``: the ZIL mechanism is (ε, delta)-DP.

    Parameters
    ----------
    delta : float
        Target δ′ ∈ (0, 1); must exceed zero_prob (for ``dim == 1`` it may equal it, giving the
        pure ``ε = √2·c``).
    c : float
        ``c`` > 0.
    zero_prob : float
        δ ∈ (0, 1).
    dim : int or None
        ``1`` exact Laplace conversion; otherwise the β_c bound.

    Returns
    -------
    float
        ε ≥ 0 (0 when δ′ already exceeds δ̃(0)).

    Raises
    ------
    ParameterError
        On parameters out of range or ``delta ≤ zero_prob`` (``<`` for dim 1): no finite ε exists;
        also when the ε asked for exceeds the float range (about 1.8e308: a huge ``c``).

    Notes
    -----
    Source: paper Thm 3.3; DESIGN §2. Solved in closed form for d = 1, by brentq otherwise (the
    bracket doubles from 1 up to the float range; ``δ_c(ε)`` decays like ``c²/(2ε)``).
    """
    c = check_positive("c", c)
    zp = check_open_unit("zero_prob", zero_prob)
    d = _check_dim(dim)
    if d == 1:
        dl = check_open_unit("delta", delta)
        if dl < zp:
            _check_delta_target(dl, zp)
        # 1 − (1 − δ) e^{(ε − √2c)/2} = δ′  ⇔  ε = √2c + 2 log((1 − δ′)/(1 − δ))
        eps = _SQRT2 * c + 2.0 * math.log((1.0 - dl) / (1.0 - zp))
        if not math.isfinite(eps):
            raise ParameterError(
                f"c={c!r} is too large: the matching epsilon sqrt(2)*c exceeds the float range "
                f"({_FLOAT_MAX:.6g})"
            )
        return max(0.0, eps)
    dl = _check_delta_target(delta, zp)

    def f(eps: float) -> float:
        return float(delta_for_epsilon(eps, c, zp, None)) - dl

    if f(0.0) <= 0.0:
        return 0.0
    hi = 1.0
    while f(hi) > 0.0:
        if hi > _FLOAT_MAX / 2.0:
            raise ParameterError(
                f"delta={dl} is out of reach at c={c!r}: the matching epsilon exceeds the float range "
                f"({_FLOAT_MAX:.6g}); raise delta further above zero_prob={zp} or use a smaller c"
            )
        hi *= 2.0
    return float(optimize.brentq(f, 0.0 if hi == 1.0 else hi / 2.0, hi, xtol=1e-13, rtol=1e-13))


# ---------------------------------------------------------------------------------------------
# calibration
# ---------------------------------------------------------------------------------------------


def calibrate_c(epsilon: float, delta: float, zero_prob: float, dim: int | None = None) -> float:
    """Largest shift ``c′`` whose ZIL trade-off is (ε, δ)-DP: solves ``δ̃_{c′,δ₀}(ε) = δ``.

    Parameters
    ----------
    epsilon : float
        Target ε′ ≥ 0.
    delta : float
        Target δ′ ∈ (zero_prob, 1).
    zero_prob : float
        δ₀ ∈ (0, 1): probability of an exact release.
    dim : int or None
        ``1``: exact Laplace conversion, closed form
        ``c′ = (ε′ − 2 log((1 − δ′)/(1 − δ₀)))/√2``. ``None`` or ``≥ 2``: the β_c bound
        (brentq, ``|Δc| ≤ 1e-12``), valid for every d.

    Returns
    -------
    float
        ``c′ > 0``. Any ``c ≤ c′`` also satisfies (ε′, δ′)-DP (Prop. 3.1(i)).

    Raises
    ------
    ParameterError
        If ε′ < 0 / not finite, zero_prob ∉ (0, 1), δ′ ∉ (0, 1) or δ′ ≤ zero_prob (impossible:
        δ̃ ≥ zero_prob always).

    Notes
    -----
    Source: paper §3.2 after Thm 3.3 and Fig. 1(b) (ε′ = 0.8, δ′ = 0.17, δ₀ = 0.05 → c′ ≈ 0.50252);
    DESIGN §2 "Calibration".
    """
    eps = float(_check_epsilon_array(epsilon)) if np.ndim(epsilon) == 0 else None
    if eps is None:
        raise ParameterError(f"epsilon must be a single finite number >= 0, got {epsilon!r}")
    zp = check_open_unit("zero_prob", zero_prob)
    dl = _check_delta_target(delta, zp)
    d = _check_dim(dim)
    if d == 1:
        return (eps - 2.0 * math.log((1.0 - dl) / (1.0 - zp))) / _SQRT2

    def f(c: float) -> float:
        return float(delta_for_epsilon(eps, c, zp, None)) - dl

    # as c → 0, δ_c(ε) ≈ c/√2 at ε = 0 and O(c²) at ε > 0; as c → ∞, δ_c(ε) ≈ 1 − e^(−c²/(2ε)),
    # so every δ′ < 1 at every ε up to the float range is met by some c ≲ 2e155
    lo = 1e-6
    while f(lo) >= 0.0:
        lo /= 10.0
        if lo < 1e-300:
            raise ParameterError(
                f"delta={dl} is too close to zero_prob={zp} for epsilon={eps}: no c >= 1e-300 works"
            )
    hi = 1.0
    while f(hi) <= 0.0:
        lo, hi = hi, hi * 2.0
        if hi > _FLOAT_MAX / 2.0:  # pragma: no cover - f(hi) > 0 long before (see above)
            raise ParameterError(f"cannot calibrate: delta={dl} at epsilon={eps} needs c > {hi:.6g}")
    return float(optimize.brentq(f, lo, hi, xtol=1e-14, rtol=1e-13))


def calibrate_zil(
    epsilon: float, delta: float, zero_prob: float, diameter: float, dim: int | None = None
) -> float:
    """Noise scale λ so that ZIL(zero_prob, λ²I) is (ε, δ)-DP: ``λ = diameter / c′``.

    Parameters
    ----------
    epsilon, delta : float
        Target (ε′, δ′), ε′ ≥ 0 and zero_prob < δ′ < 1.
    zero_prob : float
        δ₀ ∈ (0, 1).
    diameter : float
        Diameter of the protected set in the noise coordinates (> 0): ``√d`` for a whole report
        on the standardized box (record level), ``1`` for one field (attribute level).
    dim : int or None
        See :func:`calibrate_c` (``1`` uses the exact Laplace conversion).

    Returns
    -------
    float
        Scale λ > 0 (noise standard deviation per unit of field range).

    Raises
    ------
    ParameterError
        As :func:`calibrate_c`, if ``diameter`` is not a finite number > 0, and if
        ``diameter / c′`` leaves the range of normal floats (below 2.2e-308 or above 1.8e308).

    Notes
    -----
    Source: paper §3.2 after Thm 3.3; DESIGN §2 "Calibration".
    """
    diam = check_positive("diameter", diameter)
    c = calibrate_c(epsilon, delta, zero_prob, dim)
    scale = diam / c
    if not sys.float_info.min <= scale <= _FLOAT_MAX:
        raise ParameterError(
            f"scale = diameter / c = {diam:.6g} / {c:.6g} = {scale:.6g} is outside the range of normal "
            f"floats [{sys.float_info.min:.6g}, {_FLOAT_MAX:.6g}]: no usable noise scale for this diameter "
            "and target"
        )
    return scale


# ---------------------------------------------------------------------------------------------
# guarantee report
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZILGuarantee:
    """Privacy guarantee of one ZIL configuration, at record and attribute level.

    Attributes
    ----------
    zero_prob : float
        δ: probability that a report is released exactly (no noise).
    scale : float
        λ: noise standard deviation per unit of field range (standardized coordinates).
    dim : int
        d: number of numeric fields in one report.
    c_record : float
        ``c_I = √d / λ`` (whole report; diameter of ``[0, 1]^d`` is √d).
    c_attribute : float
        ``c_A = 1 / λ`` (one field).
    exact : bool
        True when d = 1 (exact Laplace trade-off); False means the δ̃ values come from the β_c
        lower bound of the trade-off (valid for every d, so they are conservative).
    epsilons : tuple of float
        ε values at which δ̃ is reported.
    delta_record, delta_attribute : tuple of float
        δ̃(ε) at record and attribute level, one per ε; each ≥ zero_prob.
    pure_epsilon : float or None
        For d = 1: ``√2·c`` — the mechanism is (pure_epsilon, zero_prob)-DP. None for d ≥ 2.

    Notes
    -----
    Source: paper Thm 3.1–3.3; DESIGN §2.
    """

    zero_prob: float
    scale: float
    dim: int
    c_record: float
    c_attribute: float
    exact: bool
    epsilons: tuple[float, ...]
    delta_record: tuple[float, ...]
    delta_attribute: tuple[float, ...]
    pure_epsilon: float | None

    def to_dict(self) -> dict:
        """Plain JSON-serialisable dict of every field (tuples become lists)."""
        out = asdict(self)
        for key in ("epsilons", "delta_record", "delta_attribute"):
            out[key] = list(out[key])
        return out

    def summary(self) -> str:
        """Plain-language multi-line description of the guarantee (for users and logs)."""
        zp = self.zero_prob
        lines = [
            f"ZIL noise with zero_prob = {zp!r} and scale = {self.scale:.6g} on {self.dim} numeric "
            f"field(s).",
            f"* Exact releases: each report is sent EXACTLY, with no noise at all, with probability "
            f"{zp!r} (about {100 * zp:.4g}% of reports). No guarantee below can have delta smaller "
            f"than {zp!r}.",
        ]
        if self.pure_epsilon is not None:
            lines.append(
                f"* One field (d = 1, exact): ({self.pure_epsilon:.6g}, {zp!r})-differentially private "
                f"(c = {self.c_record:.6g}, pure epsilon = sqrt(2)*c)."
            )
        how = "exact" if self.exact else "conservative bound valid for any number of fields"
        rec = ", ".join(f"({e:.6g}, {d:.6g})" for e, d in zip(self.epsilons, self.delta_record))
        att = ", ".join(f"({e:.6g}, {d:.6g})" for e, d in zip(self.epsilons, self.delta_attribute))
        lines.append(
            f"* Whole report (record level, c_I = {self.c_record:.6g}): (epsilon, delta)-DP for each "
            f"pair {rec} [{how}]."
        )
        lines.append(
            f"* One field at a time (attribute level, c_A = {self.c_attribute:.6g}): (epsilon, delta)-DP "
            f"for each pair {att} [{how}]."
        )
        lines.append(
            "* Meaning: an observer who sees a report and tries to tell two possible true values apart "
            "succeeds no better than these (epsilon, delta) pairs allow; delta includes the exact "
            "releases."
        )
        return "\n".join(lines)


def zil_guarantee(
    zero_prob: float, scale: float, dim: int, epsilons=DEFAULT_EPSILONS
) -> ZILGuarantee:
    """Compute the :class:`ZILGuarantee` of ZIL(zero_prob, scale²·I) on ``dim`` numeric fields.

    Parameters
    ----------
    zero_prob : float
        δ ∈ (0, 1).
    scale : float
        λ > 0, per unit of field range (the mechanism works on the standardized box).
    dim : int
        d ≥ 1.
    epsilons : sequence of float
        ε values (each ≥ 0, at least one) at which δ̃ is reported.

    Returns
    -------
    ZILGuarantee

    Raises
    ------
    ParameterError
        On zero_prob ∉ (0, 1), scale ≤ 0, dim < 1 or beyond the float range, an ε < 0 / empty
        ``epsilons``, or a scale so small that ``c_I = √d/scale`` exceeds the float range.

    Notes
    -----
    Source: paper Thm 3.1 (c_I, c_A), Thm 3.3 (δ̃); DESIGN §2.
    """
    zp = check_open_unit("zero_prob", zero_prob)
    lam = check_positive("scale", scale)
    d = _check_dim(dim)
    if d is None:
        raise ParameterError("dim must be an integer >= 1, got None")
    eps = _check_epsilon_array(epsilons).ravel()
    if eps.size == 0:
        raise ParameterError("epsilons must contain at least one value >= 0")
    try:
        root_d = math.sqrt(d)
    except OverflowError:
        raise ParameterError(
            f"dim must be at most {_FLOAT_MAX:.6g} (its square root is taken), got an integer of "
            f"{len(str(d))} digits"
        ) from None
    c_i = root_d / lam
    c_a = 1.0 / lam
    if not math.isfinite(c_i):
        raise ParameterError(
            f"scale={lam!r} is too small for dim={d}: the shift c_I = sqrt(dim)/scale exceeds the "
            f"float range ({_FLOAT_MAX:.6g})"
        )
    dim_arg = 1 if d == 1 else None
    rec = delta_for_epsilon(eps, c_i, zp, dim_arg)
    att = rec if d == 1 else delta_for_epsilon(eps, c_a, zp, None)
    return ZILGuarantee(
        zero_prob=zp,
        scale=lam,
        dim=d,
        c_record=c_i,
        c_attribute=c_a,
        exact=d == 1,
        epsilons=tuple(float(e) for e in eps),
        delta_record=tuple(float(x) for x in rec),
        delta_attribute=tuple(float(x) for x in att),
        pure_epsilon=_SQRT2 * c_i if d == 1 else None,
    )
