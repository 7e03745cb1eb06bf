"""Shared numerics of the privacy accounting: argument checks and quadrature over ``W ~ Exp(1)``.

Every expectation over ``W ~ Exp(1)`` is a trapezoid rule in ``s = log w`` on ``[−45, 4.5]``
with step 0.025 (1981 nodes). The integrands are smooth in ``s`` and decay doubly-exponentially
at both ends, so the rule converges geometrically; against adaptive ``scipy.integrate.quad``
(split at the integrand's transition) the largest difference seen over ``c ∈ [0.01, 100]``,
``c·h ∈ [−1000, 1000]`` was 6e-14. Exception: ``δ_c(ε)`` for ``ε ≥ 8``, whose W-integrand steps
too sharply for that grid, is an integral over a Gaussian variable instead
(:func:`mechanisms.privacy.conversion.delta_c`).
"""

from __future__ import annotations

import functools
import math
import sys

import numpy as np
from scipy import special

from mechanisms._validate import check_open_unit
from mechanisms.errors import ParameterError

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

    The threshold is sought in units of ``c`` (``h = F_c⁻¹(1 − α)/c`` of docs/privacy.md §2.4): the privacy
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
