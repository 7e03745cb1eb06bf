"""Compiled mini-batch loop of :class:`aggregator.state.sgd.SGDState` for the built-in index losses.

The Python loop of ``SGDState._update`` pays ~100 µs of interpreter and NumPy call overhead per
mini-batch step (four gradient/Hessian calls on 64 rows), which capped a worker at ≈ 1.1·10⁵
reports/s on the flights pipeline (docs/benchmarks.md). This module runs the *same* algorithm —
the same steps, anchors, one-step sums and random-scaling sums, in the same order — as one
numba-compiled loop over the rows, for losses ``φ(η, y)`` with ``η = zᵀθ``:

* ``PHI_LOGISTIC``: ``φ_η = p − y``, ``φ_ηη = p(1 − p)``, ``p = ½(1 + tanh(η/2))``
  (``mechanisms.losses.LogisticLoss``, thresholded or linear label);
* ``PHI_QUANTILE``: ``φ_η = 1{y < η} − τ``, kink ``y − η`` for the smoothed Hessians
  (``mechanisms.losses.QuantileRegressionLoss``).

The corrected gradient of one report is ``a·φ_η(η₁, y₁) z₁ − b·φ_η(η₂, y₂) z₂`` with
``(a, b) = (1/δ, (1−δ)/δ)`` for DR and ``(1, 0)`` for naive/oracle (``mechanisms.corrected``);
Hessians combine the same way. Results agree with the Python loop to rounding (sums in another
order); ``tests/aggregator/test_sgd_kernel.py`` checks it.

Source: DESIGN §5 (online M-estimation), ``aggregator.state.sgd`` module docstring.
"""

from __future__ import annotations

import math

import numpy as np

from ingest._numba import jit

__all__ = ["HESS_ANALYTIC", "HESS_LADDER", "HESS_NONE", "LABEL_RAW", "LABEL_THRESHOLD", "PHI_LOGISTIC",
           "PHI_QUANTILE", "run_steps", "warm"]

PHI_LOGISTIC = 0
PHI_QUANTILE = 1
HESS_NONE = 0
HESS_ANALYTIC = 1
HESS_LADDER = 2
LABEL_RAW = 0
LABEL_THRESHOLD = 1

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@jit(nogil=True, error_model="numpy")
def _row(z, i, y, theta, code, tau, hmode):
    """(η, φ_η, φ_ηη) of row ``i`` at ``theta`` (φ_ηη only for the analytic Hessian)."""
    eta = 0.0
    for j in range(theta.shape[0]):
        eta += z[i, j] * theta[j]
    if code == PHI_LOGISTIC:
        p = 1.0 / (1.0 + math.exp(-eta))  # = (1 + tanh(η/2))/2, at the cost of one exp
        return eta, p - y[i], p * (1.0 - p)
    return eta, (1.0 if y[i] < eta else 0.0) - tau, 0.0


@jit(nogil=True, error_model="numpy")
def _add_hess(z, i, r, w_coef, hmode, bw, hb):
    """hb[k] += w_coef · w_k · z_i z_iᵀ for every Hessian rung k (``r``: φ_ηη for the analytic
    Hessian, the kink ``y − η`` for the ladder)."""
    q = z.shape[1]
    for k in range(hb.shape[0]):
        if hmode == HESS_ANALYTIC:
            w = r
        else:
            u = r / bw[k]
            w = math.exp(-0.5 * u * u) * _INV_SQRT_2PI / bw[k]
        w *= w_coef
        for a in range(q):
            za = w * z[i, a]
            for b in range(q):
                hb[k, a, b] += za * z[i, b]


@jit(nogil=True, error_model="numpy")
def _fill(ub, x, cols, shift, scale, intercept, label_mode, t_label, start, stop, zb, yb):
    """Design rows ``zb`` and labels ``yb`` of stream rows ``[start, stop)``: rows ``< len(ub)``
    come from the standardized buffer ``ub``, the others from ``x`` standardized on the fly as
    ``u = (x[:, cols] − shift)/scale`` (the same arithmetic as ``SGDState._std``)."""
    m = ub.shape[0]
    k = cols.shape[0] - 1
    off = 1 if intercept else 0
    for r in range(start, stop):
        i = r - start
        if intercept:
            zb[i, 0] = 1.0
        for j in range(k + 1):
            if r < m:
                u = ub[r, j]
            else:
                u = (x[r - m, cols[j]] - shift[j]) / scale[j]
            if j < k:
                zb[i, off + j] = u
            elif label_mode == LABEL_THRESHOLD:
                yb[i] = 1.0 if u > t_label else 0.0
            else:
                yb[i] = u


@jit(nogil=True, error_model="numpy")
def run_steps(ub1, x1, ub2, x2, cols, shift, scale, intercept, label_mode, t_label, a, b, code, tau,
              batch, full, theta, avg, sc, step0, step_power, burn, rs_a, rs_b, acc, hmode, bw,
              os_g, os_s, os_h, os_ht, os_t1, os_t2):  # pragma: no cover
    """Run the mini-batch steps over stream rows ``[0, full)`` (``full`` a multiple of ``batch``).

    The stream is the buffered rows ``ub`` followed by the new reports ``x``.

    Parameters
    ----------
    ub1, ub2 : float64 (m, k + 1)
        Standardized rows buffered from earlier updates (``ub2`` unused when ``b == 0``).
    x1, x2 : float64 (n, d)
        New reports ``x̃₁`` / ``x̃₂`` in original units (``x2`` unused when ``b == 0``).
    cols : int64 (k + 1,)
        Covariate columns then the label/response column of ``x``; ``shift``, ``scale`` (k + 1,)
        standardize them.
    intercept : bool
        Prepend a constant to the design (q = k + 1, else q = k).
    label_mode, t_label :
        ``LABEL_THRESHOLD``: ``y = 1{u_label > t_label}``; ``LABEL_RAW``: ``y = u_label``.
    a, b : float
        Corrected-gradient coefficients (see the module docstring).
    code : int
        ``PHI_LOGISTIC`` or ``PHI_QUANTILE``; ``tau`` the quantile level.
    batch, full : int
        Mini-batch size; rows to consume.
    theta, avg : float64 (q,)
        Iterate and Polyak average, updated in place.
    sc : float64 (5,)
        ``[t, s, rs_c, os_m, os_nb]`` (step count, averaged steps, Σ r², one-step report count,
        one-step batch count), updated in place.
    step0, step_power, burn :
        ``γ_t = step0·t^(−step_power)``; averaging starts after ``burn`` steps.
    rs_a (q, q), rs_b (q,) :
        Random-scaling sums ``Σ r² θ̄_r θ̄_rᵀ``, ``Σ r² θ̄_r``, updated in place.
    acc : bool
        Accumulate the one-step sums (after burn-in) at the anchor.
    hmode : int
        ``HESS_ANALYTIC`` (K = 1) or ``HESS_LADDER`` (Gaussian kernel of bandwidths ``bw``).
    os_g (q,), os_s (q, q), os_h (K, q, q), os_ht (K, q), os_t1 (K,), os_t2 (K,) :
        One-step sums, updated in place.
    """
    q = theta.shape[0]
    K = os_h.shape[0]
    two = b != 0.0
    gsum = np.empty(q)
    gi = np.empty(q)
    anc = np.empty(q)
    hb = np.empty((K, q, q))
    z1 = np.empty((batch, q))
    z2 = np.empty((batch, q))
    y1 = np.empty(batch)
    y2 = np.empty(batch)
    for start in range(0, full, batch):
        _fill(ub1, x1, cols, shift, scale, intercept, label_mode, t_label, start, start + batch, z1, y1)
        if two:
            _fill(ub2, x2, cols, shift, scale, intercept, label_mode, t_label, start, start + batch, z2, y2)
        gsum[:] = 0.0
        for i in range(batch):
            pe = a * _row(z1, i, y1, theta, code, tau, hmode)[1]
            for j in range(q):
                gsum[j] += pe * z1[i, j]
            if two:
                pe2 = b * _row(z2, i, y2, theta, code, tau, hmode)[1]
                for j in range(q):
                    gsum[j] -= pe2 * z2[i, j]
        t = sc[0]
        if acc and t >= burn:
            # anchor: the running Polyak average once there is one, else the iterate
            if sc[1] >= 1:
                anc[:] = avg
            else:
                anc[:] = theta
            hb[:] = 0.0
            for i in range(batch):
                e1, pe, h1 = _row(z1, i, y1, anc, code, tau, hmode)
                for j in range(q):
                    gi[j] = a * pe * z1[i, j]
                _add_hess(z1, i, h1 if hmode == HESS_ANALYTIC else y1[i] - e1, a, hmode, bw, hb)
                if two:
                    e2, pe2, h2 = _row(z2, i, y2, anc, code, tau, hmode)
                    for j in range(q):
                        gi[j] -= b * pe2 * z2[i, j]
                    _add_hess(z2, i, h2 if hmode == HESS_ANALYTIC else y2[i] - e2, -b, hmode, bw, hb)
                for j in range(q):
                    os_g[j] += gi[j]
                    for m in range(q):
                        os_s[j, m] += gi[j] * gi[m]
            for k in range(K):
                tr = 0.0
                for j in range(q):
                    tr += hb[k, j, j]
                    acc_ht = 0.0
                    for m in range(q):
                        os_h[k, j, m] += hb[k, j, m]
                        acc_ht += hb[k, j, m] * anc[m]
                    os_ht[k, j] += acc_ht
                os_t1[k] += tr
                os_t2[k] += tr * tr
            sc[3] += batch
            sc[4] += 1.0
        t += 1.0
        sc[0] = t
        gamma = step0 * t ** (-step_power) / batch
        for j in range(q):
            theta[j] -= gamma * gsum[j]
        if t > burn:
            sc[1] += 1.0
            s = sc[1]
            for j in range(q):
                avg[j] += (theta[j] - avg[j]) / s
            s2 = s * s
            for j in range(q):
                rs_b[j] += s2 * avg[j]
                for m in range(q):
                    rs_a[j, m] += s2 * avg[j] * avg[m]
            sc[2] += s2

_warm = False


def warm() -> None:
    """Compile (or load from numba's on-disk cache) :func:`run_steps` now — ~0.5 s once per
    process — so that the first record a worker processes does not pay for it."""
    global _warm
    if _warm:
        return
    u, x, v, c = np.zeros((0, 2)), np.zeros((0, 3)), np.zeros(2), np.zeros(2)
    run_steps(u, x, u, x, np.arange(2, dtype=np.int64), c, c + 1.0, True, LABEL_RAW, 0.0, 1.0, 1.0,
              PHI_LOGISTIC, 0.0, 1, 0, v.copy(), v.copy(), np.zeros(5), 1.0, 0.5, 0.0, np.zeros((2, 2)),
              v.copy(), True, HESS_ANALYTIC, np.ones(1), v.copy(), np.zeros((2, 2)), np.zeros((1, 2, 2)),
              np.zeros((1, 2)), np.zeros(1), np.zeros(1))
    _warm = True
