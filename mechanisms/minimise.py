"""Numerical minimisation of a corrected loss: the iterative fits behind :func:`m_estimate`.

A loss with its own batch fit (k-means, mixtures: docs/mechanisms.md §7) supplies it. Otherwise,
when ``∇θℓ`` is continuous: damped Newton with the analytic corrected Hessian for naive and DR fits,
BFGS with the analytic gradient where that Hessian is missing or not positive definite; when it is
not: a grid plus bounded Brent in one dimension, restarted Nelder–Mead in more
(docs/mechanisms.md §4.1). DR/SL/SDR fits start from the naive fit (a pilot).

Source: Lu, Chen & Qiu (arXiv 2501.15127) §4–§6.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from mechanisms.corrected import CorrectedLoss, corrected_loss

__all__ = ["minimise"]


def minimise(closs: CorrectedLoss, x1, x2, t0) -> tuple[np.ndarray, bool, str]:
    """Minimise ``closs`` over θ on x₁ (and x₂ for DR/SL/SDR) from ``t0`` (None: the loss's
    initial θ, refined by a naive pilot fit for the corrected methods).

    Returns ``(theta, converged, how)``: the (q,) minimiser, whether the method reported success,
    and a short description of the method used.
    """
    L = closs.loss
    own = getattr(L, "minimise", None)
    if own is not None:  # a loss with its own batch fit (k-means, mixtures: docs/mechanisms.md §7)
        return own(closs, x1, x2, t0)
    xref = x2 if closs.method == "sl" else x1
    if t0 is None:
        t0 = L.initial_theta(xref)
        if closs.method not in ("naive", "oracle"):
            pilot = corrected_loss(L, "naive")
            t0, _, _ = _fit(pilot, xref, None, t0)
    return _fit(closs, x1, x2, t0)


def _corrected_hessian(closs: CorrectedLoss, x1, x2, theta) -> np.ndarray | None:
    """Mean θ-Hessian of the corrected loss from the loss's analytic one (naive/oracle: of x₁;
    DR: ``a·H(x₁) − b·H(x₂)``), or None where the loss has none or the method is SL/SDR."""
    L, m = closs.loss, closs.method
    if m not in ("naive", "oracle", "dr"):
        return None
    h1 = L.mean_hessian_theta(x1, theta)
    if h1 is None or m != "dr":
        return h1
    return closs._a * h1 - closs._b * L.mean_hessian_theta(x2, theta)


def _newton(closs: CorrectedLoss, x1, x2, t0, f) -> np.ndarray | None:
    """Damped Newton iterations with the analytic corrected Hessian, each step halved until the
    objective does not increase; stops once the Newton decrement ``ḡᵀV⁻¹ḡ`` is below 1e-20.
    None (the caller falls back to BFGS) without an analytic Hessian, at a Hessian that is not
    positive definite, at a step that cannot be made, or after 50 iterations."""
    t = np.array(t0, dtype=np.float64)
    F = f(t)
    if not math.isfinite(F):
        return None
    for _ in range(50):
        V = _corrected_hessian(closs, x1, x2, t)
        if V is None or not np.all(np.isfinite(V)):
            return None
        g = closs.mean_grad(x1, x2, t)
        try:
            step = np.linalg.solve(np.linalg.cholesky(V).T, np.linalg.solve(np.linalg.cholesky(V), g))
        except np.linalg.LinAlgError:
            return None
        dec = float(g @ step)
        if not math.isfinite(dec):
            return None
        if dec <= 1e-20:
            return t
        for s in 0.5 ** np.arange(30):
            tn = t - s * step
            Fn = f(tn)
            if Fn <= F:
                break
        else:
            return t if dec <= 1e-14 else None  # at the optimum to rounding: no step descends
        t, F = tn, Fn
    return None


def _fit(closs: CorrectedLoss, x1, x2, t0) -> tuple[np.ndarray, bool, str]:
    L = closs.loss
    f = lambda t: closs.objective(x1, x2, t)  # noqa: E731
    if L.smooth_theta:
        t = _newton(closs, x1, x2, t0, f)
        if t is not None:
            return t, True, "Newton"
        res = optimize.minimize(
            f, t0, jac=lambda t: closs.mean_grad(x1, x2, t), method="BFGS", options={"gtol": 1e-9}
        )
        return res.x, bool(res.success), f"BFGS ({res.message})"
    s = L.theta_scale(x1 if x1 is not None else x2, t0)
    if t0.size == 1:
        return _grid_brent(f, float(t0[0]), float(s[0]))
    return _nelder_mead(f, t0, s, x1.shape[0])


def _grid_brent(f, t0: float, s: float) -> tuple[np.ndarray, bool, str]:
    grid = t0 + s * np.linspace(-8.0, 8.0, 321)
    vals = np.array([f(np.array([g])) for g in grid])
    k = int(np.argmin(vals))
    if k in (0, grid.size - 1):
        return np.array([grid[k]]), False, "grid minimum on the grid edge"
    res = optimize.minimize_scalar(
        lambda t: f(np.array([t])), bounds=(grid[k - 1], grid[k + 1]), method="bounded",
        options={"xatol": 1e-6 * s},
    )
    best = res.x if res.fun <= vals[k] else grid[k]
    return np.array([best]), True, "grid + bounded Brent"


def _nelder_mead(f, t0: np.ndarray, s: np.ndarray, n: int) -> tuple[np.ndarray, bool, str]:
    """Restarted Nelder–Mead for non-smooth (possibly non-convex) objectives.

    Simplices shrink from the parameter scale ``s`` to a few standard errors (``~ s/√n``); the
    search stops once a fresh restart improves the objective by less than ``1e-4/n`` (the change
    caused by a ~1 % of a standard-error move).
    """
    q = t0.size
    x, fx = t0.copy(), f(t0)
    se = s / math.sqrt(n)
    ftol = 1e-4 / n
    sizes = [s] + [3.0 * se] * 5
    for i, step in enumerate(sizes):
        simplex = np.vstack([x, x + np.diag(step)])
        res = optimize.minimize(
            f, x, method="Nelder-Mead",
            options={"initial_simplex": simplex, "xatol": 0.01 * float(se.min()),
                     "fatol": 0.1 * ftol, "maxfev": 300 * q, "adaptive": q > 2},
        )
        improved = fx - res.fun
        if res.fun < fx:
            x, fx = res.x, res.fun
        if i >= 1 and improved < ftol:
            return x, True, "restarted Nelder-Mead"
    return x, False, "restarted Nelder-Mead (still improving)"
