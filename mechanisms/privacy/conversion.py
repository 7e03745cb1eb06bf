"""(ε, δ̃) conversion of the ZIL trade-off: ``δ_c(ε)``, ``δ̃(ε)`` and ``ε(δ̃)``.

Lu, Chen & Qiu (2025), §3.2, Theorem 3.3: the trade-off ``T`` is (ε, δ̃)-DP with
``δ̃(ε) = sup_α 1 − e^ε α − T(α)``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from mechanisms._validate import check_open_unit, check_positive
from mechanisms.errors import ParameterError
from mechanisms.privacy._numerics import (
    _CHUNK,
    _EPS_SPLIT,
    _FLOAT_MAX,
    _SQRT2,
    _check_delta_target,
    _check_dim,
    _check_epsilon_array,
    _expect_w,
    _half_c_over_sqrt_w,
    _u_grid,
)

__all__ = ["delta_c", "delta_for_epsilon", "epsilon_for_delta"]

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
    Source: paper Thm 3.3(i); docs/privacy.md §2.6.

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
    Source: paper Thm 3.3; docs/privacy.md §2.6.
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
    Source: paper Thm 3.3; docs/privacy.md §2.6. Solved in closed form for d = 1, by brentq otherwise (the
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
