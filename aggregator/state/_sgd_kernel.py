"""Compiled mini-batch loop of :class:`aggregator.state.sgd.SGDState` for the built-in index losses.

The Python loop of ``SGDState._update`` pays ~100 µs of interpreter and NumPy call overhead per
mini-batch step (four gradient/Hessian calls on 64 rows), which would limit a worker to about 10⁵
reports/s on the flights pipeline (docs/benchmarks.md §3.3). This module runs the *same* algorithm —
the same steps, anchors, one-step sums and random-scaling sums, in the same order — as one
numba-compiled loop over the mini-batches, for losses ``φ(η, y)`` with ``η = zᵀθ``:

* ``PHI_LOGISTIC``: ``φ_η = p − y``, ``φ_ηη = p(1 − p)``, ``p = ½(1 + tanh(η/2))``
  (``mechanisms.losses.LogisticLoss``, thresholded or linear label);
* ``PHI_QUANTILE``: ``φ_η = 1{y < η} − τ``, kink ``y − η`` for the smoothed Hessians
  (``mechanisms.losses.QuantileRegressionLoss``).

The corrected gradient of one report is ``a·φ_η(η₁, y₁) z₁ − b·φ_η(η₂, y₂) z₂`` with
``(a, b) = (1/δ, (1−δ)/δ)`` for DR and ``(1, 0)`` for naive/oracle (``mechanisms.corrected``);
Hessians combine the same way. Each mini-batch is held column-wise (q × batch) and its sums over
rows are vectorized dot products; the symmetric sums (Hessians, ``Σ g gᵀ``) are accumulated on
their upper triangle. The anchor pass doubles the row work; the cost per report is measured by
``benchmarks.pipeline`` (section breakdown; docs/benchmarks.md §3.2). Results agree with the
Python loop to rounding (sums in another order); ``tests/aggregator/test_sgd_kernel.py`` checks it.

Source: docs/mechanisms.md §6.5–§6.7, ``aggregator.state.sgd`` module docstring.
"""

from __future__ import annotations

import math

import numpy as np

from aggregator.state._kernels import FAST_SUMS
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


#: Sums over a mini-batch's rows may be reassociated (see ``_kernels.FAST_SUMS``).
_SUMS = FAST_SUMS


@jit(nogil=True, error_model="numpy")
def _fill_col(ub, x, j, cj, sj, dj, start, mid, stop, out):
    """``out[r − start]`` for rows ``[start, stop)`` of column ``j`` (see :func:`_fill`)."""
    m = ub.shape[0]
    for r in range(start, mid):
        out[r - start] = ub[r, j]
    for r in range(mid, stop):
        out[r - start] = (x[r - m, cj] - sj) / dj


@jit(nogil=True, error_model="numpy")
def _fill(ub, x, cols, shift, scale, intercept, label_mode, t_label, start, stop, zt, yb):
    """Design columns ``zt`` (q, stop − start) and labels ``yb`` of stream rows ``[start, stop)``:
    rows ``< len(ub)`` come from the standardized buffer ``ub``, the others from ``x``
    standardized on the fly as ``u = (x[:, cols] − shift)/scale`` (the same arithmetic as
    ``SGDState._std``). Column by column, so that each row loop has no branch per column
    and is vectorized."""
    m = ub.shape[0]
    k = cols.shape[0] - 1
    off = 1 if intercept else 0
    mid = min(max(m, start), stop)  # rows [start, mid) buffered, [mid, stop) new
    if intercept:
        zt[0, :stop - start] = 1.0
    for j in range(k):
        _fill_col(ub, x, j, cols[j], shift[j], scale[j], start, mid, stop, zt[off + j])
    _fill_col(ub, x, k, cols[k], shift[k], scale[k], start, mid, stop, yb)
    if label_mode == LABEL_THRESHOLD:
        for i in range(stop - start):
            yb[i] = 1.0 if yb[i] > t_label else 0.0


# exp(x) = 2^k · exp(r), x = k·ln 2 + r, |r| ≤ ln(2)/2: ln 2 split in a high part with trailing
# zero bits (k·_LN2_HI is exact for |k| < 2¹¹) and the rest (the fdlibm constants); k is rounded
# by adding 1.5·2⁵² (its low mantissa bits are then k), and 2^k is built from those bits
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_SHIFTER = 6755399441055744.0  # 1.5·2⁵²
_SHIFTER_BITS = int(np.float64(_SHIFTER).view(np.int64))
# 1/j! for j = 12 … 0: the Taylor polynomial of exp on |r| ≤ 0.347 (remainder < 2·10⁻¹⁶ relative)
_INV_FACT = tuple(1.0 / math.factorial(j) for j in range(12, -1, -1))


@jit(nogil=True, error_model="numpy", fastmath={"contract"})
def _exp(x, out, t, bits):
    """``out[i] = exp(x[i])`` for ``x`` clamped to [−708, 709] (NaN gives a finite value), in
    three loops the compiler vectorizes with FMA. ``t`` (float64, ≥ n) and ``bits`` (int64, n)
    are scratch; ``out`` must not be ``x`` (the loops then run unvectorized). ``math.exp`` is a
    scalar libm call: the logistic regression's four per report were 20 of its 50 ns per
    report. Relative error ≤ 4·10⁻¹⁶ (``tests/aggregator/test_sgd_kernel.py`` compares it with
    ``np.exp``)."""
    c12, c11, c10, c9, c8, c7, c6, c5, c4, c3, c2, c1, c0 = _INV_FACT
    for i in range(x.shape[0]):
        v = min(max(x[i], -708.0), 709.0)
        kd = v * _LOG2E + _SHIFTER
        k = kd - _SHIFTER  # round(v·log2 e), exactly
        r = (v - k * _LN2_HI) - k * _LN2_LO
        p = c12
        p = p * r + c11
        p = p * r + c10
        p = p * r + c9
        p = p * r + c8
        p = p * r + c7
        p = p * r + c6
        p = p * r + c5
        p = p * r + c4
        p = p * r + c3
        p = p * r + c2
        p = p * r + c1
        out[i] = p * r + c0
        t[i] = kd
    kbits = t.view(np.int64)
    for i in range(x.shape[0]):
        bits[i] = (kbits[i] - _SHIFTER_BITS + 1023) << 52  # the float64 2^k, k ∈ [−1021, 1023]
    scale = bits.view(np.float64)
    for i in range(x.shape[0]):
        out[i] *= scale[i]


@jit(nogil=True, error_model="numpy")
def _phi(zt, y, v, coef, code, tau, eta, g, h, t, bits):
    """Per row ``i``: ``eta[i] = z_iᵀ v``, ``g[i] = coef·φ_η(η_i, y_i)`` and (logistic)
    ``h[i] = coef·φ_ηη(η_i)``; ``t`` (≥ n), ``bits`` (n) are scratch of :func:`_exp`."""
    n = y.shape[0]
    eta[:] = 0.0
    for j in range(v.shape[0]):
        vj = v[j]
        for i in range(n):
            eta[i] += zt[j, i] * vj
    if code == PHI_LOGISTIC:
        for i in range(n):
            g[i] = -eta[i]
        _exp(g, h, t, bits)  # distinct arrays: with out = x the loops were not vectorized
        for i in range(n):
            p = 1.0 / (1.0 + h[i])  # = (1 + tanh(η/2))/2, at the cost of one exp
            g[i] = coef * (p - y[i])
            h[i] = coef * (p * (1.0 - p))
    else:
        for i in range(n):
            g[i] = coef * ((1.0 if y[i] < eta[i] else 0.0) - tau)
            h[i] = 0.0  # kinked: no analytic φ_ηη (the ladder smooths the kink instead)


@jit(nogil=True, error_model="numpy", fastmath=_SUMS)
def _dot(u, v):
    """``Σ_i u[i] v[i]``."""
    acc = 0.0
    for i in range(u.shape[0]):
        acc += u[i] * v[i]
    return acc


@jit(nogil=True, error_model="numpy", fastmath=_SUMS)
def _wdot(w, u, v):
    """``Σ_i w[i] u[i] v[i]``."""
    acc = 0.0
    for i in range(u.shape[0]):
        acc += w[i] * u[i] * v[i]
    return acc


@jit(nogil=True, error_model="numpy")
def _add_hess(zt, y, eta, h, w, hmode, bw, sign, hb, t, bits):
    """``hb[k] += sign · Σ_i w_k,i z_i z_iᵀ`` for every Hessian rung k: ``w = h`` (analytic,
    coefficient included), or the Gaussian kernel of the kink ``y − η`` at bandwidth ``bw[k]``
    times ``|sign|`` (ladder); ``w``, ``t`` (2n) and ``bits`` (n) are scratch."""
    q = zt.shape[0]
    for k in range(hb.shape[0]):
        if hmode == HESS_ANALYTIC:
            w[:] = h
        else:
            c = abs(sign) * _INV_SQRT_2PI / bw[k]
            arg = t[y.shape[0]:]
            for i in range(y.shape[0]):
                u = (y[i] - eta[i]) / bw[k]
                arg[i] = -0.5 * u * u
            _exp(arg, w, t[:y.shape[0]], bits)
            for i in range(y.shape[0]):
                w[i] *= c
        sg = 1.0 if sign > 0 else -1.0
        for r in range(q):
            for c2 in range(r, q):
                hb[k, r, c2] += sg * _wdot(w, zt[r], zt[c2])


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
    anc = np.empty(q)
    hb = np.empty((K, q, q))  # one mini-batch's Hessian sums (upper triangle)
    ss = np.zeros((q, q))  # Σ g_i g_iᵀ of this call (upper triangle)
    hs = np.zeros((K, q, q))  # Σ of the mini-batch Hessians of this call (upper triangle)
    z1 = np.empty((q, batch))  # design columns of one mini-batch
    z2 = np.empty((q, batch))
    y1 = np.empty(batch)
    y2 = np.empty(batch)
    e1 = np.empty(batch)  # per row: η, coef·φ_η, coef·φ_ηη, kernel weights
    e2 = np.empty(batch)
    g1 = np.empty(batch)
    g2 = np.empty(batch)
    h1 = np.empty(batch)
    h2 = np.empty(batch)
    w = np.empty(batch)
    xt = np.empty(2 * batch)  # scratch of _exp (and of its argument in _add_hess)
    bits = np.empty(batch, np.int64)
    gt = np.empty((q, batch))  # per-row corrected gradients at the anchor
    for start in range(0, full, batch):
        _fill(ub1, x1, cols, shift, scale, intercept, label_mode, t_label, start, start + batch, z1, y1)
        if two:
            _fill(ub2, x2, cols, shift, scale, intercept, label_mode, t_label, start, start + batch, z2, y2)
        # corrected gradient at the iterate: Σ_i a·φ_η(x₁ᵢ) z₁ᵢ − b·φ_η(x₂ᵢ) z₂ᵢ
        _phi(z1, y1, theta, a, code, tau, e1, g1, h1, xt, bits)
        if two:
            _phi(z2, y2, theta, b, code, tau, e2, g2, h2, xt, bits)
        for j in range(q):
            gsum[j] = _dot(g1, z1[j])
            if two:
                gsum[j] -= _dot(g2, z2[j])
        t = sc[0]
        if acc and t >= burn:
            # anchor: the running Polyak average once there is one, else the iterate
            if sc[1] >= 1:
                anc[:] = avg
                _phi(z1, y1, anc, a, code, tau, e1, g1, h1, xt, bits)
                if two:
                    _phi(z2, y2, anc, b, code, tau, e2, g2, h2, xt, bits)
            else:
                anc[:] = theta  # the values at the iterate are those of the anchor
            hb[:] = 0.0
            _add_hess(z1, y1, e1, h1, w, hmode, bw, a, hb, xt, bits)
            if two:
                _add_hess(z2, y2, e2, h2, w, hmode, bw, -b, hb, xt, bits)
            for j in range(q):
                for i in range(batch):
                    gt[j, i] = g1[i] * z1[j, i]
                if two:
                    for i in range(batch):
                        gt[j, i] -= g2[i] * z2[j, i]
            for j in range(q):
                acc_g = 0.0
                for i in range(batch):
                    acc_g += gt[j, i]
                os_g[j] += acc_g
                for m in range(j, q):
                    ss[j, m] += _dot(gt[j], gt[m])
            for k in range(K):
                tr = 0.0
                for j in range(q):
                    tr += hb[k, j, j]
                    acc_ht = 0.0
                    for m in range(q):
                        hjm = hb[k, j, m] if m >= j else hb[k, m, j]
                        acc_ht += hjm * anc[m]
                        if m >= j:
                            hs[k, j, m] += hjm
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
    # the symmetric one-step sums, from their upper triangles
    for j in range(q):
        for m in range(j, q):
            os_s[j, m] += ss[j, m]
            if m > j:
                os_s[m, j] += ss[j, m]
            for k in range(K):
                os_h[k, j, m] += hs[k, j, m]
                if m > j:
                    os_h[k, m, j] += hs[k, j, m]

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
