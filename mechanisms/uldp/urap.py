"""Utility-optimized RAPPOR (uRAP) and the generalized RAPPOR / OUE baselines
(Murakami & Kawamoto 2019 §2.4, §4.2; docs/frequency.md §3, §7)."""

from __future__ import annotations

import logging
import math

import numpy as np
import scipy.sparse as sp

from mechanisms.errors import ParameterError
from mechanisms.rng import RngLike, as_generator
from mechanisms.uldp.base import (
    FrequencyMechanism,
    check_codes,
    check_epsilon,
    check_k,
    check_sensitive,
    check_theta,
    em_loop,
)
from mechanisms.uldp.counts import DEFAULT_MAX_PATTERNS, FrequencyCounts, cap_patterns
from mechanisms.uldp.sparse import SparseBits

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 23


def sample_subsets(M: np.ndarray, c: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw, for every row i, ``c[i]`` distinct positions uniformly from ``0..M[i]-1``.

    Vectorised across rows; O(Σ min(cᵢ, Mᵢ − cᵢ)) expected work plus O(Mᵢ) for rows where more
    than half the positions are drawn (the complement is sampled, then expanded). Duplicates are
    resolved by redrawing the repeated entries until none remain — the procedure is equivariant
    under relabelling of the population, so each c-subset is equally likely.

    Parameters
    ----------
    M, c : ndarray of int64, shape (n,)
        Population sizes and sample sizes, 0 <= c <= M.
    rng : Generator

    Returns
    -------
    rows, pos : ndarray of int64, shape (Σ c,)
        Row of each drawn position and the position (unsorted).
    """
    M = np.asarray(M, np.int64)
    c = np.asarray(c, np.int64)
    n = M.size
    comp = c > M // 2
    c_eff = np.where(comp, M - c, c)
    rows = np.repeat(np.arange(n, dtype=np.int64), c_eff)
    if rows.size:
        Mrep = M[rows]
        pos = rng.integers(0, Mrep)
        width = int(M.max()) + 1
        ent = np.arange(rows.size)  # entries of rows that may still hold duplicates
        while ent.size:
            key = rows[ent] * width + pos[ent]
            order = np.argsort(key, kind="stable")
            ks = key[order]
            dup = np.zeros(ks.size, dtype=bool)
            dup[1:] = ks[1:] == ks[:-1]
            if not dup.any():
                break
            todo = ent[order[dup]]
            pos[todo] = rng.integers(0, Mrep[todo])
            bad = np.zeros(n, dtype=bool)
            bad[rows[todo]] = True
            ent = ent[bad[rows[ent]]]
    else:
        pos = np.zeros(0, np.int64)
    if not comp.any():
        return rows, pos
    # expand complement rows: every position not drawn
    crow = np.nonzero(comp)[0]
    width = int(M[crow].max())
    dense = np.arange(width)[None, :] < M[crow][:, None]
    local = np.full(n, -1, np.int64)
    local[crow] = np.arange(crow.size)
    sel = comp[rows]
    dense[local[rows[sel]], pos[sel]] = False
    r2, p2 = np.nonzero(dense)
    keep = ~sel
    return np.concatenate([rows[keep], crow[r2]]), np.concatenate([pos[keep], p2.astype(np.int64)])


class URAP(FrequencyMechanism):
    """(𝒳_S, θ, ε)-utility-optimized RAPPOR.

    Output: a bit vector in {0,1}^k (a :class:`SparseBits` batch). With
    d₁ = θ/((1−θ)e^ε + θ) and d₂ = ((1−θ)e^ε + θ)/e^ε:
    sensitive bit j is 1 w.p. θ if x = xⱼ, else d₁ (for every input, sensitive or not);
    non-sensitive bit j is 1 w.p. 1 − d₂ if x = xⱼ, else 0. A report with no non-sensitive bit set
    is *protected*; otherwise it reveals x.

    Parameters
    ----------
    k : int
        Domain size (>= 2).
    sensitive : set or sequence of int
        Sensitive codes, non-empty, within 0..k−1.
    epsilon : float
        Finite > 0.
    theta : float in (0, 1), optional
        Probability that the true sensitive bit is kept. Default e^{ε/2}/(e^{ε/2}+1), which gives
        d₁ = 1 − θ and d₂ = e^{−ε/2}.
    max_patterns : int, optional
        Cap on distinct sensitive-bit patterns kept in :meth:`counts` for EM (0 disables;
        default 65536). See :class:`FrequencyCounts` for the overflow fallback.

    Attributes
    ----------
    k, sensitive, epsilon, theta, d1, d2, output_kind = "bits".

    Raises
    ------
    ParameterError
        Any parameter outside its range.

    Notes
    -----
    Source: paper §4.2 (Definition 4), docs/frequency.md §3. Provides (𝒳_S, 𝒴_P, ε)-ULDP with 𝒴_P the
    protected reports.
    """

    kind = "urap"
    output_kind = "bits"

    def __init__(self, k: int, sensitive, epsilon: float, theta: float | None = None,
                 max_patterns: int = DEFAULT_MAX_PATTERNS) -> None:
        self.k = check_k(k)
        self.sensitive = check_sensitive(sensitive, self.k)
        self.epsilon = check_epsilon(epsilon)
        e = math.exp(self.epsilon)
        if not math.isfinite(e):
            raise ParameterError(f"epsilon must be <= 700 so that e^epsilon is finite, got {epsilon!r}")
        if theta is None:
            h = math.exp(self.epsilon / 2)
            self.theta = h / (h + 1.0)
        else:
            self.theta = check_theta(theta)
        if isinstance(max_patterns, bool) or not isinstance(max_patterns, (int, np.integer)) \
                or max_patterns < 0:
            raise ParameterError(f"max_patterns must be an integer >= 0, got {max_patterns!r}")
        self.max_patterns = int(max_patterns)
        t = self.theta
        self.d1 = t / ((1.0 - t) * e + t)
        self.d2 = ((1.0 - t) * e + t) / e
        rank = np.full(self.k, -1, dtype=np.int64)
        rank[self.sensitive] = np.arange(self.s)
        self._rank = rank

    def _signature_params(self) -> str:
        return f"|theta={self.theta!r}"

    # -- client side ---------------------------------------------------------------------------
    def privatize(self, codes, rng: RngLike = None) -> SparseBits:
        """Privatize a batch of codes into bit-vector reports, O(number of ones) per report.

        The number of ones among the other sensitive bits is Binomial(s − 1, d₁) for a sensitive
        input and Binomial(s, d₁) for a non-sensitive one; their positions are drawn without
        replacement (:func:`sample_subsets`).

        Parameters
        ----------
        codes : array_like of int, shape (n,)
            True values in 0..k−1.
        rng : Generator, int or None

        Returns
        -------
        SparseBits
            ``n`` reports of length ``k``.

        Raises
        ------
        ParameterError
            If a code lies outside 0..k−1.
        """
        x = check_codes(codes, self.k)
        g = as_generator(rng)
        n = x.size
        if n == 0:
            return SparseBits(np.zeros(0, np.int32), np.zeros(1, np.int64), self.k)
        r = self._rank[x]
        sens = r >= 0
        own = g.random(n) < np.where(sens, self.theta, 1.0 - self.d2)
        M = np.where(sens, self.s - 1, self.s).astype(np.int64)
        c = g.binomial(M, self.d1)
        rows, pos = sample_subsets(M, c, g)
        rr = r[rows]
        pos = pos + ((rr >= 0) & (pos >= rr))
        codes_other = self.sensitive[pos]
        own_rows = np.nonzero(own)[0]
        k = self.k
        key = np.concatenate([rows * k + codes_other, own_rows * k + x[own_rows]])
        key.sort()
        all_rows = key // k
        idx = (key - all_rows * k).astype(np.int32)
        off = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(all_rows, minlength=n), out=off[1:])
        return SparseBits(idx, off, k)

    # -- collector side ------------------------------------------------------------------------
    def counts(self, reports: SparseBits) -> FrequencyCounts:
        """Count a batch of reports into mergeable :class:`FrequencyCounts`: per-bit counts, plus
        (for EM) counts of the distinct sensitive-bit patterns among protected reports, capped at
        ``max_patterns`` (overflowed reports are summarised by per-bit counts).

        Raises
        ------
        ParameterError
            If ``reports`` is not a SparseBits of length ``k`` or a report has more than one
            non-sensitive bit set (impossible under uRAP).
        """
        if not isinstance(reports, SparseBits):
            raise ParameterError(f"reports must be SparseBits, got {type(reports).__name__}")
        if reports.k != self.k:
            raise ParameterError(f"reports must have k={self.k} bits, got k={reports.k}")
        n = reports.n
        off = reports.offsets
        rk = self._rank[reports.indices]
        ns = rk < 0
        # non-sensitive bits per report from a cumulative sum at the offsets (no per-entry rows)
        cs = np.zeros(ns.size + 1, dtype=np.int64)
        np.cumsum(ns, out=cs[1:])
        n_ns = cs[off[1:]] - cs[off[:-1]]
        if n and n_ns.max(initial=0) > 1:
            bad = int(np.argmax(n_ns > 1))
            raise ParameterError(f"reports: report {bad} has {n_ns[bad]} non-sensitive bits set (max 1)")
        protected = n_ns == 0
        s = self.s
        ent = np.repeat(protected, np.diff(off))  # entries of protected reports (all sensitive)
        prank = rk[ent]
        if self.max_patterns > 0:
            rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(off))
            patterns = _pattern_counts(np.nonzero(protected)[0], rows[ent], prank, s)
            patterns, ov_n, ov_b = cap_patterns(patterns, self.max_patterns, s)
        else:
            patterns, ov_n = {}, int(np.count_nonzero(protected))
            ov_b = np.bincount(prank, minlength=s).astype(np.int64)
        return FrequencyCounts(self.signature, n, reports.column_counts(), patterns, ov_n, ov_b,
                               self.max_patterns)

    def empty_counts(self) -> FrequencyCounts:
        """Counts of zero reports (the identity of ``merge``)."""
        return FrequencyCounts(self.signature, 0, np.zeros(self.k, np.int64), {}, 0,
                               np.zeros(self.s, np.int64), self.max_patterns)

    def bit_matrix(self) -> np.ndarray:
        """B[j, x] = P(bit j = 1 | x), shape (k, k) (for small k: tests and audits)."""
        S = self.is_sensitive
        B = np.zeros((self.k, self.k))
        B[S, :] = self.d1
        idx = np.arange(self.k)
        B[idx, idx] = np.where(S, self.theta, 1.0 - self.d2)
        return B

    def _intercept_slope(self) -> tuple[np.ndarray, np.ndarray]:
        S = self.is_sensitive
        a = np.where(S, self.d1, 0.0)
        b = np.where(S, self.theta - self.d1, 1.0 - self.d2)
        return a, b

    def _cov_factor(self, m: np.ndarray, p: np.ndarray) -> np.ndarray:
        # bits j != l: Cov(y_j, y_l) = -b_j b_l p_j p_l  ⇒  Cov(p̂_j, p̂_l) = -p_j p_l / n
        return p

    def _em(self, counts: FrequencyCounts, max_iter: int = 2000, tol: float = 1e-7) -> np.ndarray:
        """EM over the exact likelihood. Revealed reports identify x. A protected report with
        sensitive pattern z has Q(z|xᵢ) ∝ r(zᵢ) for sensitive xᵢ (r(1) = θ/d₁,
        r(0) = (1−θ)/(1−d₁)) and ∝ d₂ for non-sensitive x (common factor Πⱼ d₁^{zⱼ}(1−d₁)^{1−zⱼ})."""
        S = self.is_sensitive
        N = ~S
        s = self.s
        n = counts.n
        revealed = counts.counts[N].astype(np.float64)
        n_prot = n - revealed.sum()
        keys = list((counts.patterns or {}).keys())
        Nz = np.array([counts.patterns[kk] for kk in keys], dtype=np.float64)
        on = float(counts.overflow_n)
        ob = (np.zeros(s) if counts.overflow_bits is None else counts.overflow_bits.astype(np.float64))
        if abs(Nz.sum() + on - n_prot) > 0.5 or ob.shape != (s,):
            raise ParameterError("counts: pattern counts do not add up to the protected reports")
        if keys:
            nb = (s + 7) // 8
            packed = np.frombuffer(b"".join(bytes.fromhex(kk) for kk in keys), np.uint8).reshape(-1, nb)
            dense = np.unpackbits(packed, axis=1)[:, :s]
            # dense products are faster for small pattern tables; sparse for large ones
            Mz = dense.astype(np.float64)
            if Mz.size > 1 << 21:
                Mz = sp.csr_matrix(Mz)
        else:
            Mz = np.zeros((0, s))
        r1 = self.theta / self.d1
        r0 = (1 - self.theta) / (1 - self.d1)
        d2 = self.d2

        def update(p):
            pS, pN = p[S], p[N]
            PS, PN = pS.sum(), pN.sum()
            base = r0 * PS + d2 * PN
            D = base + (r1 - r0) * (Mz @ pS)
            w = Nz / D
            W = w.sum()
            cS = pS * (r0 * W + (r1 - r0) * (Mz.T @ w))
            cN = pN * d2 * W
            if on > 0:
                Dbar = base + (r1 - r0) * (pS @ ob) / on
                cS = cS + pS * (r1 * ob + r0 * (on - ob)) / Dbar
                cN = cN + pN * d2 * on / Dbar
            new = np.empty_like(p)
            new[S] = cS
            new[N] = revealed + cN
            return new / n

        return em_loop(update, np.full(self.k, 1.0 / self.k), max_iter, tol)


def _pattern_counts(prot_rows: np.ndarray, prow: np.ndarray, prank: np.ndarray, s: int) -> dict[str, int]:
    """Count distinct sensitive-bit patterns (packbits hex keys) of the protected reports."""
    m = prot_rows.size
    if m == 0:
        return {}
    local = np.full(int(prot_rows.max()) + 1, -1, np.int64)
    local[prot_rows] = np.arange(m)
    lrow = local[prow]
    nb = (s + 7) // 8
    chunk = max(1, _CHUNK_BYTES // max(s, 1))
    out: dict[str, int] = {}
    order = np.argsort(lrow, kind="stable")
    lrow, prank = lrow[order], prank[order]
    bounds = np.searchsorted(lrow, np.arange(0, m + chunk, chunk))
    for ci, start in enumerate(range(0, m, chunk)):
        stop = min(m, start + chunk)
        dense = np.zeros((stop - start, s), np.uint8)
        a, b = bounds[ci], bounds[ci + 1]
        dense[lrow[a:b] - start, prank[a:b]] = 1
        packed = np.ascontiguousarray(np.packbits(dense, axis=1))
        v = packed.view(np.dtype((np.void, nb))).reshape(-1)
        uniq, cnt = np.unique(v, return_counts=True)
        for u, c in zip(uniq, cnt.tolist()):
            key = u.tobytes().hex()
            out[key] = out.get(key, 0) + c
    return out


class RAPPOR(URAP):
    """Generalized (θ, ε)-RAPPOR (unary encoding): uRAP with every value sensitive, ε-LDP.

    Bit j is 1 w.p. θ if x = xⱼ, else d₁ = θ/((1−θ)e^ε + θ).

    Parameters
    ----------
    k : int
        Domain size (>= 2).
    epsilon : float
        Finite > 0.
    theta : float in (0, 1), optional
        None → symmetric RAPPOR θ = e^{ε/2}/(e^{ε/2}+1) (d₁ = 1 − θ); θ = 1/2 → OUE
        (d₁ = 1/(e^ε + 1)); see :meth:`oue`.
    max_patterns : int, optional
        As in :class:`URAP`.

    Raises
    ------
    ParameterError
        Bad parameter.

    Notes
    -----
    Source: paper §2.4 ((θ, ε)-generalized RAPPOR), docs/frequency.md §3, §7; OUE is Wang et al. 2017.
    """

    def __init__(self, k: int, epsilon: float, theta: float | None = None,
                 max_patterns: int = DEFAULT_MAX_PATTERNS) -> None:
        k = check_k(k)
        super().__init__(k, range(k), epsilon, theta, max_patterns)

    @classmethod
    def oue(cls, k: int, epsilon: float, max_patterns: int = DEFAULT_MAX_PATTERNS) -> RAPPOR:
        """Optimized unary encoding: θ = 1/2, d₁ = 1/(e^ε + 1)."""
        return cls(k, epsilon, 0.5, max_patterns)

    def __repr__(self) -> str:
        return f"RAPPOR(k={self.k}, epsilon={self.epsilon!r}, theta={self.theta!r})"
