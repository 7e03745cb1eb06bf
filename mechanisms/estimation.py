"""Batch M-estimation on ZIL-privatized records with plug-in sandwich covariance.

Source: Lu, Chen & Qiu (arXiv 2501.15127) §4–§6 (DR/SL/SDR estimators, asymptotic normality
``√n(θ̂ − θ₀) → N(0, V⁻¹AV⁻¹)``); docs/mechanisms.md §3 (closed forms; §3.6 DR CDF/quantiles)
and §4 (M-estimation, sandwich).

Noise is in original units with per-noised-column standard deviations ``σ_j`` (argument ``scale``;
``ZILMechanism.coord_scale``): ``X̃₁ = X + ZIL(δ, diag σ²)``, ``X̃₂ = X̃₁ + SL(δ diag σ²)``.

Closed forms (exact, not iterative): squared loss (mean), ``(θ − g(x))²`` (all methods), linear
regression (every method — the corrected objective is quadratic in β), the check loss (exact global
minimum over the kinks), :func:`variance_estimate`, :func:`dr_cdf`, :func:`dr_quantile`. Other
losses are minimised numerically by :mod:`mechanisms.minimise` (when ``∇θℓ`` is continuous:
damped Newton with the analytic Hessian for naive and DR fits, BFGS with the analytic gradient
where that is missing or not positive definite; grid + bounded Brent in 1-d or restarted
Nelder–Mead otherwise). A fit that
fails its convergence check returns ``converged=False`` and emits
:class:`mechanisms.errors.ConvergenceWarning`.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

from mechanisms._validate import check_finite_array, check_open_unit
from mechanisms.corrected import METHODS, CorrectedLoss, corrected_loss
from mechanisms.errors import ConvergenceWarning, ParameterError
from mechanisms.losses import (
    CheckLoss,
    LinearRegressionLoss,
    Loss,
    SquaredLoss,
    TransformSquaredLoss,
)
from mechanisms.minimise import minimise
from mechanisms.rng import RngLike, as_generator
from mechanisms.zil import sample_sl

__all__ = ["MEstimate", "dr_cdf", "dr_quantile", "m_estimate", "variance_estimate"]

logger = logging.getLogger(__name__)

#: Newton-step / stderr ratio below which a fit counts as converged (smooth, non-smooth ∇θℓ).
_CONV_TOL_SMOOTH = 1e-3
_CONV_TOL_ROUGH = 1.0
#: V when ∇θℓ is discontinuous: Gaussian-kernel smoothed Hessian with bandwidth
#: ``_ROUGH_C · n^(−_ROUGH_EXP) · spread(residual)``, else a central difference of the averaged
#: corrected gradient with step ``_ROUGH_C · n^(−_ROUGH_EXP) · theta_scale``.
_ROUGH_EXP = 0.2
_ROUGH_C = 1.0


@dataclass(frozen=True)
class MEstimate:
    """Result of an M-estimation (immutable).

    Attributes
    ----------
    theta : ndarray (q,)
        Point estimate, units of the parameter.
    cov : ndarray (q, q)
        Plug-in sandwich covariance ``V⁻¹ A V⁻¹ / n`` (docs/mechanisms.md §4.2).
    n : int
        Number of records.
    method : str
        "dr", "sdr", "sl", "naive" or "oracle".
    converged : bool
        Whether the optimiser met its convergence check (always True for closed forms).
    level : float
        Default confidence level of :meth:`ci`.
    """

    theta: np.ndarray
    cov: np.ndarray
    n: int
    method: str
    converged: bool = True
    level: float = 0.95
    info: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        t = np.array(self.theta, dtype=np.float64).reshape(-1)
        c = np.array(self.cov, dtype=np.float64).reshape(t.size, t.size)
        t.flags.writeable = False
        c.flags.writeable = False
        object.__setattr__(self, "theta", t)
        object.__setattr__(self, "cov", c)

    @property
    def stderr(self) -> np.ndarray:
        """Standard errors ``sqrt(diag(cov))``, shape (q,)."""
        return np.sqrt(np.clip(np.diag(self.cov), 0.0, None))

    def ci(self, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Wald confidence intervals ``θ̂ ± z_{(1+level)/2}·stderr``.

        Parameters
        ----------
        level : float, optional
            In (0, 1); default :attr:`level`.

        Returns
        -------
        (low, high) : two ndarrays of shape (q,)

        Raises
        ------
        ParameterError
            If ``level`` is not in (0, 1).
        """
        lv = self.level if level is None else check_open_unit("level", level)
        z = stats.norm.ppf(0.5 + 0.5 * lv)
        se = self.stderr
        return self.theta - z * se, self.theta + z * se

    def __repr__(self) -> str:
        try:
            return (
                f"MEstimate(method={self.method!r}, n={self.n}, theta={np.round(self.theta, 6).tolist()}, "
                f"stderr={np.round(self.stderr, 6).tolist()}, converged={self.converged})"
            )
        except Exception:  # pragma: no cover - repr never raises
            return "MEstimate(<unprintable>)"


# ---------------------------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------------------------


def _check_scale(scale, k: int) -> np.ndarray:
    s = check_finite_array("scale", scale, ndim=(0, 1))
    if s.ndim == 0:
        s = np.full(k, float(s))
    elif s.shape != (k,):
        raise ParameterError(
            f"scale must be a scalar or have shape ({k},) (one per noised column), got {s.shape}"
        )
    if np.any(s <= 0):
        raise ParameterError(f"scale must be > 0 (noise std per noised column), got {s.tolist()}")
    return s


def _as_column(name: str, x) -> np.ndarray:
    a = check_finite_array(name, x, ndim=(1, 2))
    if a.ndim == 2:
        if a.shape[1] != 1:
            raise ParameterError(f"{name} must have shape (n,) or (n, 1), got {a.shape}")
        a = a[:, 0]
    if a.size == 0:
        raise ParameterError(f"{name} must hold at least one value")
    return a


def _double(x1: np.ndarray, noised: tuple[int, ...], zero_prob: float, sd: np.ndarray, rng) -> np.ndarray:
    """``X̃₂ = X̃₁ + SL(δ diag σ²)`` on the noised columns (docs/mechanisms.md §2.1)."""
    x2 = x1.copy()
    if noised:
        x2[:, list(noised)] += sample_sl(x1.shape[0], len(noised), zero_prob * sd**2, rng)
    return x2


# ---------------------------------------------------------------------------------------------
# m_estimate
# ---------------------------------------------------------------------------------------------


def m_estimate(
    loss: Loss,
    x1,
    x2=None,
    *,
    zero_prob: float | None = None,
    scale=None,
    method: str = "dr",
    theta0=None,
    rng: RngLike = None,
    level: float = 0.95,
) -> MEstimate:
    """M-estimate ``θ̂ = argmin Σ_i ℓ_*(x₁ᵢ, x₂ᵢ, θ)`` with a plug-in sandwich covariance.

    Parameters
    ----------
    loss : Loss
    x1 : array (n, p) (or (n,) for one-column losses)
        Released records ``X̃₁`` in original units (raw ``X`` for ``method="oracle"``).
    x2 : array (n, p), optional
        Doubled records ``X̃₂``; drawn as ``X̃₁ + SL(δσ²)`` on the noised columns with ``rng``
        when omitted and the method needs it (DR, SDR, SL).
    zero_prob : float, optional
        δ ∈ (0, 1); required for DR and SDR, and whenever ``x2`` must be drawn.
    scale : float or array (len(loss.noised),), optional
        Noise standard deviation ``σ_j > 0`` per noised column, units of x
        (``ZILMechanism.coord_scale``); required for SDR, SL and for drawing ``x2``.
    method : {"dr", "sdr", "sl", "naive", "oracle"}
    theta0 : array (q,), optional
        Starting value for iterative fits (warm start).
    rng : Generator, int or None
        For drawing ``x2``; None seeds from OS entropy.
    level : float
        Default confidence level of the result's ``ci``.

    Returns
    -------
    MEstimate

    Raises
    ------
    ParameterError
        Unknown method; zero_prob ∉ (0, 1) or missing; scale ≤ 0 or missing; NaN/inf in the
        data; shape mismatch between x1 and x2; SL/SDR on a non-smooth loss.

    Warns
    -----
    ConvergenceWarning
        If an iterative fit (or the sandwich's V) fails its check; the result has
        ``converged=False``.

    Notes
    -----
    Paper §4–§6; docs/mechanisms.md §4.2–§4.4. ``V`` is the Jacobian of the averaged corrected gradient at θ̂
    (central differences, step ``1e-4·scale``) when ``∇θℓ`` is continuous. For kinked losses
    (check, quantile regression, hinge) V is the corrected mean of a Gaussian-kernel smoothed
    Hessian (bandwidth ``n^(−1/5)·spread(residual)``; a difference quotient with step ``n^(−1/3)``
    under-covers, 87–90 % for DR median regression), falling back to
    a central difference with step ``n^(−1/5)·scale``. ``A`` is the empirical covariance of the
    per-record corrected gradients. Convergence: the Newton step ``V⁻¹ ḡ`` must be below
    1e-3 (smooth) or 1 (kinked) standard errors.
    """
    if not isinstance(loss, Loss):
        raise ParameterError(f"loss must be a mechanisms.losses.Loss, got {type(loss).__name__}")
    if method not in METHODS:
        raise ParameterError(f"method must be one of {METHODS}, got {method!r}")
    level = check_open_unit("level", level)
    a1 = loss.check_x(x1, "x1")
    n, p = a1.shape
    delta = None if zero_prob is None else check_open_unit("zero_prob", zero_prob)
    sd = None if scale is None else _check_scale(scale, len(loss.noised))
    needs_x2 = method in ("dr", "sdr", "sl")
    a2 = None
    if needs_x2:
        if x2 is None:
            if delta is None or sd is None:
                raise ParameterError(
                    "x2 was not given: zero_prob (in (0, 1)) and scale (> 0) are needed to draw it"
                )
            a2 = _double(a1, loss.noised, delta, sd, as_generator(rng))
        else:
            a2 = loss.check_x(x2, "x2")
            if a2.shape != a1.shape:
                raise ParameterError(f"x2 must have the same shape as x1 {a1.shape}, got {a2.shape}")
    if method in ("sdr", "sl") and sd is None and loss.smooth:
        raise ParameterError(
            f"scale (> 0, one noise std per noised column) is required for method={method!r}"
        )
    closs = corrected_loss(loss, method, delta, None if sd is None or method not in ("sdr", "sl") else sd**2)
    t0 = None if theta0 is None else loss.check_theta(theta0, p)

    closed = _closed_form(closs, a1, a2)
    if closed is not None:
        theta, converged, how = closed, True, "closed form"
    else:
        theta, converged, how = minimise(closs, a1, a2, t0)
    cov, check_ok, ratio, V = _sandwich(closs, a1, a2, theta)
    if closed is None:
        # BFGS often stops on "precision loss" at the optimum: the Newton-step check decides.
        converged = check_ok if loss.smooth_theta else (converged and check_ok)
    if not converged:
        warnings.warn(
            f"m_estimate({loss.name}, method={method!r}) did not converge ({how}; "
            f"Newton step / stderr = {ratio:.3g})",
            ConvergenceWarning,
            stacklevel=2,
        )
    logger.debug("m_estimate %s %s n=%d via %s, step ratio %.3g", loss.name, method, n, how, ratio)
    return MEstimate(theta, cov, n, method, converged, level, {"how": how, "step_ratio": ratio, "V": V})


# ---------------------------------------------------------------------------------------------
# closed forms
# ---------------------------------------------------------------------------------------------


def _closed_form(closs: CorrectedLoss, x1, x2) -> np.ndarray | None:
    L, m, d = closs.loss, closs.method, closs.zero_prob
    if isinstance(L, SquaredLoss):
        if m == "dr":
            return (x1.mean(axis=0) - (1.0 - d) * x2.mean(axis=0)) / d
        return (x2 if m == "sl" else x1).mean(axis=0)
    if isinstance(L, TransformSquaredLoss):
        if m == "dr":
            return np.array([(L.transform(x1).mean() - (1.0 - d) * L.transform(x2).mean()) / d])
        if m in ("naive", "oracle"):
            return np.array([L.transform(x1).mean()])
        # SL/SDR: θ = mean g(x_ref) − c·mean Σ_j σ_j² ∂_j² g(x₂), c = ½ (SL) or ½(1−δ) (SDR)
        corr = float(np.mean(L._deriv(L.d2g, x2) @ closs.noise_var))
        ref = x2 if m == "sl" else x1
        c = 0.5 if m == "sl" else 0.5 * (1.0 - d)
        return np.array([L.transform(ref).mean() - c * corr])
    if isinstance(L, LinearRegressionLoss) and L.label is None:
        return _linreg_closed(closs, x1, x2)
    if isinstance(L, CheckLoss):
        if m == "dr":
            z = np.concatenate([x1[:, 0], x2[:, 0]])
            w = np.concatenate([np.full(x1.shape[0], 1.0 / d), np.full(x2.shape[0], -(1.0 - d) / d)])
        else:
            z, w = x1[:, 0], np.ones(x1.shape[0])
        return np.array([_weighted_check_argmin(z, w, L.tau)])
    return None


def _linreg_closed(closs: CorrectedLoss, x1, x2) -> np.ndarray:
    """Corrected least squares: every corrected objective is quadratic in β (docs/mechanisms.md §3.4)."""
    L, m, d = closs.loss, closs.method, closs.zero_prob
    n = x1.shape[0]
    if m in ("naive", "oracle", "sdr"):
        z, y = L._design(x1), L._y(x1)
        G, b = z.T @ z / n, z.T @ y / n
    elif m == "sl":
        z, y = L._design(x2), L._y(x2)
        G, b = z.T @ z / n, z.T @ y / n
    else:  # dr
        z1, y1, z2, y2 = L._design(x1), L._y(x1), L._design(x2), L._y(x2)
        G = (z1.T @ z1 - (1.0 - d) * (z2.T @ z2)) / (n * d)
        b = (z1.T @ y1 - (1.0 - d) * (z2.T @ y2)) / (n * d)
    if m in ("sdr", "sl"):
        pos, coef, _ = L._noise_map(x1.shape[1])
        c = (1.0 - d) if m == "sdr" else 1.0
        G = G.copy()
        G[coef, coef] -= c * closs.noise_var[pos]
    try:
        return np.linalg.solve(G, b)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(G, b, rcond=None)[0]


def _weighted_check_argmin(z: np.ndarray, w: np.ndarray, tau: float) -> float:
    """Exact global minimiser of ``Σ w_i ρ_τ(z_i − θ)`` (Σw > 0): the objective is piecewise
    linear with kinks at the ``z_i``, so it is evaluated at every kink in O(m log m)."""
    order = np.argsort(z, kind="stable")
    zs, ws = z[order], w[order]
    W, Swz = ws.sum(), ws @ zs
    cw = np.concatenate([[0.0], np.cumsum(ws)[:-1]])  # weight strictly before position k
    cwz = np.concatenate([[0.0], np.cumsum(ws * zs)[:-1]])
    obj = tau * (Swz - zs * W) - (cwz - zs * cw)
    return float(zs[int(np.argmin(obj))])


# ---------------------------------------------------------------------------------------------
# sandwich
# ---------------------------------------------------------------------------------------------


def _numeric_v(closs: CorrectedLoss, x1, x2, theta: np.ndarray, steps: np.ndarray) -> np.ndarray:
    q = theta.size
    V = np.empty((q, q))
    for k in range(q):
        e = np.zeros(q)
        e[k] = steps[k]
        V[:, k] = (closs.mean_grad(x1, x2, theta + e) - closs.mean_grad(x1, x2, theta - e)) / (2 * steps[k])
    return 0.5 * (V + V.T)


def _smoothed_v(closs: CorrectedLoss, x1, x2, theta, h: float) -> np.ndarray | None:
    """V from the loss's kernel-smoothed Hessian, corrected like the loss (DR: [H₁ − (1−δ)H₂]/δ)."""
    L, m = closs.loss, closs.method
    if m == "dr":
        h1 = L.smoothed_hessian(x1, theta, h)
        if h1 is None:
            return None
        d = closs.zero_prob
        V = (h1 - (1.0 - d) * L.smoothed_hessian(x2, theta, h)) / d
    else:
        V = L.smoothed_hessian(x2 if m == "sl" else x1, theta, h)
        if V is None:
            return None
    return 0.5 * (V + V.T)


def _sandwich(closs: CorrectedLoss, x1, x2, theta) -> tuple[np.ndarray, bool, float, np.ndarray]:
    """Plug-in ``V⁻¹AV⁻¹/n``; returns (cov, check passed, Newton-step/stderr ratio, V)."""
    L = closs.loss
    n = x1.shape[0] if x1 is not None else x2.shape[0]
    g = closs.grad(x1, x2, theta)
    gbar = g.mean(axis=0)
    gc = g - gbar
    A = gc.T @ gc / n
    xref = x2 if closs.method == "sl" else x1
    V = None
    if not L.smooth_theta:
        h = _ROUGH_C * n ** (-_ROUGH_EXP) * L.residual_spread(xref, theta)
        V = _smoothed_v(closs, x1, x2, theta, h)
    if V is None:
        s = L.theta_scale(xref, theta)
        steps = s * (1e-4 if L.smooth_theta else _ROUGH_C * n ** (-_ROUGH_EXP))
        V = _numeric_v(closs, x1, x2, theta, steps)
    eig = np.linalg.eigvalsh(V)
    q = theta.size
    if not np.all(eig > 1e-12 * max(1.0, float(np.abs(eig).max()))):
        return np.full((q, q), np.inf), False, math.inf, V
    Vinv = np.linalg.inv(V)
    cov = Vinv @ A @ Vinv / n
    se = np.sqrt(np.clip(np.diag(cov), 1e-300, None))
    ratio = float(np.max(np.abs(Vinv @ gbar) / se))
    tol = _CONV_TOL_SMOOTH if L.smooth_theta else _CONV_TOL_ROUGH
    return 0.5 * (cov + cov.T), ratio < tol, ratio, V


# ---------------------------------------------------------------------------------------------
# variance, DR CDF and quantiles
# ---------------------------------------------------------------------------------------------


def variance_estimate(x1, *, zero_prob: float, scale, level: float = 0.95) -> MEstimate:
    """SDR variance of each column: ``mean X̃₁² − (1 − δ)σ² − (mean X̃₁)²`` (docs/mechanisms.md §3.3).

    Parameters
    ----------
    x1 : array (n,) or (n, p)
        Released ``X̃₁`` (every column noised), original units.
    zero_prob : float
        δ ∈ (0, 1).
    scale : float or array (p,)
        Noise std ``σ_j > 0`` per column, units of x.
    level : float

    Returns
    -------
    MEstimate
        ``theta`` (p,) variances in units of x²; ``cov`` (p, p) from the influence function
        ``(x² − m₂) − 2m₁(x − m₁)`` (delta method); method "sdr".

    Raises
    ------
    ParameterError
        zero_prob ∉ (0, 1), scale ≤ 0, NaN/inf, empty input or wrong scale length.
    """
    a = check_finite_array("x1", x1, ndim=(1, 2))
    if a.ndim == 1:
        a = a[:, None]
    if a.shape[0] < 2:
        raise ParameterError(f"x1 must hold at least 2 records, got shape {a.shape}")
    d = check_open_unit("zero_prob", zero_prob)
    sd = _check_scale(scale, a.shape[1])
    level = check_open_unit("level", level)
    n = a.shape[0]
    m1 = a.mean(axis=0)
    sq = a * a
    m2 = sq.mean(axis=0)
    theta = m2 - (1.0 - d) * sd**2 - m1**2
    infl = (sq - m2) - 2.0 * m1 * (a - m1)
    cov = infl.T @ infl / n**2
    return MEstimate(theta, cov, n, "sdr", True, level)


def dr_cdf(x1, x2, t, zero_prob: float) -> np.ndarray:
    """DR CDF ``F̂(t) = [F̂₁(t) − (1 − δ)F̂₂(t)]/δ`` — unbiased for ``F_X(t)`` (docs/mechanisms.md §3.6).

    Parameters
    ----------
    x1, x2 : array (n,) or (n, 1)
        Released ``X̃₁`` and doubled ``X̃₂`` of one field, original units.
    t : float or array (k,)
        Evaluation points, units of x.
    zero_prob : float
        δ ∈ (0, 1).

    Returns
    -------
    ndarray (k,) (or float for scalar ``t``)
        Not necessarily monotone nor in [0, 1].

    Raises
    ------
    ParameterError
        NaN/inf, shape mismatch, zero_prob ∉ (0, 1).
    """
    a1, a2 = _as_column("x1", x1), _as_column("x2", x2)
    if a1.shape != a2.shape:
        raise ParameterError(f"x2 must have the same shape as x1 {a1.shape}, got {a2.shape}")
    d = check_open_unit("zero_prob", zero_prob)
    tt = check_finite_array("t", t, ndim=(0, 1))
    f1 = np.searchsorted(np.sort(a1), tt, side="right") / a1.size
    f2 = np.searchsorted(np.sort(a2), tt, side="right") / a2.size
    out = (f1 - (1.0 - d) * f2) / d
    return float(out) if tt.ndim == 0 else out


def _iso_cdf(a1: np.ndarray, a2: np.ndarray, d: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted support ``z``, raw DR CDF at ``z`` and its isotonic (PAVA) fit clipped to [0, 1]."""
    n = a1.size
    z = np.concatenate([a1, a2])
    w = np.concatenate([np.full(n, 1.0 / (n * d)), np.full(n, -(1.0 - d) / (n * d))])
    order = np.argsort(z, kind="stable")
    z, w = z[order], w[order]
    raw = np.cumsum(w)
    iso = np.clip(optimize.isotonic_regression(raw).x, 0.0, 1.0)
    return z, raw, iso


def _iso_inverse(z: np.ndarray, iso: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """Invert the monotone CDF: pooled blocks → (block centre, block value), linear between."""
    change = np.flatnonzero(np.diff(iso) > 0) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [iso.size]])
    centres = 0.5 * (z[starts] + z[ends - 1])
    vals = iso[starts]
    return np.interp(tau, vals, centres, left=z[0], right=z[-1])


def dr_quantile(x1, x2, tau, zero_prob: float, *, level: float = 0.95) -> MEstimate:
    """DR quantile(s): the inverse of the isotonic (PAVA) version of :func:`dr_cdf`.

    Parameters
    ----------
    x1, x2 : array (n,) or (n, 1)
        Released ``X̃₁`` and doubled ``X̃₂``, original units.
    tau : float or array (k,)
        Quantile levels in (0, 1).
    zero_prob : float
        δ ∈ (0, 1).
    level : float
        Default CI level.

    Returns
    -------
    MEstimate
        ``theta`` (k,) quantiles in units of x; ``cov`` (k, k) sandwich
        ``Cov(ψ_a, ψ_b) / (n f_a f_b)`` with the DR score
        ``ψ = [1{x₁ ≤ q} − (1−δ)1{x₂ ≤ q}]/δ − τ`` and the density ``f`` estimated by a central
        DR-corrected Gaussian kernel estimate ``[f̂₁ − (1−δ)f̂₂]/δ`` (the derivative of the
        kernel-smoothed DR CDF) with bandwidth ``n^(−1/5)·IQR(X̃₁)/1.349``; method "dr".

    Raises
    ------
    ParameterError
        NaN/inf, shape mismatch, zero_prob or a tau ∉ (0, 1).

    Warns
    -----
    ConvergenceWarning
        If the estimated density at a quantile is not positive (then ``converged=False`` and the
        variance is infinite).

    Notes
    -----
    docs/mechanisms.md §3.6 (DR CDF, isotonic inverse); paper §4 (check loss DR estimator, sandwich).
    """
    a1, a2 = _as_column("x1", x1), _as_column("x2", x2)
    if a1.shape != a2.shape:
        raise ParameterError(f"x2 must have the same shape as x1 {a1.shape}, got {a2.shape}")
    d = check_open_unit("zero_prob", zero_prob)
    level = check_open_unit("level", level)
    taus = np.atleast_1d(check_finite_array("tau", tau, ndim=(0, 1)))
    if np.any((taus <= 0) | (taus >= 1)):
        raise ParameterError(f"tau must be in (0, 1), got {taus.tolist()}")
    n = a1.size
    z, _raw, iso = _iso_cdf(a1, a2, d)
    q = _iso_inverse(z, iso, taus)
    # Bandwidth from the spread of X̃₁ (wider than X's): the DR density estimate's variance is
    # inflated by ~1/δ, so the larger bandwidth is the better bias/variance trade (and matches
    # CheckLoss in m_estimate).
    spread = float(_robust_spread_1d(a1))
    h = spread * n ** (-0.2)

    dens = (_kde(a1, q, h) - (1.0 - d) * _kde(a2, q, h)) / d
    psi = ((a1[:, None] <= q) - (1.0 - d) * (a2[:, None] <= q)) / d - taus
    psi = psi - psi.mean(axis=0)
    A = psi.T @ psi / n
    ok = bool(np.all(dens > 0))
    if ok:
        cov = A / np.outer(dens, dens) / n
    else:
        cov = np.full((taus.size, taus.size), np.inf)
        warnings.warn(
            f"dr_quantile: non-positive density estimate at tau={taus[dens <= 0].tolist()}; "
            "variance is infinite (too few records for this zero_prob/scale)",
            ConvergenceWarning,
            stacklevel=2,
        )
    return MEstimate(q, cov, n, "dr", ok, level, {"density": dens, "bandwidth": h})


def _robust_spread_1d(a: np.ndarray) -> float:
    q75, q25 = np.percentile(a, [75, 25])
    s = (q75 - q25) / 1.349
    return float(s if s > 0 else (np.std(a) or 1.0))


def _kde(a: np.ndarray, t: np.ndarray, h: float) -> np.ndarray:
    """Gaussian kernel density of the sample ``a`` at points ``t`` (k,), bandwidth ``h``."""
    u = (a[:, None] - t[None, :]) / h
    return np.exp(-0.5 * u * u).mean(axis=0) / (h * math.sqrt(2.0 * math.pi))
