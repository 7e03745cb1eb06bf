"""Trade-off functions of the SL and ZIL mechanisms and of (ε, δ)-DP (Dong, Roth & Su 2022).

``T_{1,c}`` of the one-dimensional SL (Laplace) mechanism exactly, the ``d → ∞`` lower bound
``β_c`` of any dimension, a Monte Carlo curve for a given ``d``, their shrinking by ``zero_prob``
for ZIL (Lu, Chen & Qiu 2025, §3.2, Theorems 3.1–3.2), and the (ε, δ)-DP trade-off.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from mechanisms._validate import check_open_unit, check_positive
from mechanisms.errors import ParameterError
from mechanisms.privacy._numerics import (
    _ALPHA_FLOOR,
    _METHODS,
    _SQRT2,
    _beta_at_threshold,
    _check_alpha,
    _check_dim,
    _check_epsilon_array,
    _llr_threshold,
)
from mechanisms.rng import RngLike, as_generator
from mechanisms.zil import sample_sl

__all__ = [
    "tradeoff_epsilon_delta",
    "tradeoff_laplace",
    "tradeoff_sl_limit",
    "tradeoff_sl_monte_carlo",
    "tradeoff_zil",
]

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
    Source: paper §3.2 (text after Prop. 3.1); docs/privacy.md §2.3.
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
    Source: paper Prop. 3.2 and Thm 3.2; docs/privacy.md §2.4 (lower bound, tight as d → ∞).
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
    Source: paper §3.2 ("Simulation is a viable approach…", Fig. 1(a)); docs/privacy.md §2.5.
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
    Source: paper (3.3), Thm 3.1, Thm 3.2; docs/privacy.md §2.2.
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
