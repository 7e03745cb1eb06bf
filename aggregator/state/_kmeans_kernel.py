"""Compiled renewal loop of :class:`aggregator.state.mixture.MixtureState` for DR (or naive)
k-means.

It runs the same algorithm as :meth:`mechanisms.renewable.Renewable.renew` with
:class:`mechanisms.mixtures.kmeans.KMeansLoss` — per block of ``m`` reports: one Newton step on
the block's corrected k-means risk plus ``½(θ − θ̂)ᵀH(θ − θ̂)`` with the kernel-smoothed Hessian,
the centres clipped into the box, then ``H += Ĥ_b(θ̂)`` and ``A += Σ g_i g_iᵀ`` — with the same
guards, over every complete block of one update in a single call.

Per record ``x`` with nearest centre ``a``, second-nearest ``b`` and gap ``S = ‖x − c_b‖² −
‖x − c_a‖²``: the gradient is ``2(c_a − x)`` in block ``a``; the smoothed Hessian is ``2I`` on
block (a, a) and, with ``K = φ(S/h)/h`` and ``u_j = c_j − x``, ``−4K u_a u_aᵀ`` on (a, a),
``−4K u_b u_bᵀ`` on (b, b), ``4K u_a u_bᵀ`` on (a, b) and its transpose on (b, a)
(docs/mechanisms.md §7.2). A corrected sum weighs ``x̃₁`` rows by ``w₁`` and ``x̃₂`` rows by
``w₂``: DR ``(1/δ, −(1−δ)/δ)``, naive ``(1, 0)``. Results agree with the Python path to rounding
(``tests/aggregator/test_kmeans_kernel.py``).

Source: docs/mechanisms.md §6.5–§6.7, §7.2.
"""

from __future__ import annotations

import math

import numpy as np

from aggregator.state._renewable_kernel import chol_solve
from ingest._numba import jit

__all__ = ["renew_kmeans_blocks", "warm"]

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@jit(nogil=True, error_model="numpy")
def _fill(ub, x, cols, shift, scale, start, stop, u):  # pragma: no cover - compiled
    """Rows ``[start, stop)`` of the stream (buffered standardized rows ``ub``, then ``x``
    standardized) into ``u`` (m, p)."""
    r = ub.shape[0]
    p = u.shape[1]
    for s in range(start, stop):
        i = s - start
        if s < r:
            for j in range(p):
                u[i, j] = ub[s, j]
        else:
            for j in range(p):
                u[i, j] = (x[s - r, cols[j]] - shift[j]) / scale[j]


@jit(nogil=True, error_model="numpy")
def _nearest_two(u, C, near, second, gap):  # pragma: no cover - compiled
    """Per row of ``u``: nearest and second-nearest centre and the gap of their squared distances
    (``‖x‖² − 2x·c + ‖c‖²``, clipped at 0, as ``mechanisms.mixtures.kmeans.sq_distances``)."""
    m, p = u.shape
    k = C.shape[0]
    for i in range(m):
        xx = 0.0
        for j in range(p):
            xx += u[i, j] * u[i, j]
        d0 = np.inf
        d1 = np.inf
        a = 0
        b = 0
        for c in range(k):
            xc = 0.0
            cc = 0.0
            for j in range(p):
                xc += u[i, j] * C[c, j]
                cc += C[c, j] * C[c, j]
            d = xx - 2.0 * xc + cc
            if d < 0.0:
                d = 0.0
            if d < d0:
                d1, b = d0, a
                d0, a = d, c
            elif d < d1:
                d1, b = d, c
        near[i] = a
        second[i] = b
        gap[i] = abs(d1 - d0) if k > 1 else np.inf


@jit(nogil=True, error_model="numpy")
def _add_rows(u, C, wt, h, near, second, gap, Hb, gt, sign):  # pragma: no cover - compiled
    """Add the rows of one record set with weight ``wt``: their smoothed Hessians into ``Hb``
    (q, q) and their gradients into ``gt`` (m, q) (``sign`` 0: overwrite, 1: add)."""
    m, p = u.shape
    k = C.shape[0]
    _nearest_two(u, C, near, second, gap)
    for i in range(m):
        a = near[i]
        if sign == 0:
            for j in range(k * p):
                gt[i, j] = 0.0
        for j in range(p):
            gt[i, a * p + j] += wt * 2.0 * (C[a, j] - u[i, j])
            Hb[a * p + j, a * p + j] += wt * 2.0
    if k == 1 or m == 0:
        return
    kmax = 0.0
    for i in range(m):
        z = gap[i] / h
        kv = math.exp(-0.5 * z * z) * _INV_SQRT_2PI / h
        gap[i] = kv
        if kv > kmax:
            kmax = kv
    if not kmax > 0.0:
        return
    cut = 1e-12 * kmax
    for i in range(m):
        kv = gap[i]
        if not kv > cut:
            continue
        a = near[i]
        b = second[i]
        f = 4.0 * kv * wt
        for r in range(p):
            ua_r = C[a, r] - u[i, r]
            ub_r = C[b, r] - u[i, r]
            for c in range(p):
                ua_c = C[a, c] - u[i, c]
                ub_c = C[b, c] - u[i, c]
                Hb[a * p + r, a * p + c] -= f * ua_r * ua_c
                Hb[b * p + r, b * p + c] -= f * ub_r * ub_c
                Hb[a * p + r, b * p + c] += f * ua_r * ub_c
                Hb[b * p + r, a * p + c] += f * ub_r * ua_c


@jit(nogil=True, error_model="numpy")
def _block_terms(u1, u2, th, k, w1, w2, two, h, near, second, gap, C, gt, G, Hb):  # pragma: no cover
    """At ``th``: per-row corrected gradients ``gt`` (m, q), their sum ``G`` and the block's
    corrected smoothed Hessian ``Hb`` (symmetric)."""
    q = th.shape[0]
    p = q // k
    m = u1.shape[0]
    for c in range(k):
        for j in range(p):
            C[c, j] = th[c * p + j]
    Hb[:, :] = 0.0
    _add_rows(u1, C, w1, h, near, second, gap, Hb, gt, 0)
    if two:
        _add_rows(u2, C, w2, h, near, second, gap, Hb, gt, 1)
    for r in range(q):
        for c in range(r + 1, q):
            s = 0.5 * (Hb[r, c] + Hb[c, r])
            Hb[r, c] = s
            Hb[c, r] = s
    for j in range(q):
        acc = 0.0
        for i in range(m):
            acc += gt[i, j]
        G[j] = acc


@jit(nogil=True, error_model="numpy")
def renew_kmeans_blocks(ub1, x1, ub2, x2, cols, shift, scale, k, w1, w2, box_lo, box_hi, block, full,
                        theta, H, A, sc, spread, bw_c, bw_power):  # pragma: no cover - compiled
    """Renew the k-means fit with every block of stream rows ``[0, full)`` (``full`` a multiple of
    ``block``); the stream is the buffered rows ``ub`` followed by the new reports ``x``.

    Parameters
    ----------
    ub1, ub2 : float64 (r, p)
        Standardized rows buffered from earlier updates (``ub2`` unused when ``w2 == 0``).
    x1, x2 : float64 (n, d)
        New reports ``X̃₁`` / ``X̃₂`` in original units (``x2`` unused when ``w2 == 0``).
    cols : int64 (p,)
        The fields' columns of ``x``; ``shift``, ``scale`` (p,) standardize them.
    k : int
        Centres; ``theta`` (q = k·p,) holds them row after row.
    w1, w2 : float
        Weights of ``x̃₁`` and ``x̃₂`` rows in the corrected sums (module docstring).
    box_lo, box_hi : float64 (p,)
        Bounds the centres are clipped into after a step.
    block, full : int
        Reports per block; rows to consume.
    theta (q,), H (q, q), A (q, q) :
        The fit, updated in place.
    sc : float64 (2,)
        ``[n, guarded]``, updated in place.
    spread, bw_c, bw_power : float
        Bandwidth ``bw_c · spread · n^(−bw_power)`` after each block.
    """
    q = theta.shape[0]
    p = q // k
    two = w2 != 0.0
    u1 = np.empty((block, p))
    u2 = np.empty((block, p))
    near = np.empty(block, np.int64)
    second = np.empty(block, np.int64)
    gap = np.empty(block)
    C = np.empty((k, p))
    gt = np.empty((block, q))
    G = np.empty(q)
    Hb = np.empty((q, q))
    M = np.empty((q, q))
    L = np.empty((q, q))
    step = np.empty(q)
    th = np.empty(q)
    for start in range(0, full, block):
        _fill(ub1, x1, cols, shift, scale, start, start + block, u1)
        if two:
            _fill(ub2, x2, cols, shift, scale, start, start + block, u2)
        n_new = sc[0] + block
        h = bw_c * spread * max(n_new, 1.0) ** (-bw_power)
        th[:] = theta
        _block_terms(u1, u2, th, k, w1, w2, two, h, near, second, gap, C, gt, G, Hb)
        for j in range(q):
            for c in range(q):
                M[j, c] = H[j, c] + Hb[j, c]
        if not chol_solve(M, G, L, step):
            sc[1] += 1.0
            M[:, :] = H
            chol_solve(M, G, L, step)  # H is positive definite (the fit's invariant)
        finite = True
        for j in range(q):
            if not math.isfinite(step[j]):
                finite = False
        if not finite:  # a block the fit cannot take: skipped, its reports counted
            sc[1] += 1.0
            sc[0] = n_new
            continue
        for c in range(k):
            for j in range(p):
                v = th[c * p + j] - step[c * p + j]
                th[c * p + j] = min(max(v, box_lo[j]), box_hi[j])
        _block_terms(u1, u2, th, k, w1, w2, two, h, near, second, gap, C, gt, G, Hb)
        for j in range(q):
            for c in range(q):
                M[j, c] = H[j, c] + Hb[j, c]
        if chol_solve(M, G, L, step):  # the test of positive definiteness; the solution is unused
            H[:, :] = M
        else:
            sc[1] += 1.0
        for i in range(block):
            for j in range(q):
                gj = gt[i, j]
                if gj == 0.0:
                    continue
                for c in range(q):
                    A[j, c] += gj * gt[i, c]
        theta[:] = th
        sc[0] = n_new


_warm = False


def warm() -> None:
    """Compile (or load from numba's on-disk cache) :func:`renew_kmeans_blocks` now, so that the
    first record a worker processes does not pay for it."""
    global _warm
    if _warm:
        return
    u, x = np.zeros((0, 2)), np.zeros((0, 2))
    c = np.zeros(2)
    renew_kmeans_blocks(u, x, u, x, np.arange(2, dtype=np.int64), c, c + 1.0, 2, 1.0, 0.0, c - 1.0, c + 1.0,
                        1, 0, np.zeros(4), np.eye(4), np.zeros((4, 4)), np.zeros(2), 1.0, 0.6, 0.2)
    _warm = True
