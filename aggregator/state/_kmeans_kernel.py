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

from aggregator.state._renewable_kernel import add_if_positive_definite, guarded_step
from ingest.jit import jit

__all__ = ["renew_kmeans_blocks", "warm"]

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_CUT_Z2 = 2.0 * math.log(1e12)


@jit(nogil=True, error_model="numpy")
def _fill(ub, x, cols, shift, scale, start, stop, ut):  # pragma: no cover - compiled
    """Rows ``[start, stop)`` of the stream (buffered standardized rows ``ub``, then ``x``
    standardized) into the columns ``ut`` (p, m)."""
    r = ub.shape[0]
    p = ut.shape[0]
    for s in range(start, stop):
        i = s - start
        if s < r:
            for j in range(p):
                ut[j, i] = ub[s, j]
        else:
            for j in range(p):
                ut[j, i] = (x[s - r, cols[j]] - shift[j]) / scale[j]


@jit(nogil=True, error_model="numpy")
def _nearest_two(ut, C, cc, xx, dot, d0, d1, near, second):  # pragma: no cover - compiled
    """Per row (column of ``ut``): nearest and second-nearest centre and their squared distances
    ``d0 ≤ d1`` (``‖x‖² − 2x·c + ‖c‖²``, clipped at 0, as ``mechanisms.mixtures.kmeans``; the
    first centre wins a tie). Loops run over the rows, one centre at a time, without branches."""
    p, m = ut.shape
    for i in range(m):
        d0[i] = np.inf
        d1[i] = np.inf
        near[i] = 0
        second[i] = 0
    for c in range(C.shape[0]):
        for i in range(m):
            dot[i] = 0.0
        for j in range(p):
            cj = C[c, j]
            for i in range(m):
                dot[i] += ut[j, i] * cj
        ccc = cc[c]
        for i in range(m):
            v = xx[i] - 2.0 * dot[i] + ccc
            v = v if v > 0.0 else 0.0
            a0 = d0[i]
            lt0 = v < a0
            lt1 = v < d1[i]
            d1[i] = a0 if lt0 else (v if lt1 else d1[i])
            second[i] = near[i] if lt0 else (c if lt1 else second[i])
            d0[i] = v if lt0 else a0
            near[i] = c if lt0 else near[i]


@jit(nogil=True, error_model="numpy")
def _add_rows(ut, C, cc, wt, h, xx, dot, d0, d1, near, second, gv, G, Hb, W, idx):  # pragma: no cover
    """One record set with weight ``wt`` at the centres ``C``: its weighted gradient rows into
    ``gv`` (p, m) and their sum into ``G``, its smoothed Hessians into ``Hb`` (q, q); ``W``
    (m, q) and ``idx`` (m,) are scratch.

    The kernel terms of a row are ``−f V Vᵀ`` with ``V = e_a ⊗ u_a − e_b ⊗ u_b`` and ``f = 4·wt·K``:
    the rows near a cell boundary are written as ``√|f| V`` into the rows of ``W`` and summed by
    one matrix product (four scattered p × p updates per row ran ≈ 5× slower)."""
    p, m = ut.shape
    k = C.shape[0]
    for i in range(m):
        xx[i] = 0.0
    for j in range(p):
        for i in range(m):
            xx[i] += ut[j, i] * ut[j, i]
    _nearest_two(ut, C, cc, xx, dot, d0, d1, near, second)
    for j in range(p):
        for i in range(m):
            gv[j, i] = wt * 2.0 * (C[near[i], j] - ut[j, i])
    for c in range(k):
        cnt = 0.0
        for i in range(m):
            cnt += 1.0 if near[i] == c else 0.0
        for j in range(p):
            acc = 0.0
            for i in range(m):
                acc += gv[j, i] if near[i] == c else 0.0
            G[c * p + j] += acc
            Hb[c * p + j, c * p + j] += wt * 2.0 * cnt
    if k == 1 or m == 0:
        return
    # the kernel K = φ(S/h)/h of the gap S = d1 − d0; rows with K ≤ 1e-12 of the largest are
    # left out (as the Python path)
    zmin = np.inf
    for i in range(m):
        g = d1[i] - d0[i]
        dot[i] = g
        zmin = g if g < zmin else zmin
    # the kept rows' indices into ``idx``, without a branch per row: S² < S_min² + h²·2·ln(1e12)
    g2max = zmin * zmin + h * h * _CUT_Z2
    kept = 0
    for i in range(m):
        idx[kept] = i
        kept += 1 if dot[i] * dot[i] < g2max else 0
    q = k * p
    scale = math.sqrt(4.0 * abs(wt) * _INV_SQRT_2PI / h)
    c2 = -0.25 / (h * h)
    for t in range(kept):
        i = idx[t]
        g = dot[i]
        s = scale * math.exp(c2 * g * g)
        a = near[i]
        b = second[i]
        for j in range(q):
            W[t, j] = 0.0
        for r in range(p):
            W[t, a * p + r] = s * (C[a, r] - ut[r, i])
            W[t, b * p + r] = -s * (C[b, r] - ut[r, i])
    if kept > 0:
        Wk = W[:kept]
        P = np.dot(Wk.T, Wk)
        if wt > 0.0:
            Hb -= P
        else:
            Hb += P


@jit(nogil=True, error_model="numpy")
def _block_terms(u1, u2, th, C, cc, w1, w2, two, h, xx, dot, d0, d1, n1, n2, s2, g1, g2, G,
                 Hb, W, idx):  # pragma: no cover - compiled
    """At ``th``: the weighted gradient rows ``g1``/``g2`` (p, m) of both record sets with their
    nearest centres ``n1``/``n2``, the corrected gradient sum ``G`` and the block's corrected
    smoothed Hessian ``Hb`` (symmetric)."""
    q = th.shape[0]
    k, p = C.shape
    for c in range(k):
        sq = 0.0
        for j in range(p):
            C[c, j] = th[c * p + j]
            sq += C[c, j] * C[c, j]
        cc[c] = sq
    Hb[:, :] = 0.0
    G[:] = 0.0
    _add_rows(u1, C, cc, w1, h, xx, dot, d0, d1, n1, s2, g1, G, Hb, W, idx)
    if two:
        _add_rows(u2, C, cc, w2, h, xx, dot, d0, d1, n2, s2, g2, G, Hb, W, idx)
    for r in range(q):
        for c in range(r + 1, q):
            v = 0.5 * (Hb[r, c] + Hb[c, r])
            Hb[r, c] = v
            Hb[c, r] = v


@jit(nogil=True, error_model="numpy")
def _add_gradient_outer(A, p, n1, g1, n2, g2, two, GT):  # pragma: no cover - compiled
    """``A += Σ_i g_i g_iᵀ`` with ``g_i`` = ``g1[:, i]`` in block ``n1[i]`` plus (``two``)
    ``g2[:, i]`` in block ``n2[i]``: the ``g_i`` are written as the columns of ``GT`` (q, m) and
    summed by one matrix product (scattered per-row updates of A ran ≈ 4× slower)."""
    m = n1.shape[0]
    GT[:, :] = 0.0
    for j in range(p):
        for i in range(m):
            GT[n1[i] * p + j, i] += g1[j, i]
    if two:
        for j in range(p):
            for i in range(m):
                GT[n2[i] * p + j, i] += g2[j, i]
    A += np.dot(GT, GT.T)


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
    u1 = np.empty((p, block))
    u2 = np.empty((p, block))
    g1 = np.empty((p, block))
    g2 = np.empty((p, block))
    n1 = np.empty(block, np.int64)
    n2 = np.empty(block, np.int64)
    s2 = np.empty(block, np.int64)
    xx = np.empty(block)
    dot = np.empty(block)
    d0 = np.empty(block)
    d1 = np.empty(block)
    C = np.empty((k, p))
    cc = np.empty(k)
    G = np.empty(q)
    Hb = np.empty((q, q))
    M = np.empty((q, q))
    L = np.empty((q, q))
    step = np.empty(q)
    th = np.empty(q)
    GT = np.empty((q, block))
    W = np.empty((block, q))
    idx = np.empty(block, np.int64)
    for start in range(0, full, block):
        _fill(ub1, x1, cols, shift, scale, start, start + block, u1)
        if two:
            _fill(ub2, x2, cols, shift, scale, start, start + block, u2)
        n_new = sc[0] + block
        h = bw_c * spread * max(n_new, 1.0) ** (-bw_power)
        th[:] = theta
        _block_terms(u1, u2, th, C, cc, w1, w2, two, h, xx, dot, d0, d1, n1, n2, s2, g1, g2, G, Hb, W, idx)
        if not guarded_step(H, Hb, G, M, L, step, sc):  # a block the fit cannot take: skipped
            sc[1] += 1.0  # (its reports counted)
            sc[0] = n_new
            continue
        for c in range(k):
            for j in range(p):
                v = th[c * p + j] - step[c * p + j]
                th[c * p + j] = min(max(v, box_lo[j]), box_hi[j])
        _block_terms(u1, u2, th, C, cc, w1, w2, two, h, xx, dot, d0, d1, n1, n2, s2, g1, g2, G, Hb, W, idx)
        add_if_positive_definite(H, Hb, G, M, L, step, sc)
        _add_gradient_outer(A, p, n1, g1, n2, g2, two, GT)
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
