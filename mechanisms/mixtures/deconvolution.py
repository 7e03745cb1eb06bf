"""The exact likelihood of ZIL reports of a diagonal Gaussian mixture ("deconvolution").

Source: docs/mechanisms.md §7.5; extreme deconvolution (Bovy, Hogg & Roweis 2011, Ann. Appl.
Stat. 5, 1657) with the ZIL noise law. A ZIL report is the raw value with probability δ and
otherwise the raw value plus SL noise ``√W·G``, ``W ~ Exp(1)``, ``G ~ N(0, diag s²)`` (Lu, Chen &
Qiu, arXiv 2501.15127, §3). Given ``W = w`` the report of component ``j`` is Gaussian,
``N(μ_j, diag(σ_j² + w s²))``, so the report density is

    ``g(x) = Σ_j π_j [δ φ(x; μ_j, σ_j²) + (1 − δ) ∫₀^∞ φ(x; μ_j, σ_j² + w s²) e^{−w} dw]``.

The ``w``-integral is a trapezoid rule in ``t = log w`` (:func:`scale_nodes`; the integrand
decays doubly exponentially at the top, and the mass below the first node is put on ``w = 0``).
The loss ``−log g(x)`` needs only the released ``x̃₁`` and is used
with ``method = "naive"`` (no correction: it is already the reports' likelihood). It ignores the
clipping of raw values into the schema bounds (exact when the mixture has no mass outside them).

Parameters are those of :class:`mechanisms.mixtures.gaussian.GaussianMixtureLoss`.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize
from scipy.special import logsumexp, softmax

from mechanisms._validate import check_finite_array, check_open_unit
from mechanisms.errors import ParameterError
from mechanisms.mixtures.gaussian import GaussianMixtureLoss

__all__ = ["DeconvolutionMixtureLoss", "scale_nodes"]

_LOG_2PI = math.log(2.0 * math.pi)
#: Rows per block when evaluating the likelihood (bounds the (rows, k, nodes) arrays).
_CHUNK = 20_000


def scale_nodes(step: float = 0.4, t_min: float = -12.0, t_max: float = 5.5) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of ``∫₀^∞ f(w) e^{−w} dw ≈ Σ_l ω_l f(w_l)``.

    Trapezoid rule in ``t = log w`` on ``[t_min, t_max]`` with ``step`` (half weights at the
    ends), plus the node ``w = 0`` carrying ``1 − e^{−w_min}``, the mass below the first node.
    For the defaults ``Σ ω = 1`` and ``Σ ω w = E W = 1`` to 10⁻⁵; the report density is within
    10⁻³ (relative) of adaptive quadrature for component variances down to 10⁻⁴ of the noise
    variance and reports up to 10 noise standard deviations from a mean (tests/mechanisms).

    Returns
    -------
    (w (L,), omega (L,)) : ndarrays, ``w[0] = 0``
    """
    t = np.arange(t_min, t_max + 1e-12, step)
    w = np.exp(t)
    om = step * w * np.exp(-w)
    om[0] *= 0.5
    om[-1] *= 0.5
    return np.concatenate([[0.0], w]), np.concatenate([[1.0 - math.exp(-w[0])], om])


class DeconvolutionMixtureLoss(GaussianMixtureLoss):
    """``−log g(x̃₁)`` of a ZIL report under a diagonal Gaussian mixture (module docstring).

    Parameters
    ----------
    k, p : int
        Components (1 … 50) and fields (≥ 1).
    zero_prob : float
        δ ∈ (0, 1) of the ZIL release.
    noise_var : float or array (p,)
        ``s²``, the SL covariance diagonal per field, in the units of the records squared
        (``(λ·range)²`` in original units; ``(2λ)²`` in box-standardized ones).
    box, n_init, seed
        As :class:`mechanisms.mixtures.gaussian.GaussianMixtureLoss`.

    Notes
    -----
    :meth:`minimise`: L-BFGS-B with the analytic gradient, first on at most 50000 reports from
    the DR k-means start, then on all of them from there. Use with ``method = "naive"``.

    Raises
    ------
    ParameterError
        zero_prob ∉ (0, 1), a noise variance ≤ 0 or of the wrong length, and as the parent.
    """

    name = "deconvolution_mixture"

    def __init__(self, k: int, p: int, *, zero_prob: float, noise_var, box=None, n_init: int = 5,
                 seed: int = 0) -> None:
        super().__init__(k, p, box=box, n_init=n_init, seed=seed)
        self.zero_prob = check_open_unit("zero_prob", zero_prob)
        s2 = check_finite_array("noise_var", noise_var, ndim=(0, 1))
        s2 = np.broadcast_to(s2, (self.p,)).astype(np.float64) if s2.ndim == 0 or s2.shape == (self.p,) \
            else None
        if s2 is None or np.any(s2 <= 0):
            raise ParameterError(f"noise_var must be a number > 0 or {self.p} numbers > 0 (one per field)")
        self.noise_var = s2
        w, om = scale_nodes()
        self._w = w
        lw = np.log(np.concatenate([[self.zero_prob + (1.0 - self.zero_prob) * om[0]],
                                    (1.0 - self.zero_prob) * om[1:]]))
        self._log_omega = lw

    def _parts(self, x, theta):
        """Per (record, component, node) log joint terms and what the gradient needs."""
        a, mu, v = self.split(theta)
        s2 = np.exp(v)  # (k, p)
        V = s2[:, None, :] + self._w[None, :, None] * self.noise_var[None, None, :]  # (k, L, p)
        iV = 1.0 / V
        res = x[:, None, :] - mu[None]  # (n, k, p)
        r2 = res * res
        Q = np.stack([r2[:, j] @ iV[j].T for j in range(self.k)], axis=1)  # (n, k, L)
        logc = (a - logsumexp(a))[:, None] + self._log_omega[None] \
            - 0.5 * (self.p * _LOG_2PI + np.log(V).sum(axis=2))  # (k, L)
        return logc[None] - 0.5 * Q, res, iV, s2

    def value_grad(self, x, theta, *, grad: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-record loss (n,) and, with ``grad``, its θ-gradient (n, q), in one pass."""
        k, p, n = self.k, self.p, x.shape[0]
        val = np.empty(n)
        out = np.empty((n, self.n_params(p))) if grad else None
        a = theta[:k]
        pen = 0.5 * float(a.sum()) ** 2
        pi = softmax(a)
        for s in range(0, n, _CHUNK):
            lj, res, iV, s2 = self._parts(x[s:s + _CHUNK], theta)
            m = lj.shape[0]
            flat = lj.reshape(m, -1)
            top = flat.max(axis=1, keepdims=True)
            e = np.exp(flat - top)
            tot = e.sum(axis=1, keepdims=True)
            val[s:s + m] = pen - (top[:, 0] + np.log(tot[:, 0]))
            if not grad:
                continue
            R = (e / tot).reshape(lj.shape)  # (m, k, L): posterior of (component, noise scale)
            r = R.sum(axis=2)
            e1 = np.stack([R[:, j] @ iV[j] for j in range(k)], axis=1)  # (m, k, p)
            e2 = np.stack([R[:, j] @ (iV[j] * iV[j]) for j in range(k)], axis=1)
            out[s:s + m, :k] = pi[None] - r + float(a.sum())
            out[s:s + m, k:k + k * p] = (-res * e1).reshape(m, -1)
            out[s:s + m, k + k * p:] = (-0.5 * s2[None] * (res * res * e2 - e1)).reshape(m, -1)
        return val, out

    def value(self, x, theta):
        return self.value_grad(x, theta, grad=False)[0]

    def grad(self, x, theta):
        return self.value_grad(x, theta)[1]

    def minimise(self, closs, x1, x2, theta0) -> tuple[np.ndarray, bool, str]:
        """Maximum likelihood of the reports (class Notes); returns ``(θ, converged, how)``.

        Raises
        ------
        ParameterError
            Fewer reports than parameters, or a method other than naive.
        """
        if closs.method != "naive":
            raise ParameterError("the deconvolution likelihood is already the reports' likelihood: "
                                 f"use method='naive', got {closs.method!r}")
        q = self.n_params(self.p)
        if x1.shape[0] < q:
            raise ParameterError(f"a {self.k}-component mixture in {self.p} field(s) has {q} parameters "
                                 f"and needs at least {q} reports, got {x1.shape[0]}")
        bounds = self.bounds(x1)
        lo, hi = np.array(bounds).T
        if theta0 is None:
            theta0 = self._start(x1, bounds)
        theta = np.clip(theta0, lo, hi)
        sub = x1 if x1.shape[0] <= 50_000 else x1[np.random.default_rng(self.seed).choice(
            x1.shape[0], 50_000, replace=False)]
        runs = [sub, x1] if sub is not x1 else [x1]
        res = None
        for data in runs:
            def fg(t, data=data):
                v, g = self.value_grad(data, t)
                return float(v.mean()), g.mean(axis=0)

            res = optimize.minimize(fg, theta, jac=True, method="L-BFGS-B", bounds=bounds,
                                    options={"maxiter": 1000, "ftol": 0.0, "gtol": 1e-9})
            theta = res.x
        return theta, bool(res.success), f"L-BFGS-B on the report likelihood ({res.message})"

    def _start(self, x1, bounds) -> np.ndarray:
        """DR k-means centres (naive k-means on the reports inside the box), equal weights and
        variances of a tenth of the box half-width squared."""
        from mechanisms.corrected import corrected_loss

        km = corrected_loss(self._kmeans, "naive")
        seeds = self._kmeans._seed_rows(x1)
        C = self._kmeans.centres(self._kmeans.minimise(km, seeds, None, None)[0])
        b = np.array(bounds)
        v_hi = b[self.k + self.k * self.p:, 1].reshape(self.k, self.p)
        return np.concatenate([np.zeros(self.k), C.ravel(), (v_hi + math.log(0.01)).ravel()])

    def __repr__(self) -> str:
        return f"DeconvolutionMixtureLoss(k={self.k}, p={self.p}, zero_prob={self.zero_prob})"
