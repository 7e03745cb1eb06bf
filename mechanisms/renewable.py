"""Renewable (online) M-estimation on corrected losses: a warm-up batch fit, then Newton updates
that carry the past in a quadratic, with a sandwich covariance and an exact, order-free pooling.

Sources: Luo & Song (2020, JRSS-B, "Renewable estimation and incremental inference in generalized
linear models with streaming data sets"); Schifano, Wu, Wang, Yan & Chen (2016, Technometrics,
"Online updating of statistical inference in the big data setting"); for kinked losses the
kernel-smoothed Hessian of He, Pan, Tan & Zhou (2023, J. Econometrics, "Smoothed quantile
regression with large-scale inference"). docs/mechanisms.md §6.5–§6.8.

With ``ℓ*`` a corrected loss (:mod:`mechanisms.corrected`), ``g_i(θ)`` its per-record θ-gradient and
``Ĥ(θ)`` the corrected θ-Hessian summed over a block of records (the DR combination
``[H(x₁) − (1−δ)H(x₂)]/δ`` of an analytic, kernel-smoothed or numerical Hessian; ``H(x₁)`` for
naive/oracle):

* **warm-up** — the first block is fitted in batch (:func:`mechanisms.estimation.m_estimate`, the
  fit ``analyze`` runs): ``θ̂``, ``H = Ĥ(θ̂)``, ``A = Σ g_i(θ̂) g_i(θ̂)ᵀ``;
* **renewal** — each later block b: ``θ̂ ← argmin Σ_{i∈b} ℓ*(θ) + ½(θ − θ̂)ᵀH(θ − θ̂)`` by Newton
  steps from ``θ̂`` (matrix ``H + Ĥ_b(θ)``), then ``H ← H + Ĥ_b(θ̂)``, ``A ← A + Σ_{i∈b} g_i gᵢᵀ``;
* **inference** — ``Cov = H⁻¹ A H⁻¹``;
* **pooling** independent fits (partitions) — ``H = ΣH_k``, ``θ̂ = H⁻¹ Σ H_k θ̂_k``, ``A = ΣA_k``.

Smooth θ-gradients (logistic, Huber, smooth user losses) take Newton steps until the Newton
decrement ``sᵀ(H + Ĥ_b)s`` is at most ``tol`` (≈ a step of 10⁻³ standard errors). Kinked losses
(check, quantile regression, hinge) keep their exact sub-gradient — an unbiased estimating
equation, no smoothing bias in θ̂ — and take one Newton step with a Gaussian-kernel smoothed
Hessian of bandwidth :func:`kink_bandwidth`; their sub-gradient jumps would make further steps
cycle.

A loss with a ``project(θ)`` method (k-means, mixtures: parameters that must stay in bounds) has
every renewal step projected by it.

Positive definiteness: when ``H + Ĥ_b`` is not positive definite (a DR Hessian of a small block
can be indefinite) the step uses ``H`` alone; when ``H + Ĥ_b(θ̂)`` is not, that block's Hessian is
not added; a block whose Newton step is not finite is skipped (its reports counted in ``n``).
All are counted in :attr:`RenewableFit.guarded`. A warm-up Hessian that is not
positive definite gives no fit when the caller can wait for more reports (``floor=False``), else
has its eigenvalues floored at ``1e-9·max λ`` (counted too); one that is not finite or has no
positive eigenvalue gives no fit (:meth:`Renewable.warm_start` returns None).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

import numpy as np

from mechanisms.corrected import CorrectedLoss
from mechanisms.errors import ConvergenceWarning, ParameterError

__all__ = ["BANDWIDTH_C", "BANDWIDTH_POWER", "NEWTON_TOL", "Renewable", "RenewableFit", "hessian_mode",
           "is_positive_definite", "kink_bandwidth", "pool"]

#: Kinked losses: smoothed-Hessian bandwidth ``h = BANDWIDTH_C · s · n^(−BANDWIDTH_POWER)`` with
#: ``s`` the robust spread of the kink variable (residual, margin) of the released reports at the
#: warm-up fit and ``n`` the reports fitted so far (docs/mechanisms.md §6.7).
BANDWIDTH_C = 0.6
BANDWIDTH_POWER = 0.2
#: Smooth losses stop their Newton steps once the decrement ``sᵀMs`` is at most this.
NEWTON_TOL = 1e-6
#: Newton steps per block at most (smooth losses; kinked ones take one).
MAX_NEWTON = 8
_EIG_FLOOR = 1e-9


def kink_bandwidth(spread: float, n: int) -> float:
    """Kernel bandwidth of a kinked loss's smoothed Hessian after ``n`` reports.

    Parameters
    ----------
    spread : float
        Robust spread (IQR/1.349) of the kink variable of the released reports, units of it (> 0).
    n : int
        Reports fitted so far (≥ 1).

    Returns
    -------
    float
        ``BANDWIDTH_C · spread · n^(−1/5)`` (docs/mechanisms.md §6.7).
    """
    return BANDWIDTH_C * float(spread) * float(max(n, 1)) ** (-BANDWIDTH_POWER)


def is_positive_definite(m: np.ndarray) -> bool:
    """Whether the symmetric matrix ``m`` has a Cholesky factor (finite entries required)."""
    if not np.all(np.isfinite(m)):
        return False
    try:
        np.linalg.cholesky(m)
    except np.linalg.LinAlgError:
        return False
    return True


def hessian_mode(loss, probe: np.ndarray, theta: np.ndarray) -> str:
    """How block Hessians of ``loss`` are formed: ``"analytic"`` (``mean_hessian_theta``),
    ``"smoothed"`` (kinked losses with ``smoothed_hessian``) or ``"numeric"`` (central
    differences of the corrected gradient).

    Parameters
    ----------
    loss : mechanisms.losses.Loss
    probe : ndarray (k, p)
        A few records of the loss's shape, used to ask the loss what it provides.
    theta : ndarray (q,)
    """
    try:
        if loss.smooth_theta:
            return "analytic" if loss.mean_hessian_theta(probe, theta) is not None else "numeric"
        return "smoothed" if loss.smoothed_hessian(probe, theta, 1.0) is not None else "numeric"
    except (ArithmeticError, ValueError, TypeError, NotImplementedError):
        return "numeric"


@dataclass(frozen=True, eq=False)
class RenewableFit:
    """One renewable fit (immutable): the estimate and the sums behind its covariance.

    Attributes
    ----------
    theta : ndarray (q,)
        Estimate, units of the parameter.
    H : ndarray (q, q)
        Summed corrected θ-Hessian (≈ n·V), positive definite.
    A : ndarray (q, q)
        ``Σ g_i g_iᵀ`` of the per-record corrected gradients, each at its block's estimate.
    n : int
        Reports fitted.
    spread : float
        Robust spread of the kink variable at the warm-up fit (kinked losses; 1.0 otherwise).
    guarded : int
        How often the positive-definiteness guard acted (module docstring).
    """

    theta: np.ndarray
    H: np.ndarray
    A: np.ndarray
    n: int
    spread: float = 1.0
    guarded: int = 0

    def cov(self) -> np.ndarray:
        """Sandwich covariance ``H⁻¹ A H⁻¹``, shape (q, q)."""
        hinv = np.linalg.inv(self.H)
        c = hinv @ self.A @ hinv
        return 0.5 * (c + c.T)

    @property
    def stderr(self) -> np.ndarray:
        """``sqrt(diag(cov))``, shape (q,)."""
        return np.sqrt(np.clip(np.diag(self.cov()), 0.0, None))


def pool(fits) -> RenewableFit:
    """Pool independent fits (partitions): ``H = ΣH_k``, ``θ̂ = H⁻¹ΣH_kθ̂_k``, ``A = ΣA_k``.

    The result does not depend on the order of ``fits`` beyond rounding.

    Parameters
    ----------
    fits : sequence of RenewableFit (at least one, same q)

    Returns
    -------
    RenewableFit
        ``spread`` is the n-weighted mean of the fits' spreads.

    Raises
    ------
    ParameterError
        No fits, or fits of different dimensions.
    """
    fits = list(fits)
    if not fits:
        raise ParameterError("pool needs at least one fit")
    q = fits[0].theta.size
    if any(f.theta.size != q for f in fits):
        raise ParameterError("pool: the fits have different numbers of parameters")
    if len(fits) == 1:
        return fits[0]
    H = sum(f.H for f in fits)
    h_theta = sum(f.H @ f.theta for f in fits)
    n = sum(f.n for f in fits)
    spread = sum(f.n * f.spread for f in fits) / max(n, 1)
    return RenewableFit(np.linalg.solve(H, h_theta), H, sum(f.A for f in fits), n, spread,
                        sum(f.guarded for f in fits))


def _floor_eigenvalues(H: np.ndarray) -> np.ndarray | None:
    """``H`` with its eigenvalues floored at ``_EIG_FLOOR·max|λ|``; None when H is not finite or
    has no clearly positive eigenvalue (nothing to floor against)."""
    if not np.all(np.isfinite(H)):
        return None
    w, v = np.linalg.eigh(0.5 * (H + H.T))
    top = float(np.max(w)) if w.size else 0.0
    if not top > 1e-12 * max(1.0, float(np.max(np.abs(w)))):
        return None
    w = np.maximum(w, _EIG_FLOOR * top)
    return (v * w) @ v.T


class Renewable:
    """Renewable M-estimation of one corrected loss (module docstring; docs/mechanisms.md §6.5).

    Parameters
    ----------
    closs : mechanisms.corrected.CorrectedLoss
        The corrected loss (DR/SDR/SL/naive/oracle; DR and SDR need ``zero_prob``).
    p : int
        Record width (columns of ``x1``/``x2``).
    theta0 : array (q,), optional
        Start of the warm-up fit (default: the fit's own start).

    Raises
    ------
    ParameterError
        ``closs`` is not a corrected loss, or ``p`` does not fit the loss.
    """

    def __init__(self, closs: CorrectedLoss, p: int, *, theta0=None) -> None:
        if not isinstance(closs, CorrectedLoss):
            raise ParameterError(f"closs must be a CorrectedLoss, got {type(closs).__name__}")
        self.closs = closs
        self.loss = closs.loss
        if p < self.loss.min_columns():
            raise ParameterError(f"p must be at least {self.loss.min_columns()} for {self.loss.name}, "
                                 f"got {p}")
        self.p = int(p)
        self.q = self.loss.n_params(self.p)
        self.theta0 = None if theta0 is None else self.loss.check_theta(theta0, self.p)
        probe = np.zeros((2, self.p))
        probe[1] = 0.5
        self.mode = hessian_mode(self.loss, probe, np.zeros(self.q) if theta0 is None else self.theta0)
        self.kinked = not self.loss.smooth_theta

    # ------------------------------------------------------------------ block sums
    def hessian(self, x1, x2, theta: np.ndarray, n_total: int, spread: float) -> np.ndarray:
        """Corrected θ-Hessian summed over a block, (q, q).

        Parameters
        ----------
        x1, x2 : ndarray (m, p)
            The block's released and doubled records (``x2`` unused for naive/oracle).
        theta : ndarray (q,)
        n_total : int
            Reports fitted once this block is in (sets a kinked loss's bandwidth).
        spread : float
            The fit's kink-variable spread (:func:`kink_bandwidth`).
        """
        L, c, m = self.loss, self.closs, x1.shape[0]
        if self.mode == "numeric":
            # central differences of the summed corrected gradient: steps 1e-5·max(1, |θ|) for a
            # smooth θ-gradient, n^(−1/5)·theta_scale across a kinked one (as the batch fit)
            if self.kinked:
                steps = float(n_total) ** (-BANDWIDTH_POWER) * L.theta_scale(x1, theta)
            else:
                steps = 1e-5 * np.maximum(1.0, np.abs(theta))
            out = np.empty((self.q, self.q))
            for k in range(self.q):
                e = np.zeros(self.q)
                e[k] = steps[k]
                hi = c.grad(x1, x2, theta + e).sum(axis=0)
                out[:, k] = (hi - c.grad(x1, x2, theta - e).sum(axis=0)) / (2.0 * steps[k])
            return 0.5 * (out + out.T)
        if self.mode == "analytic":
            def one(x):
                return L.mean_hessian_theta(x, theta)
        else:
            bw = kink_bandwidth(spread, n_total)

            def one(x):
                return L.smoothed_hessian(x, theta, bw)
        h1 = one(x1) * m
        if c.method in ("naive", "oracle"):
            out = h1
        else:
            d = c.zero_prob
            out = (h1 - (1.0 - d) * m * one(x2)) / d
        return 0.5 * (out + out.T)

    # ------------------------------------------------------------------ fits
    def warm_start(self, x1, x2, *, floor: bool = True) -> tuple[RenewableFit | None, bool]:
        """The warm-up fit of a first block (:func:`mechanisms.estimation.m_estimate`).

        Parameters
        ----------
        x1, x2 : ndarray (m, p)
            Released and doubled records (``x2`` may be None for naive/oracle).
        floor : bool
            What to do when the fit's corrected Hessian is not positive definite: floor its
            eigenvalues at ``1e-9·max λ`` (counted in ``guarded``), or (False) give no fit — a
            renewal from a nearly singular H takes run-away steps, so a warm-up that can still
            grow should rather wait for more reports (docs/mechanisms.md §6.6).

        Returns
        -------
        (RenewableFit or None, converged)
            None when the block determines no fit: the batch fit is not finite (a DR objective
            of few reports can be unbounded below), its corrected Hessian has no positive
            eigenvalue, or (``floor=False``) is not positive definite. ``converged`` is the
            batch fit's convergence check.

        Raises
        ------
        ParameterError
            From ``m_estimate`` (e.g. NaN records).
        """
        from mechanisms.estimation import m_estimate

        c = self.closs
        scale = None if c.noise_var is None else np.sqrt(np.maximum(c.noise_var, np.finfo(float).tiny))
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", RuntimeWarning)  # overflow of a diverging fit: refused below
            try:
                est = m_estimate(self.loss, x1, x2 if c.needs_x2 else None, zero_prob=c.zero_prob,
                                 scale=scale, method=c.method, theta0=self.theta0)
            except (np.linalg.LinAlgError, FloatingPointError, OverflowError):
                return None, False
            theta = np.array(est.theta, dtype=np.float64)
            if not np.all(np.isfinite(theta)):
                return None, False
            m = x1.shape[0]
            spread = 1.0
            if self.kinked:
                spread = float(self.loss.residual_spread(x2 if c.method == "sl" else x1, theta))
                if not (math.isfinite(spread) and spread > 0):
                    spread = 1.0
            H = self.hessian(x1, x2, theta, m, spread)
            guarded = 0
            if not is_positive_definite(H):
                if not floor:
                    return None, False
                H, guarded = _floor_eigenvalues(H), 1
                if H is None:
                    return None, False
            g = c.grad(x1, x2, theta)
            A = g.T @ g
        if not np.all(np.isfinite(A)):
            return None, False
        return RenewableFit(theta, H, A, m, spread, guarded), bool(est.converged)

    def renew(self, fit: RenewableFit, x1, x2) -> RenewableFit:
        """One renewal with a block of reports (module docstring).

        Parameters
        ----------
        fit : RenewableFit
        x1, x2 : ndarray (m, p)

        Returns
        -------
        RenewableFit
        """
        with np.errstate(all="ignore"):  # a run-away step is refused below, not warned about
            return self._renew(fit, x1, x2)

    def _renew(self, fit: RenewableFit, x1, x2) -> RenewableFit:
        c, H, th0 = self.closs, fit.H, fit.theta
        n_new = fit.n + x1.shape[0]
        max_steps = 1 if self.kinked else MAX_NEWTON
        guarded = fit.guarded
        th = th0
        steps = 0
        project = getattr(self.loss, "project", None)  # a loss whose parameters have bounds
        while True:
            g = c.grad(x1, x2, th)
            hb = self.hessian(x1, x2, th, n_new, fit.spread)
            if steps == max_steps:
                break
            grad = g.sum(axis=0) + H @ (th - th0)
            M = H + hb
            if not is_positive_definite(M):
                M, guarded = H, guarded + 1
            try:
                step = np.linalg.solve(M, grad)
            except np.linalg.LinAlgError:
                step = np.full(self.q, np.nan)
            if not np.all(np.isfinite(step)):  # a block the fit cannot take: skip it (counted)
                return replace(fit, n=n_new, guarded=guarded + 1)
            if not self.kinked and float(step @ M @ step) <= NEWTON_TOL:
                break
            th = th - step if project is None else project(th - step)
            steps += 1
        h_new = H + hb
        if is_positive_definite(h_new):
            H = h_new
        else:
            guarded += 1
        return RenewableFit(th, H, fit.A + g.T @ g, n_new, fit.spread, guarded)
