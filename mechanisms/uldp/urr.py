"""Utility-optimized randomized response (uRR) and k-ary RR (Murakami & Kawamoto 2019 §2.4, §4.1;
docs/frequency.md §2, §7)."""

from __future__ import annotations

import logging
import math

import numpy as np

from mechanisms.errors import ParameterError
from mechanisms.rng import RngLike, as_generator
from mechanisms.uldp.base import (
    FrequencyMechanism,
    check_codes,
    check_epsilon,
    check_k,
    check_sensitive,
    em_loop,
)
from mechanisms.uldp.counts import FrequencyCounts

logger = logging.getLogger(__name__)


class URR(FrequencyMechanism):
    """(𝒳_S, ε)-utility-optimized randomized response.

    Output alphabet = input alphabet ``0..k-1``. With s = |𝒳_S|:
    c₁ = e^ε/(s + e^ε − 1), c₂ = 1/(s + e^ε − 1), c₃ = 1 − s·c₂.
    A sensitive x is kept w.p. c₁ and otherwise replaced by one of the other s − 1 sensitive values
    (each w.p. c₂) — never by a non-sensitive one. A non-sensitive x is kept w.p. c₃ (and is then
    *revealed*: a non-sensitive output identifies the input) or replaced by a sensitive value
    (each w.p. c₂).

    Parameters
    ----------
    k : int
        Domain size (>= 2); values are integer codes 0..k−1.
    sensitive : set or sequence of int
        Sensitive codes 𝒳_S, non-empty, within 0..k−1.
    epsilon : float
        Privacy parameter ε, finite > 0.

    Attributes
    ----------
    k, sensitive (sorted int64 array (s,)), epsilon, c1, c2, c3, output_kind = "codes".

    Raises
    ------
    ParameterError
        Any parameter outside its range (message names the argument).

    Notes
    -----
    Source: paper §4.1 (Definition 3), docs/frequency.md §2. Provides (𝒳_S, 𝒳_S, ε)-ULDP: protected
    outputs are the sensitive codes.
    """

    kind = "urr"
    output_kind = "codes"

    def __init__(self, k: int, sensitive, epsilon: float) -> None:
        self.k = check_k(k)
        self.sensitive = check_sensitive(sensitive, self.k)
        self.epsilon = check_epsilon(epsilon)
        s = self.s
        e = math.exp(self.epsilon)
        if not math.isfinite(e):
            raise ParameterError(f"epsilon must be <= 700 so that e^epsilon is finite, got {epsilon!r}")
        self.c1 = e / (s + e - 1.0)
        self.c2 = 1.0 / (s + e - 1.0)
        self.c3 = 1.0 - s * self.c2
        rank = np.full(self.k, -1, dtype=np.int64)
        rank[self.sensitive] = np.arange(s)
        self._rank = rank

    # -- client side ---------------------------------------------------------------------------
    def privatize(self, codes, rng: RngLike = None) -> np.ndarray:
        """Privatize a batch of codes.

        Parameters
        ----------
        codes : array_like of int, shape (n,)
            True values in 0..k−1.
        rng : Generator, int or None
            Randomness (None: OS entropy).

        Returns
        -------
        ndarray of int32, shape (n,)
            Output codes.

        Raises
        ------
        ParameterError
            If a code lies outside 0..k−1.
        """
        x = check_codes(codes, self.k)
        g = as_generator(rng)
        n = x.size
        out = x.astype(np.int32)
        if n == 0:
            return out
        s = self.s
        r = self._rank[x]
        sens = r >= 0
        u = g.random(n)
        keep = np.where(sens, u < self.c1, u < self.c3)
        # sensitive input, not kept: uniform over the other s-1 sensitive values
        ms = sens & ~keep
        cnt = int(ms.sum())
        if cnt:
            j = g.integers(0, s - 1, size=cnt)
            j += j >= r[ms]
            out[ms] = self.sensitive[j]
        mn = ~sens & ~keep
        cnt = int(mn.sum())
        if cnt:
            out[mn] = self.sensitive[g.integers(0, s, size=cnt)]
        return out

    # -- collector side ------------------------------------------------------------------------
    def counts(self, reports) -> FrequencyCounts:
        """Count a batch of reports (int codes, shape (n,)) into mergeable :class:`FrequencyCounts`
        (``counts[y]`` = number of reports equal to y).

        Raises
        ------
        ParameterError
            If a report lies outside 0..k−1.
        """
        y = check_codes(reports, self.k, "reports")
        return FrequencyCounts(self.signature, y.size, np.bincount(y, minlength=self.k))

    def transition_matrix(self) -> np.ndarray:
        """Dense Q[y, x] = Q(y | x), shape (k, k) (columns sum to 1; for small k, tests, audits)."""
        Q = np.zeros((self.k, self.k))
        S = self.sensitive
        Q[np.ix_(S, np.arange(self.k))] = self.c2
        nonsens = ~self.is_sensitive
        Q[S, S] = self.c1
        idx = np.nonzero(nonsens)[0]
        Q[idx, idx] = self.c3
        return Q

    def _intercept_slope(self) -> tuple[np.ndarray, np.ndarray]:
        a = np.where(self.is_sensitive, self.c2, 0.0)
        b = np.full(self.k, self.c3)  # c1 - c2 == c3 (docs/frequency.md §2: divide, never multiply)
        return a, b

    def _cov_factor(self, m: np.ndarray, p: np.ndarray) -> np.ndarray:
        # multinomial: Cov(m̂_j, m̂_l) = -m_j m_l / n  ⇒  Cov(p̂_j, p̂_l) = -(m_j/b_j)(m_l/b_l)/n
        _, b = self._intercept_slope()
        return m / b

    def _em(self, counts: FrequencyCounts, max_iter: int = 2000, tol: float = 1e-7) -> np.ndarray:
        """EM p ← p ⊙ Qᵀ(m̂ ⊘ Qp) in O(k) per step using the structure of Q:
        (Qp)_y = a_y + c₃ p_y and (Qᵀw)_x = c₂ Σ_{y∈𝒳_S} w_y + c₃ w_x."""
        m = counts.counts / counts.n
        a, b = self._intercept_slope()
        S = self.is_sensitive

        def update(p):
            qp = a + b * p
            w = np.divide(m, qp, out=np.zeros_like(m), where=qp > 0)
            return p * (self.c2 * w[S].sum() + self.c3 * w)

        return em_loop(update, np.full(self.k, 1.0 / self.k), max_iter, tol)


class RR(URR):
    """k-ary randomized response: uRR with every value sensitive (s = k), ε-LDP.

    Parameters
    ----------
    k : int
        Domain size (>= 2).
    epsilon : float
        Finite > 0.

    Raises
    ------
    ParameterError
        Bad ``k`` or ``epsilon``.

    Notes
    -----
    Source: paper §2.4 (k-RR), docs/frequency.md §2, §7. c₁ = e^ε/(k + e^ε − 1) is the keep probability.
    """

    def __init__(self, k: int, epsilon: float) -> None:
        k = check_k(k)
        super().__init__(k, range(k), epsilon)

    def __repr__(self) -> str:
        return f"RR(k={self.k}, epsilon={self.epsilon!r})"
