"""Compiled renewal loop of :class:`aggregator.state.renewable.RenewableState` for the built-in
logistic and quantile regressions with the DR (or naive) corrected gradient.

It runs the same algorithm as :meth:`mechanisms.renewable.Renewable.renew` — per block of ``m``
reports: Newton steps on the block's corrected loss plus ``½(θ − θ̂)ᵀH(θ − θ̂)`` (logistic: until
the Newton decrement is at most ``tol``; quantile: one step), then ``H += Ĥ_b(θ̂)`` and
``A += Σ g_i g_iᵀ`` — with the same guards, over every complete block of one update in a single
call. The corrected gradient of a report is ``a·φ_η(η₁, y₁) z₁ − b·φ_η(η₂, y₂) z₂`` with
``(a, b) = (1/δ, (1−δ)/δ)`` for DR and ``(1, 0)`` for naive; its Hessian combines the same way
(``φ_ηη`` for logistic, the Gaussian kernel of the kink at :func:`mechanisms.renewable.kink_bandwidth`
for quantile). Linear systems are solved by a Cholesky factorization, which also tests positive
definiteness. Results agree with the Python path to rounding
(``tests/aggregator/test_renewable_kernel.py``).

Source: docs/mechanisms.md §6.5–§6.7.
"""

from __future__ import annotations

import math

import numpy as np

from aggregator.state._index_kernel import (
    HESS_ANALYTIC,
    HESS_SMOOTHED,
    LABEL_RAW,
    PHI_LOGISTIC,
    add_hessian,
    dot,
    fill,
    phi,
)
from ingest.jit import jit

__all__ = ["renew_blocks", "warm"]


@jit(nogil=True, error_model="numpy")
def chol_solve(M, rhs, L, out):  # pragma: no cover - compiled
    """Solve ``M out = rhs`` for symmetric ``M`` (q, q) by Cholesky into ``out``; ``L`` (q, q) is
    scratch. Returns False (``out`` undefined) when ``M`` is not positive definite."""
    q = M.shape[0]
    for j in range(q):
        s = M[j, j]
        for k in range(j):
            s -= L[j, k] * L[j, k]
        if not s > 0.0:  # also NaN
            return False
        L[j, j] = math.sqrt(s)
        for i in range(j + 1, q):
            t = M[i, j]
            for k in range(j):
                t -= L[i, k] * L[j, k]
            L[i, j] = t / L[j, j]
    for i in range(q):
        t = rhs[i]
        for k in range(i):
            t -= L[i, k] * out[k]
        out[i] = t / L[i, i]
    for i in range(q - 1, -1, -1):
        t = out[i]
        for k in range(i + 1, q):
            t -= L[k, i] * out[k]
        out[i] = t / L[i, i]
    return True


@jit(nogil=True, error_model="numpy")
def guarded_step(H, Hb, G, M, L, step, sc):  # pragma: no cover - compiled
    """The renewal's Newton step ``(H + Ĥ_b)⁻¹ G`` into ``step``, or ``H⁻¹ G`` where ``H + Ĥ_b``
    is not positive definite (``sc[1]`` counts it; ``M`` holds the matrix used). Returns whether
    the step is finite (docs/mechanisms.md §6.6)."""
    q = H.shape[0]
    for j in range(q):
        for k in range(q):
            M[j, k] = H[j, k] + Hb[j, k]
    if not chol_solve(M, G, L, step):
        sc[1] += 1.0
        M[:, :] = H
        chol_solve(M, G, L, step)  # H is positive definite (the fit's invariant)
    for j in range(q):
        if not math.isfinite(step[j]):
            return False
    return True


@jit(nogil=True, error_model="numpy")
def add_if_positive_definite(H, Hb, G, M, L, step, sc):  # pragma: no cover - compiled
    """``H += Ĥ_b`` when the sum stays positive definite, else count the block in ``sc[1]``
    (the test is a Cholesky solve for the right-hand side ``G``, read only; ``M``, ``L``,
    ``step`` are scratch)."""
    q = H.shape[0]
    for j in range(q):
        for k in range(q):
            M[j, k] = H[j, k] + Hb[j, k]
    if chol_solve(M, G, L, step):  # the test of positive definiteness; the solution is unused
        H[:, :] = M
    else:
        sc[1] += 1.0


@jit(nogil=True, error_model="numpy")
def _block_terms(z1, y1, z2, y2, th, a, b, two, code, tau, hmode, bw, e1, g1, h1, e2, g2, h2, w, xt,
                 bits, gt, G, Hb):  # pragma: no cover - compiled
    """At ``th``: per-row corrected gradients ``gt`` (q, m), their sum ``G`` and the block's
    corrected Hessian ``Hb`` (full, symmetric)."""
    q = th.shape[0]
    m = y1.shape[0]
    phi(z1, y1, th, a, code, tau, e1, g1, h1, xt, bits)
    if two:
        phi(z2, y2, th, b, code, tau, e2, g2, h2, xt, bits)
    Hb[:] = 0.0
    add_hessian(z1, y1, e1, h1, w, hmode, bw, a, Hb, xt, bits)
    if two:
        add_hessian(z2, y2, e2, h2, w, hmode, bw, -b, Hb, xt, bits)
    for r in range(q):
        for c in range(r + 1, q):
            Hb[c, r] = Hb[r, c]
    for j in range(q):
        acc = 0.0
        for i in range(m):
            gt[j, i] = g1[i] * z1[j, i]
        if two:
            for i in range(m):
                gt[j, i] -= g2[i] * z2[j, i]
        for i in range(m):
            acc += gt[j, i]
        G[j] = acc


@jit(nogil=True, error_model="numpy")
def renew_blocks(ub1, x1, ub2, x2, cols, shift, scale, intercept, label_mode, t_label, a, b, code, tau,
                 block, full, theta, H, A, sc, spread, bw_c, bw_power, max_steps, tol):  # pragma: no cover
    """Renew the fit with every block of stream rows ``[0, full)`` (``full`` a multiple of ``block``).

    The stream is the buffered rows ``ub`` followed by the new reports ``x``.

    Parameters
    ----------
    ub1, ub2 : float64 (r, k + 1)
        Standardized rows buffered from earlier updates (``ub2`` unused when ``b == 0``).
    x1, x2 : float64 (n, d)
        New reports ``X̃₁`` / ``X̃₂`` in original units (``x2`` unused when ``b == 0``).
    cols : int64 (k + 1,)
        Covariate columns then the label/response column of ``x``; ``shift``, ``scale`` (k + 1,)
        standardize them.
    intercept : bool
        Prepend a constant to the design (q = k + 1, else q = k).
    label_mode, t_label :
        ``LABEL_THRESHOLD``: ``y = 1{u_label > t_label}``; ``LABEL_RAW``: ``y = u_label``.
    a, b : float
        Corrected-gradient coefficients (module docstring).
    code : int
        ``PHI_LOGISTIC`` or ``PHI_QUANTILE``; ``tau`` the quantile level.
    block, full : int
        Reports per block; rows to consume.
    theta (q,), H (q, q), A (q, q) :
        The fit, updated in place.
    sc : float64 (2,)
        ``[n, guarded]``, updated in place.
    spread, bw_c, bw_power : float
        Quantile: bandwidth ``bw_c · spread · n^(−bw_power)`` after each block.
    max_steps : int
        Newton steps per block at most (quantile: 1).
    tol : float
        Logistic: stop once the Newton decrement ``sᵀMs`` is at most ``tol``.
    """
    q = theta.shape[0]
    two = b != 0.0
    smooth = code == PHI_LOGISTIC
    hmode = HESS_ANALYTIC if smooth else HESS_SMOOTHED
    z1 = np.empty((q, block))
    z2 = np.empty((q, block))
    y1 = np.empty(block)
    y2 = np.empty(block)
    e1 = np.empty(block)
    e2 = np.empty(block)
    g1 = np.empty(block)
    g2 = np.empty(block)
    h1 = np.empty(block)
    h2 = np.empty(block)
    w = np.empty(block)
    xt = np.empty(2 * block)
    bits = np.empty(block, np.int64)
    gt = np.empty((q, block))
    G = np.empty(q)
    Hb = np.empty((q, q))
    M = np.empty((q, q))
    L = np.empty((q, q))
    step = np.empty(q)
    th = np.empty(q)
    th0 = np.empty(q)
    for start in range(0, full, block):
        fill(ub1, x1, cols, shift, scale, intercept, label_mode, t_label, start, start + block, z1, y1)
        if two:
            fill(ub2, x2, cols, shift, scale, intercept, label_mode, t_label, start, start + block, z2, y2)
        n_new = sc[0] + block
        bw = bw_c * spread * n_new ** (-bw_power)
        th0[:] = theta
        th[:] = theta
        steps = 0
        finite = True
        while True:
            _block_terms(z1, y1, z2, y2, th, a, b, two, code, tau, hmode, bw, e1, g1, h1, e2, g2, h2, w,
                         xt, bits, gt, G, Hb)
            if steps == max_steps:
                break
            for j in range(q):
                acc = G[j]
                for k in range(q):
                    acc += H[j, k] * (th[k] - th0[k])
                G[j] = acc
            finite = guarded_step(H, Hb, G, M, L, step, sc)
            if not finite:
                break
            if smooth:
                dec = 0.0
                for j in range(q):
                    for k in range(q):
                        dec += step[j] * M[j, k] * step[k]
                if dec <= tol:
                    break
            for j in range(q):
                th[j] -= step[j]
            steps += 1
        if not finite:  # a block the fit cannot take: skipped, its reports counted
            sc[1] += 1.0
            sc[0] = n_new
            continue
        add_if_positive_definite(H, Hb, G, M, L, step, sc)
        for j in range(q):
            for k in range(j, q):
                s = dot(gt[j], gt[k])
                A[j, k] += s
                if k > j:
                    A[k, j] += s
        theta[:] = th
        sc[0] = n_new


_warm = False


def warm() -> None:
    """Compile (or load from numba's on-disk cache) :func:`renew_blocks` now — ~0.5 s once per
    process — so that the first record a worker processes does not pay for it."""
    global _warm
    if _warm:
        return
    u, x = np.zeros((0, 2)), np.zeros((0, 3))
    c = np.zeros(2)
    renew_blocks(u, x, u, x, np.arange(2, dtype=np.int64), c, c + 1.0, True, LABEL_RAW, 0.0, 1.0, 1.0,
                 PHI_LOGISTIC, 0.0, 1, 0, np.zeros(2), np.eye(2), np.zeros((2, 2)), np.zeros(2), 1.0, 0.6,
                 0.2, 8, 1e-6)
    _warm = True
