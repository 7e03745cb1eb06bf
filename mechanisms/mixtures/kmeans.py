"""DR k-means: the k-means risk as a loss, and its safeguarded DR-Lloyd fixed point with restarts.

Source: docs/mechanisms.md §7.1–§7.2. The k-means loss ``ℓ(x, C) = min_j ‖x − c_j‖²`` is
continuous in ``x``, so its DR corrected version ``[ℓ(x̃₁, C) − (1 − δ) ℓ(x̃₂, C)]/δ`` is unbiased
for the raw data's k-means risk (Lu, Chen & Qiu, arXiv 2501.15127, §4) and its minimiser is
consistent for the population k-means centres. It is *not* twice differentiable in ``x`` (SL/SDR
do not apply) and its θ-gradient jumps where a record changes cell, so the sandwich's V is a
kernel-smoothed Hessian (:meth:`KMeansLoss.smoothed_hessian`; Pollard 1982, "A central limit
theorem for k-means clustering", gives its population form).

Parameters ``θ`` are the centres ``C`` (k, p), stored row after row (``θ = C.ravel()``).
"""

from __future__ import annotations

import math

import numpy as np

from mechanisms._validate import check_finite_array
from mechanisms.errors import ParameterError
from mechanisms.losses.base import Loss, _robust_spread
from mechanisms.mixtures.components import match_components

__all__ = ["KMeansLoss", "corrected_weights", "split_dead_cells", "weighted_lloyd"]

#: Largest number of components of the mixture estimators.
MAX_COMPONENTS = 50
_SQRT_2PI = math.sqrt(2.0 * math.pi)


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= int(k) <= MAX_COMPONENTS:
        raise ParameterError(f"k must be an integer in [1, {MAX_COMPONENTS}], got {k!r}")
    return int(k)


def _check_p(p) -> int:
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or int(p) < 1:
        raise ParameterError(f"p must be an integer >= 1 (fields per record), got {p!r}")
    return int(p)


def sq_distances(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """``‖x_i − c_j‖²``: x (n, p), centres (k, p) → (n, k), clipped at 0."""
    d = (x * x).sum(axis=1)[:, None] - 2.0 * (x @ centres.T) + (centres * centres).sum(axis=1)[None]
    return np.maximum(d, 0.0)


def corrected_weights(closs) -> tuple[float, float]:
    """Per-record weights ``(w₁, w₂)`` of ``x̃₁`` and ``x̃₂`` in a corrected sum: DR
    ``(1/δ, −(1−δ)/δ)``; naive and oracle ``(1, 0)``.

    Raises
    ------
    ParameterError
        For SL/SDR (the k-means and mixture risks need DR).
    """
    if closs.method == "dr":
        d = closs.zero_prob
        return 1.0 / d, -(1.0 - d) / d
    if closs.method in ("naive", "oracle"):
        return 1.0, 0.0
    raise ParameterError(f"method {closs.method!r} does not apply to {closs.loss.name}; use 'dr'")


def stacked(closs, x1: np.ndarray, x2: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The records and their corrected weights as one weighted sample ``(z (m, p), w (m,))``."""
    w1, w2 = corrected_weights(closs)
    if w2 == 0.0:
        return x1, np.full(x1.shape[0], w1)
    return np.vstack([x1, x2]), np.concatenate([np.full(x1.shape[0], w1), np.full(x2.shape[0], w2)])


def _nearest(z: np.ndarray, zz: np.ndarray, C: np.ndarray,
             zt: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centre (the first on a tie) and squared distance per row, given ``zz = ‖z‖²`` per
    row; ``zt``, the rows as a contiguous (p, m) array, saves a transpose in loops."""
    if zt is None:
        zt = np.ascontiguousarray(z.T)
    cc = (C * C).sum(axis=1)
    # one centre at a time: an (m, k) argmin along its short rows is several times slower
    best = C[0] @ zt
    best *= -2.0
    best += cc[0]
    a = np.zeros(zt.shape[1], dtype=np.intp)
    g = np.empty_like(best)
    gi = g.view(np.intp)  # g's buffer again, for j·[g < best] once g is used
    lt = np.empty(zt.shape[1], dtype=bool)
    for j in range(1, C.shape[0]):
        np.dot(C[j], zt, out=g)
        g *= -2.0
        g += cc[j]
        # a = j where centre j is nearer: every earlier index is < j, so max(a, j·[g < best])
        # (a boolean-mask assignment is ~5x slower on rows whose order is random)
        np.less(g, best, out=lt)
        np.minimum(best, g, out=best)
        np.multiply(lt, j, out=gi)
        np.maximum(a, gi, out=a)
    best += zz
    return a, np.maximum(best, 0.0, out=best)


def weighted_lloyd(z: np.ndarray, w: np.ndarray, centres: np.ndarray, *, max_iter: int = 500,
                   tol: float = 1e-6, box=None) -> tuple[np.ndarray, bool, np.ndarray]:
    """Safeguarded Lloyd iterations on a weighted sample (weights may be negative: DR).

    Each step moves every centre whose cell has a positive total weight ``W_j`` to the weighted
    mean of its cell (the DR-Lloyd fixed point ``c_j = [Σ_{x̃₁∈V_j} x̃₁ − (1−δ)Σ_{x̃₂∈V_j} x̃₂] /
    [N₁ⱼ − (1−δ)N₂ⱼ]``, docs/mechanisms.md §7.2). With negative weights a Lloyd step need not
    descend, so the step is halved (up to 10 times) until the weighted risk ``Σ w_i min_j ‖z_i −
    c_j‖²`` does not increase; a step that cannot be made stops the iteration.

    Parameters
    ----------
    z : ndarray (m, p); w : ndarray (m,); centres : ndarray (k, p), the start
    max_iter : int
    tol : float
        Stop when no centre moves more than ``tol`` (units of z).
    box : (low (p,), high (p,)), optional
        Keep the centres in these bounds (the raw data's: its k-means centres are inside them).

    Returns
    -------
    (centres (k, p), converged, cell_weights (k,))
        ``cell_weights`` are the ``W_j`` at the result; a centre with ``W_j ≤ 0`` is not
        identified by the data (it did not move).
    """
    k, p = centres.shape
    C = np.array(centres, dtype=np.float64)
    zz = (z * z).sum(axis=1)
    zt = np.ascontiguousarray(z.T)
    a, d = _nearest(z, zz, C, zt)
    F = float(w @ d)
    for _ in range(max_iter):
        W = np.bincount(a, w, minlength=k)
        S = np.stack([np.bincount(a, w * z[:, j], minlength=k) for j in range(p)], axis=1)
        ok = W > 1e-12 * np.abs(w).sum()
        target = C.copy()
        target[ok] = S[ok] / W[ok, None]
        if box is not None:  # k-means centres of raw values lie in their bounds
            target = np.clip(target, box[0], box[1])
        step = target - C
        t, moved = 1.0, False
        for _halving in range(11):
            Ct = C + t * step
            at, dt = _nearest(z, zz, Ct, zt)
            Ft = float(w @ dt)
            if Ft <= F + 1e-12 * abs(F):
                moved = True
                break
            t *= 0.5
        if not moved:
            return C, True, np.bincount(a, w, minlength=k)
        shift = float(np.abs(Ct - C).max())
        C, a, F = Ct, at, Ft
        if shift <= tol:
            return C, True, np.bincount(a, w, minlength=k)
    return C, False, np.bincount(a, w, minlength=k)


def split_dead_cells(z: np.ndarray, w: np.ndarray, C: np.ndarray, dead: np.ndarray) -> np.ndarray | None:
    """A new start for a DR-Lloyd fit that left centres the data do not place.

    Heavy noise can leave a naive start's centre where the raw data have no mass: with a corrected
    cell weight ``W_j ≤ 0`` DR-Lloyd cannot move it, and a centre pulled onto the box's bounds
    sits where no raw value is; either way the fit has fewer useful centres than k. As k-means
    relocates an empty cluster, each such centre is moved into the other cell of largest ``W``,
    which is split along its principal axis: ``c ± ½·sqrt(λ₁)·v₁`` of the cell's weighted scatter
    ``Σ w_i (z_i − c)(z_i − c)ᵀ / W`` (docs/mechanisms.md §7.2).

    Parameters
    ----------
    z : ndarray (m, p); w : ndarray (m,) — stacked records and their DR weights
    C : ndarray (k, p) — the fit; dead : bool ndarray (k,) — the centres to move

    Returns
    -------
    ndarray (k, p), or None when no centre is dead, or none is left to split
    """
    a, _ = _nearest(z, (z * z).sum(axis=1), C)
    W = np.bincount(a, w, minlength=C.shape[0])
    dead = np.asarray(dead, dtype=bool)
    Wl = np.where(~dead & (W > 0), W, -np.inf)
    dead = np.flatnonzero(dead)
    if dead.size == 0 or not np.isfinite(Wl).any():
        return None
    C = C.copy()
    for j in dead:
        i = int(np.argmax(Wl))
        cell = a == i
        r = z[cell] - C[i]
        scatter = (r * w[cell, None]).T @ r / Wl[i]
        lam, vec = np.linalg.eigh((scatter + scatter.T) / 2.0)
        half = 0.5 * math.sqrt(max(float(lam[-1]), 0.0)) * vec[:, -1]
        if not np.any(half):
            return None
        C[j], C[i] = C[i] + half, C[i] - half
        Wl[i] = Wl[j] = Wl[i] / 2.0  # the next dead centre splits the largest of what is left
        a[np.flatnonzero(cell)[(r @ half) > 0]] = j
    return C


def kmeans_plus_plus(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding (Arthur & Vassilvitskii 2007) on the rows of ``x`` (n, p) → (k, p)."""
    n = x.shape[0]
    C = np.empty((k, x.shape[1]))
    C[0] = x[rng.integers(n)]
    d = sq_distances(x, C[:1])[:, 0]
    for j in range(1, k):
        tot = d.sum()
        i = int(rng.choice(n, p=d / tot)) if tot > 0 else int(rng.integers(n))
        C[j] = x[i]
        d = np.minimum(d, sq_distances(x, C[j:j + 1])[:, 0])
    return C


class KMeansLoss(Loss):
    """The k-means risk ``ℓ(x, C) = min_j ‖x − c_j‖²`` of ``k`` centres in ``p`` columns.

    Parameters
    ----------
    k : int
        Number of centres, 1 … 50.
    p : int
        Record width (every column noised), ≥ 1.
    box : (low, high), optional
        Bounds of the raw data per column (arrays (p,) or scalars), in the units of the records.
        The centres are seeded on the reports inside the box (the exact ones among them), not on
        the noise, and kept in it (:meth:`project`). Default: no box.
    n_init : int
        Seeded restarts of the batch fit (1 … 100; default 5); the fit with the lowest corrected
        risk is kept.
    seed : int
        Seed of the restarts: the fit is a deterministic function of the reports.

    Notes
    -----
    ``θ = C.ravel()`` (q = k·p). :meth:`minimise` is the batch fit that
    :func:`mechanisms.estimation.m_estimate` uses for this loss: per restart, k-means++ seeding,
    Lloyd on ``x̃₁`` (naive), then the safeguarded DR-Lloyd iteration (:func:`weighted_lloyd`;
    :meth:`newton` steps when it has not converged in 30 steps) to a step of 10⁻³ standard
    errors (:meth:`tolerance`).
    The sub-gradient is ``2(c_a − x)`` for the nearest centre ``a``. docs/mechanisms.md §7.1–§7.2.

    Raises
    ------
    ParameterError
        ``k``, ``p``, ``n_init`` out of range, or a box that is not finite with low < high.
    """

    smooth = False
    smooth_theta = False
    name = "kmeans"

    def __init__(self, k: int, p: int, *, box=None, n_init: int = 5, seed: int = 0) -> None:
        self.k, self.p = _check_k(k), _check_p(p)
        self.noised = tuple(range(self.p))
        if isinstance(n_init, bool) or not isinstance(n_init, (int, np.integer)) or not 1 <= n_init <= 100:
            raise ParameterError(f"n_init must be an integer in [1, 100], got {n_init!r}")
        self.n_init, self.seed = int(n_init), int(seed)
        self.box = None
        if box is not None:
            lo = np.broadcast_to(check_finite_array("box low", box[0], ndim=(0, 1)), (self.p,))
            hi = np.broadcast_to(check_finite_array("box high", box[1], ndim=(0, 1)), (self.p,))
            if np.any(lo >= hi):
                raise ParameterError("box: low must be < high in every column")
            self.box = (np.array(lo), np.array(hi))

    #: Per-component widths of the parameter groups (mechanisms.mixtures.components).
    @property
    def widths(self) -> tuple[int, ...]:
        return (self.p,)

    def n_params(self, p: int) -> int:
        return self.k * self.p

    def min_columns(self) -> int:
        return self.p

    def _check_records(self, x, name):
        if x.shape[1] != self.p:
            raise ParameterError(f"{name} must have exactly {self.p} column(s), got shape {x.shape}")

    def centres(self, theta: np.ndarray) -> np.ndarray:
        """The centres (k, p) of a parameter vector."""
        return np.asarray(theta, dtype=np.float64).reshape(self.k, self.p)

    # -- values -------------------------------------------------------------------------------
    def value(self, x, theta):
        return sq_distances(x, self.centres(theta)).min(axis=1)

    def grad(self, x, theta):
        C = self.centres(theta)
        a = sq_distances(x, C).argmin(axis=1)
        out = np.zeros((x.shape[0], self.k, self.p))
        out[np.arange(x.shape[0]), a] = 2.0 * (C[a] - x)
        return out.reshape(x.shape[0], -1)

    def _two_nearest(self, x, C):
        d = sq_distances(x, C)
        if self.k == 1:
            z = np.zeros(x.shape[0], dtype=np.int64)
            return z, z, np.full(x.shape[0], np.inf)
        part = np.argpartition(d, 1, axis=1)[:, :2]
        rows = np.arange(x.shape[0])
        d0, d1 = d[rows, part[:, 0]], d[rows, part[:, 1]]
        swap = d1 < d0
        a = np.where(swap, part[:, 1], part[:, 0])
        b = np.where(swap, part[:, 0], part[:, 1])
        return a, b, np.abs(d1 - d0)

    def residual_spread(self, x, theta):
        """Robust spread (IQR/1.349) of the gap ``‖x − c_b‖² − ‖x − c_a‖²`` between the
        nearest and second-nearest centre, the variable the sub-gradient jumps in."""
        if self.k == 1:
            return 1.0
        gap = self._two_nearest(x, self.centres(theta))[2]
        s = float(_robust_spread(gap[:, None])[0])
        return s if math.isfinite(s) and s > 0 else 1.0

    def smoothed_hessian(self, x, theta, bandwidth):
        """Mean θ-Hessian with the cell indicators' jumps smoothed by a Gaussian kernel, (q, q).

        For a record with nearest centre ``a``, second-nearest ``b`` and gap ``S = ‖x − c_b‖² −
        ‖x − c_a‖² ≥ 0``: ``2I`` on block (a, a) and, with ``K = φ(S/h)/h``, ``u_j = c_j − x``:
        ``−4K u_a u_aᵀ`` on (a, a), ``−4K u_b u_bᵀ`` on (b, b), ``4K u_a u_bᵀ`` on (a, b) and its
        transpose on (b, a) — the kernel estimate of Pollard's boundary terms
        (docs/mechanisms.md §7.2). ``bandwidth`` is in units of the squared distance.
        """
        return self.hessian_sum(x, np.ones(x.shape[0]), self.centres(theta), bandwidth) / x.shape[0]

    def hessian_sum(self, x: np.ndarray, w: np.ndarray, C: np.ndarray, bandwidth: float) -> np.ndarray:
        """``Σ_i w_i`` × the per-record smoothed Hessian of :meth:`smoothed_hessian`, (q, q)."""
        n, k, p = x.shape[0], self.k, self.p
        a, b, S = self._two_nearest(x, C)
        H = np.zeros((k, p, k, p))
        cnt = np.bincount(a, w, minlength=k)
        for j in range(k):
            H[j, :, j, :] = 2.0 * cnt[j] * np.eye(p)
        if k > 1:
            h = float(bandwidth)
            K = np.exp(-0.5 * (S / h) ** 2) / (h * _SQRT_2PI)
            keep = K > 1e-12 * K.max() if n and K.max() > 0 else np.zeros(n, bool)
            ua, ub, Kk = C[a[keep]] - x[keep], C[b[keep]] - x[keep], 4.0 * K[keep] * w[keep]
            aa, bb = a[keep], b[keep]
            for j in range(k):
                for m in range(k):
                    if j == m:
                        sel_a, sel_b = aa == j, bb == j
                        blk = -(ua[sel_a].T * Kk[sel_a]) @ ua[sel_a] - (ub[sel_b].T * Kk[sel_b]) @ ub[sel_b]
                    else:
                        s1 = (aa == j) & (bb == m)
                        s2 = (aa == m) & (bb == j)
                        blk = (ua[s1].T * Kk[s1]) @ ub[s1] + (ub[s2].T * Kk[s2]) @ ua[s2]
                    H[j, :, m, :] += blk
        H = H.reshape(k * p, k * p)
        return 0.5 * (H + H.T)

    def newton(self, z: np.ndarray, w: np.ndarray, C: np.ndarray, tol: float, *,
               max_iter: int = 30) -> np.ndarray:
        """Newton steps on the weighted risk ``Σ w_i min_j ‖z_i − c_j‖²`` with the smoothed Hessian
        (:meth:`hessian_sum`, bandwidth ``spread·m^(−1/5)``), each halved until the risk does not
        increase; stops when a step moves no centre more than ``tol``, at a step that cannot be
        made, or at a Hessian that is not positive definite. Where noise puts many reports near
        the cell boundaries Lloyd steps are short (they leave out the boundary terms of the
        Hessian) and converge slowly; these steps bring the fit close to the fixed point first.

        Returns
        -------
        ndarray (k, p)
        """
        zz = (z * z).sum(axis=1)
        zt = np.ascontiguousarray(z.T)
        a, d = _nearest(z, zz, C, zt)
        F = float(w @ d)
        for _ in range(max_iter):
            W = np.bincount(a, w, minlength=self.k)
            S = np.stack([np.bincount(a, w * z[:, j], minlength=self.k) for j in range(self.p)], axis=1)
            g = 2.0 * (W[:, None] * C - S)
            gap = self._two_nearest(z, C)[2]
            spread = float(_robust_spread(gap[:, None])[0]) if self.k > 1 else 1.0
            H = self.hessian_sum(z, w, C, spread * z.shape[0] ** -0.2)
            try:
                np.linalg.cholesky(H)
                step = np.linalg.solve(H, g.ravel()).reshape(C.shape)
            except np.linalg.LinAlgError:
                return C
            for t in 0.5 ** np.arange(8):
                Ct = self.project_centres(C - t * step)
                at, dt = _nearest(z, zz, Ct, zt)
                Ft = float(w @ dt)
                if Ft <= F:
                    break
            else:
                return C
            shift = float(np.abs(Ct - C).max())
            C, a, F = Ct, at, Ft
            if shift <= tol:
                break
        return C

    @staticmethod
    def tolerance(z: np.ndarray, w: np.ndarray, C: np.ndarray) -> float:
        """A step size that no longer matters: 10⁻³ of the smallest rough standard error of a
        centre coordinate, ``sqrt(Σ_cell w_i² (z_i − c_j)²)/|W_j|`` (boundary terms left out)."""
        a, _ = _nearest(z, (z * z).sum(axis=1), C)
        k = C.shape[0]
        W = np.abs(np.bincount(a, w, minlength=k))
        r2 = ((z - C[a]) ** 2).sum(axis=1) / z.shape[1]
        se = np.sqrt(np.bincount(a, w * w * r2, minlength=k)) / np.maximum(W, 1e-300)
        se = se[np.isfinite(se) & (se > 0)]
        return 1e-3 * float(se.min()) if se.size else 1e-6

    def project_centres(self, C: np.ndarray) -> np.ndarray:
        """Centres clipped into the box (unchanged without one)."""
        return C if self.box is None else np.clip(C, self.box[0], self.box[1])

    def project(self, theta: np.ndarray) -> np.ndarray:
        """θ with its centres clipped into the box: the k-means centres of raw values lie in their
        bounds, so fits and renewal steps are kept there (a centre held on a bound is reported as
        not identified, docs/mechanisms.md §7.6)."""
        return self.project_centres(self.centres(theta)).ravel()

    def theta_scale(self, x, theta):
        return np.tile(_robust_spread(x), self.k)

    # -- the batch fit ------------------------------------------------------------------------
    def _seed_rows(self, x: np.ndarray) -> np.ndarray:
        if self.box is None:
            return x
        inside = np.all((x >= self.box[0]) & (x <= self.box[1]), axis=1)
        return x[inside] if inside.sum() >= 4 * self.k else x

    def initial_theta(self, x):
        rows = self._seed_rows(x)
        rng = np.random.default_rng(self.seed)
        return kmeans_plus_plus(rows, min(self.k, rows.shape[0]), rng).ravel() if rows.shape[0] >= self.k \
            else np.resize(rows, (self.k, self.p)).ravel()

    def minimise(self, closs, x1, x2, theta0) -> tuple[np.ndarray, bool, str]:
        """Batch fit of the corrected k-means risk (class Notes); returns ``(θ, converged, how)``.

        Raises
        ------
        ParameterError
            Fewer reports than centres.
        """
        if x1.shape[0] < self.k:
            raise ParameterError(f"k = {self.k} centres need at least {self.k} reports, got {x1.shape[0]}")
        z, w = stacked(closs, x1, x2)
        rng = np.random.default_rng(self.seed)
        seeds = self._seed_rows(x1)
        starts = [] if theta0 is None else [self.centres(theta0)]
        for _ in range(self.n_init):
            C0 = kmeans_plus_plus(seeds, self.k, rng)
            starts.append(weighted_lloyd(seeds, np.ones(seeds.shape[0]), C0, max_iter=100, tol=1e-6)[0])
        distinct = []
        for C0 in starts:  # restarts that reached the same naive solution need one DR run
            if not any(np.abs(C0[match_components(D, C0)] - D).max() <= 1e-4 for D in distinct):
                distinct.append(C0)
        best, splits = None, 0
        for C0 in distinct:
            for run in range(self.k):  # the start, then up to k − 1 restarts from split cells
                C, conv, W = self._dr_lloyd(z, w, C0)
                F = float(w @ sq_distances(z, C).min(axis=1))
                dead = ~(W > 0) | self.held_on_box(C)
                key = (int(dead.sum()), F)  # fewest centres the data do not place, then the risk
                if best is None or key < best[0]:
                    best = (key, C, conv)
                C0 = split_dead_cells(z, w, C, dead) if run < self.k - 1 else None
                if C0 is None:
                    break
                splits += 1
        (_, F), C, conv = best
        how = f"DR-Lloyd, best of {len(distinct)} distinct starts"
        return C.ravel(), conv, how + (f" and {splits} restarts with dead cells split" if splits else "")

    def held_on_box(self, C: np.ndarray) -> np.ndarray:
        """Per centre (k,): whether a coordinate is within 10⁻⁹ of half the box's width of its
        bounds (all False without a box) — the reports would place it outside, where no raw value
        is (the batch fit's restarts, and :func:`mechanisms.mixtures.fit.unidentified_components`)."""
        if self.box is None:
            return np.zeros(C.shape[0], dtype=bool)
        tol = 0.5e-9 * (self.box[1] - self.box[0])
        return np.any((C <= self.box[0] + tol) | (C >= self.box[1] - tol), axis=1)

    def _dr_lloyd(self, z, w, C0):
        """DR-Lloyd from ``C0`` to :meth:`tolerance` (Newton steps when 30 Lloyd steps did not
        converge): ``(C, converged, cell weights)``."""
        tol = self.tolerance(z, w, C0)
        C, conv, W = weighted_lloyd(z, w, C0, max_iter=30, tol=tol, box=self.box)
        if not conv:  # slow Lloyd steps (noise near the cell boundaries): Newton, then Lloyd again
            C, conv, W = weighted_lloyd(z, w, self.newton(z, w, C, tol), tol=tol, box=self.box)
        return C, conv, W

    def __repr__(self) -> str:
        return f"KMeansLoss(k={self.k}, p={self.p})"
