"""DR Gaussian mixture with diagonal covariances: the mixture negative log-likelihood as a loss,
and its batch fit (bounded quasi-Newton from the DR k-means solution).

Source: docs/mechanisms.md §7.3. ``ℓ(x, θ) = −log Σ_j π_j φ(x; μ_j, diag σ_j²)`` is continuous
in ``x``, so its DR corrected version is unbiased for the raw data's negative log-likelihood
(Lu, Chen & Qiu, arXiv 2501.15127, §4) and the DR fit is consistent for the mixture's
parameters. The naive fit (``method = "naive"``) is the ordinary maximum-likelihood fit of the
reports as if they were raw; the exact likelihood of the reports is
:mod:`mechanisms.mixtures.deconvolution`.

Parameters (q = k + 2kp), stored group after group:

* ``α`` (k): weight logits, ``π = softmax(α)``;
* ``μ`` (k, p): means, row after row;
* ``v`` (k, p): log-variances, ``σ² = exp(v)``.

``softmax`` does not change when every ``α_j`` moves by the same amount; the loss adds
``½(Σ_j α_j)²`` (constant in ``x``, so no correction touches it), which fixes ``Σ α = 0`` at the
minimum and keeps the Hessian non-singular without singling out a component — a permutation of
components is a permutation of θ (:mod:`mechanisms.mixtures.components`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import logsumexp, softmax

from mechanisms._validate import check_finite_array
from mechanisms.errors import ParameterError
from mechanisms.losses.base import Loss
from mechanisms.mixtures.kmeans import KMeansLoss, _check_k, _check_p, _nearest, corrected_weights, stacked

__all__ = ["VAR_FLOOR", "GaussianMixtureLoss", "mixture_parameters"]

_LOG_2PI = math.log(2.0 * math.pi)
#: Lower bound of a component variance, relative to the squared half-width of the box.
VAR_FLOOR = 1e-6
#: Weight logits are kept in [−_ALPHA_BOUND, _ALPHA_BOUND].
_ALPHA_BOUND = 15.0


def mixture_parameters(theta: np.ndarray, k: int, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(weights (k,), means (k, p), variances (k, p))`` of a parameter vector (module docstring)."""
    t = np.asarray(theta, dtype=np.float64)
    return softmax(t[:k]), t[k:k + k * p].reshape(k, p), np.exp(t[k + k * p:].reshape(k, p))


def _box(box, p: int) -> tuple[np.ndarray, np.ndarray] | None:
    if box is None:
        return None
    lo = np.broadcast_to(check_finite_array("box low", box[0], ndim=(0, 1)), (p,)).copy()
    hi = np.broadcast_to(check_finite_array("box high", box[1], ndim=(0, 1)), (p,)).copy()
    if np.any(lo >= hi):
        raise ParameterError("box: low must be < high in every column")
    return lo, hi


class GaussianMixtureLoss(Loss):
    """Negative log-likelihood of a ``k``-component Gaussian mixture with diagonal covariances.

    Parameters
    ----------
    k : int
        Components, 1 … 50.
    p : int
        Record width (every column noised), ≥ 1.
    box : (low, high), optional
        Bounds of the raw data per column (arrays (p,) or scalars), units of the records. The
        fit keeps the means in the box and the variances in ``[VAR_FLOOR·w², w²]`` with ``w``
        the box's half-width (a mixture likelihood is unbounded without a floor). Default: the
        range of the reports.
    n_init : int, seed : int
        Restarts and seed of the DR k-means solution the fit starts from (:class:`KMeansLoss`).

    Notes
    -----
    :meth:`minimise` (used by :func:`mechanisms.estimation.m_estimate`): DR k-means centres,
    corrected cell weights and within-cell variances as the start, then L-BFGS-B on the
    corrected objective with the analytic gradient. docs/mechanisms.md §7.3.

    Raises
    ------
    ParameterError
        ``k``, ``p`` out of range or an invalid box.
    """

    smooth = False  # DR only: no x-Laplacian is provided for SL/SDR
    smooth_theta = True
    name = "gaussian_mixture"

    def __init__(self, k: int, p: int, *, box=None, n_init: int = 5, seed: int = 0) -> None:
        self.k, self.p = _check_k(k), _check_p(p)
        self.noised = tuple(range(self.p))
        self.box = _box(box, self.p)
        self.seed = int(seed)
        self._kmeans = KMeansLoss(self.k, self.p, box=self.box, n_init=n_init, seed=seed)

    @property
    def widths(self) -> tuple[int, ...]:
        """Per-component widths of the parameter groups (α, μ, v)."""
        return (1, self.p, self.p)

    def n_params(self, p: int) -> int:
        return self.k * (1 + 2 * self.p)

    def min_columns(self) -> int:
        return self.p

    def _check_records(self, x, name):
        if x.shape[1] != self.p:
            raise ParameterError(f"{name} must have exactly {self.p} column(s), got shape {x.shape}")

    def split(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(α (k,), μ (k, p), v (k, p))`` views of θ."""
        k, p = self.k, self.p
        return theta[:k], theta[k:k + k * p].reshape(k, p), theta[k + k * p:].reshape(k, p)

    def centres(self, theta: np.ndarray) -> np.ndarray:
        """The means (k, p)."""
        return self.split(np.asarray(theta, dtype=np.float64))[1]

    def _log_joint(self, x, theta):
        a, mu, v = self.split(theta)
        iv = np.exp(-v)
        quad = (x * x) @ iv.T - 2.0 * (x @ (mu * iv).T) + (mu * mu * iv).sum(axis=1)[None]
        lc = a - logsumexp(a) - 0.5 * (self.p * _LOG_2PI + v.sum(axis=1))
        return lc[None] - 0.5 * quad, mu, iv

    def value(self, x, theta):
        lj = self._log_joint(x, theta)[0]
        return -logsumexp(lj, axis=1) + 0.5 * float(theta[:self.k].sum()) ** 2

    def grad(self, x, theta):
        lj, mu, iv = self._log_joint(x, theta)
        r = softmax(lj, axis=1)  # (n, k) responsibilities
        n = x.shape[0]
        a = theta[:self.k]
        ga = softmax(a)[None] - r + float(a.sum())
        res = x[:, None, :] - mu[None]  # (n, k, p)
        gmu = -(r[:, :, None] * res * iv[None])
        gv = 0.5 * r[:, :, None] * (1.0 - res * res * iv[None])
        return np.concatenate([ga, gmu.reshape(n, -1), gv.reshape(n, -1)], axis=1)

    def theta_scale(self, x, theta):
        v = self.split(theta)[2]
        return np.concatenate([np.ones(self.k), np.sqrt(np.exp(v)).ravel(), np.ones(self.k * self.p)])

    def initial_theta(self, x):
        C = self._kmeans.centres(self._kmeans.initial_theta(x))
        spread = np.var(x, axis=0) / max(self.k, 1) ** 2 + 1e-12
        return np.concatenate([np.zeros(self.k), C.ravel(), np.tile(np.log(spread), self.k)])

    # -- the batch fit ------------------------------------------------------------------------
    def bounds(self, x: np.ndarray) -> list[tuple[float, float]]:
        """L-BFGS-B bounds of θ (class docstring)."""
        lo, hi = self.box if self.box is not None else (x.min(axis=0), x.max(axis=0))
        half2 = ((hi - lo) / 2.0) ** 2
        out = [(-_ALPHA_BOUND, _ALPHA_BOUND)] * self.k
        out += [(float(lo[j]), float(hi[j])) for _ in range(self.k) for j in range(self.p)]
        out += [(math.log(VAR_FLOOR * half2[j]), math.log(half2[j])) for _ in range(self.k)
                for j in range(self.p)]
        return out

    def project(self, theta: np.ndarray) -> np.ndarray:
        """θ clipped into the bounds of the fit (:meth:`bounds`; needs a box, else unchanged)."""
        if self.box is None:
            return theta
        b = np.asarray(self.bounds(np.zeros((1, self.p))))
        return np.clip(theta, b[:, 0], b[:, 1])

    def start_from_centres(self, closs, x1, x2, C: np.ndarray, bounds) -> np.ndarray:
        """θ from centres: corrected cell weights and within-cell variances, clipped to the bounds."""
        z, w = stacked(closs, x1, x2)
        a, _ = _nearest(z, (z * z).sum(axis=1), C)
        W = np.bincount(a, w, minlength=self.k)
        var = np.empty((self.k, self.p))
        for j in range(self.k):
            sel = a == j
            if W[j] > 0:
                var[j] = (w[sel] @ (z[sel] - C[j]) ** 2) / W[j]
            else:
                var[j] = np.nan
        lo, hi = np.asarray(bounds, dtype=np.float64).T
        _, lo_m, lo_v = self.split(lo)
        _, hi_m, hi_v = self.split(hi)
        v = np.where(np.isfinite(var) & (var > 0), np.log(np.maximum(var, 1e-300)), 0.5 * (lo_v + hi_v))
        v = np.clip(v, lo_v, hi_v)
        pi = np.clip(W / max(W[W > 0].sum(), 1e-300), 1e-3, None)
        alpha = np.log(pi / pi.sum())
        alpha -= alpha.mean()
        return np.concatenate([alpha, np.clip(C, lo_m, hi_m).ravel(), v.ravel()])

    def minimise(self, closs, x1, x2, theta0) -> tuple[np.ndarray, bool, str]:
        """Batch fit of the corrected negative log-likelihood (class Notes); returns
        ``(θ, converged, how)``.

        Raises
        ------
        ParameterError
            Fewer reports than parameters, or SL/SDR.
        """
        corrected_weights(closs)  # DR, naive or oracle only
        q = self.n_params(self.p)
        if x1.shape[0] < q:
            raise ParameterError(f"a {self.k}-component mixture in {self.p} field(s) has {q} parameters "
                                 f"and needs at least {q} reports, got {x1.shape[0]}")
        bounds = self.bounds(x1)
        if theta0 is None:
            from mechanisms.corrected import corrected_loss

            km = corrected_loss(self._kmeans, closs.method, closs.zero_prob)
            C = self._kmeans.centres(self._kmeans.minimise(km, x1, x2, None)[0])
            theta0 = self.start_from_centres(closs, x1, x2, C, bounds)
        else:
            theta0 = np.clip(theta0, [b[0] for b in bounds], [b[1] for b in bounds])

        z, w = stacked(closs, x1, x2)
        theta, converged, it = self.dr_em(z, w, theta0, bounds)
        return theta, converged, f"DR-EM from DR k-means ({it} iterations)"

    def dr_em(self, z: np.ndarray, w: np.ndarray, theta: np.ndarray, bounds, *, max_iter: int = 2000,
              tol: float = 1e-9) -> tuple[np.ndarray, bool, int]:
        """Fixed-point iteration of the corrected likelihood equations ("DR-EM").

        With responsibilities ``r_ij`` at the current θ and the corrected weights ``w_i`` of the
        stacked sample (:func:`mechanisms.mixtures.kmeans.stacked`): ``π_j = Σ_i w_i r_ij / Σ_i
        w_i``, ``μ_j = Σ_i w_i r_ij z_i / W_j`` and ``σ_j² = Σ_i w_i r_ij (z_i − μ_j)² / W_j``
        with ``W_j = Σ_i w_i r_ij`` — the stationary-point equations of the corrected objective
        (docs/mechanisms.md §7.3). The corrected objective is not bounded below (its negative
        weights reward variances shrinking onto the noise), so the fit is this local fixed point
        reached from the DR k-means start, not a global minimiser. A component with ``W_j ≤ 0``
        keeps its values; variances and means are clipped to ``bounds``.

        Returns
        -------
        (θ (q,), converged, iterations)
        """
        b = np.asarray(bounds, dtype=np.float64)
        lo, hi = b[:, 0], b[:, 1]
        total = float(w.sum())
        zz = z * z
        theta = np.clip(np.asarray(theta, dtype=np.float64), lo, hi)
        for it in range(1, max_iter + 1):
            lj = self._log_joint(z, theta)[0]
            wr = softmax(lj, axis=1) * w[:, None]
            W = wr.sum(axis=0)
            _, mu, v = self.split(theta)
            ok = W > 1e-9 * float(np.abs(w).sum())
            mu_new, v_new = mu.copy(), v.copy()
            if np.any(ok):
                m = (wr[:, ok].T @ z) / W[ok, None]
                s2 = (wr[:, ok].T @ zz) / W[ok, None] - m * m
                mu_new[ok] = m
                v_new[ok] = np.log(np.maximum(s2, 1e-300))
            pi = np.clip(W / total, math.exp(-_ALPHA_BOUND), None)
            alpha = np.log(pi / pi.sum())
            alpha -= alpha.mean()
            new = np.clip(np.concatenate([alpha, mu_new.ravel(), v_new.ravel()]), lo, hi)
            change = float(np.abs(new - theta).max())
            theta = new
            if change <= tol:
                return theta, True, it
        return theta, False, max_iter

    def __repr__(self) -> str:
        return f"GaussianMixtureLoss(k={self.k}, p={self.p})"
