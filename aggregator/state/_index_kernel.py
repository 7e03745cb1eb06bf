"""Compiled per-row pieces of the built-in single-index losses ``φ(η, y)``, ``η = zᵀθ``, shared by
the renewable kernel (:mod:`aggregator.state._renewable_kernel`).

* ``PHI_LOGISTIC``: ``φ_η = p − y``, ``φ_ηη = p(1 − p)``, ``p = 1/(1 + e^(−η))``
  (``mechanisms.losses.LogisticLoss``, thresholded or linear label);
* ``PHI_QUANTILE``: ``φ_η = 1{y < η} − τ``, kink ``y − η`` for the smoothed Hessian
  (``mechanisms.losses.QuantileRegressionLoss``).

A block of reports is held column-wise (q × m: :func:`fill`) so that its sums over rows are
vectorized dot products; the symmetric sums (Hessians) are accumulated on their upper triangle.
``exp`` is a vectorized Cody–Waite reduction with a degree-12 polynomial (:func:`vexp`).
Source: docs/mechanisms.md §6.5–§6.7.
"""

from __future__ import annotations

import math

import numpy as np

from aggregator.state._kernels import FAST_SUMS
from ingest.jit import jit

__all__ = ["HESS_ANALYTIC", "HESS_SMOOTHED", "LABEL_RAW", "LABEL_THRESHOLD", "PHI_LOGISTIC", "PHI_QUANTILE",
           "add_hessian", "dot", "fill", "phi", "vexp"]

PHI_LOGISTIC = 0
PHI_QUANTILE = 1
HESS_ANALYTIC = 1
HESS_SMOOTHED = 2
LABEL_RAW = 0
LABEL_THRESHOLD = 1

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


#: Sums over a block's rows may be reassociated (see ``_kernels.FAST_SUMS``).
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
def fill(ub, x, cols, shift, scale, intercept, label_mode, t_label, start, stop, zt, yb):
    """Design columns ``zt`` (q, stop − start) and labels ``yb`` of stream rows ``[start, stop)``:
    rows ``< len(ub)`` come from the standardized buffer ``ub``, the others from ``x``
    standardized on the fly as ``u = (x[:, cols] − shift)/scale`` (the same arithmetic as
    ``RenewableState._std``). Column by column, so that each row loop has no branch per column
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
def vexp(x, out, t, bits):
    """``out[i] = exp(x[i])`` for ``x`` clamped to [−708, 709] (NaN gives a finite value), in
    three loops the compiler vectorizes with FMA. ``t`` (float64, ≥ n) and ``bits`` (int64, n)
    are scratch; ``out`` must not be ``x`` (the loops then run unvectorized). ``math.exp`` is a
    scalar libm call: the logistic regression's four per report were 20 of its 50 ns per
    report. Relative error ≤ 4·10⁻¹⁶ (``tests/aggregator/test_renewable_kernel.py`` compares it with
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
def phi(zt, y, v, coef, code, tau, eta, g, h, t, bits):
    """Per row ``i``: ``eta[i] = z_iᵀ v``, ``g[i] = coef·φ_η(η_i, y_i)`` and (logistic)
    ``h[i] = coef·φ_ηη(η_i)``; ``t`` (≥ n), ``bits`` (n) are scratch of :func:`vexp`."""
    n = y.shape[0]
    eta[:] = 0.0
    for j in range(v.shape[0]):
        vj = v[j]
        for i in range(n):
            eta[i] += zt[j, i] * vj
    if code == PHI_LOGISTIC:
        for i in range(n):
            g[i] = -eta[i]
        vexp(g, h, t, bits)  # distinct arrays: with out = x the loops were not vectorized
        for i in range(n):
            p = 1.0 / (1.0 + h[i])  # = (1 + tanh(η/2))/2, at the cost of one exp
            g[i] = coef * (p - y[i])
            h[i] = coef * (p * (1.0 - p))
    else:
        for i in range(n):
            g[i] = coef * ((1.0 if y[i] < eta[i] else 0.0) - tau)
            h[i] = 0.0  # kinked: no analytic φ_ηη (a smoothed Hessian replaces it)


@jit(nogil=True, error_model="numpy", fastmath=_SUMS)
def dot(u, v):
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
def add_hessian(zt, y, eta, h, w, hmode, bw, sign, hb, t, bits):
    """``hb += sign · Σ_i w_i z_i z_iᵀ`` on the upper triangle of ``hb`` (q, q): ``w = h``
    (analytic, coefficient included, ``sign`` ±1), or the Gaussian kernel of the kink ``y − η`` at
    bandwidth ``bw`` times ``|sign|`` (smoothed); ``w``, ``t`` (2n) and ``bits`` (n) are scratch."""
    q = zt.shape[0]
    n = y.shape[0]
    if hmode == HESS_ANALYTIC:
        w[:n] = h[:n]
    else:
        c = abs(sign) * _INV_SQRT_2PI / bw
        arg = t[n:2 * n]
        for i in range(n):
            u = (y[i] - eta[i]) / bw
            arg[i] = -0.5 * u * u
        vexp(arg, w, t[:n], bits)
        for i in range(n):
            w[i] *= c
    sg = 1.0 if sign > 0 else -1.0
    for r in range(q):
        for c2 in range(r, q):
            hb[r, c2] += sg * _wdot(w, zt[r], zt[c2])
