"""Personalized ULDP mechanism (PUM): per-user sensitive values mapped to κ bot symbols before a
common uRR/uRAP over the extended domain (Murakami & Kawamoto 2019 §5; docs/frequency.md §6)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from mechanisms._validate import check_open_unit
from mechanisms.errors import ParameterError
from mechanisms.rng import RngLike, as_generator
from mechanisms.uldp.base import (
    METHODS,
    check_codes,
    check_epsilon,
    check_k,
    check_sensitive,
    make_estimate,
)
from mechanisms.uldp.counts import DEFAULT_MAX_PATTERNS, FrequencyCounts, FrequencyEstimate
from mechanisms.uldp.sparse import SparseBits
from mechanisms.uldp.urap import URAP
from mechanisms.uldp.urr import URR

logger = logging.getLogger(__name__)


class PUM:
    """Personalized ULDP mechanism with κ bots.

    Each user's pre-processor maps her personally sensitive values to a bot ⊥_b (code ``k + b``)
    and leaves other values unchanged; the result goes through a common uRR or uRAP over the
    extended domain ``0..k+κ−1`` whose sensitive set is ``common_sensitive`` ∪ {bots}.

    Parameters
    ----------
    k : int
        Size of the original domain 𝒳 (>= 2); codes 0..k−1.
    kappa : int
        Number of bots κ (>= 1), e.g. semantic tags "home", "work".
    epsilon : float
        Finite > 0.
    base : {"urap", "urr"}
        Common mechanism.
    common_sensitive : set or sequence of int, optional
        Values sensitive for everybody (𝒳_S), within 0..k−1; may be empty.
    theta : float in (0, 1), optional
        uRAP θ (default as in :class:`URAP`); must be None for ``base="urr"``.
    bot_members : sequence of κ collections of int, optional
        The codes each bot may stand for (support of its prior π_b). Default: all of 0..k−1.
    max_patterns : int, optional
        uRAP pattern cap (see :class:`FrequencyCounts`).

    Attributes
    ----------
    k, kappa, epsilon, base, K (= k + κ), common_sensitive (int64 array), mechanism (the common
    URR/URAP over 0..K−1), prior (ndarray (κ, k), default uniform over each bot's members),
    output_kind.

    Raises
    ------
    ParameterError
        Any parameter outside its range.

    Notes
    -----
    Source: paper §5.1–§5.3 (f_pre, ULDP of Q_cmn ∘ f_pre, estimation of r then p), docs/frequency.md §6.
    The guarantee for user i is (𝒳_S ∪ 𝒳_S⁽ⁱ⁾, 𝒴_P, ε)-ULDP.
    """

    def __init__(self, k: int, kappa: int, epsilon: float, base: str = "urap", common_sensitive=(),
                 theta: float | None = None, bot_members=None,
                 max_patterns: int = DEFAULT_MAX_PATTERNS) -> None:
        self.k = check_k(k)
        if isinstance(kappa, bool) or not isinstance(kappa, (int, np.integer)) or kappa < 1:
            raise ParameterError(f"kappa must be an integer >= 1, got {kappa!r}")
        self.kappa = int(kappa)
        self.epsilon = check_epsilon(epsilon)
        if base not in ("urap", "urr"):
            raise ParameterError(f"base must be 'urap' or 'urr', got {base!r}")
        self.base = base
        cs = list(common_sensitive) if common_sensitive is not None else []
        self.common_sensitive = (check_sensitive(cs, self.k, "common_sensitive") if cs
                                 else np.zeros(0, np.int64))
        self.K = self.k + self.kappa
        ext = np.concatenate([self.common_sensitive, np.arange(self.k, self.K)])
        if base == "urap":
            self.mechanism = URAP(self.K, ext.tolist(), self.epsilon, theta, max_patterns)
        else:
            if theta is not None:
                raise ParameterError(f"theta applies to base='urap' only, got theta={theta!r} with 'urr'")
            self.mechanism = URR(self.K, ext.tolist(), self.epsilon)
        self.output_kind = self.mechanism.output_kind
        if bot_members is None:
            self.bot_members = [np.arange(self.k) for _ in range(self.kappa)]
        else:
            bm = list(bot_members)
            if len(bm) != self.kappa:
                raise ParameterError(f"bot_members must list kappa={self.kappa} collections, got {len(bm)}")
            self.bot_members = [check_sensitive(m, self.k, f"bot_members[{b}]") for b, m in enumerate(bm)]
        prior = np.zeros((self.kappa, self.k))
        for b, m in enumerate(self.bot_members):
            prior[b, m] = 1.0 / m.size
        self.prior = prior

    @property
    def sensitive(self) -> np.ndarray:
        """Sensitive codes of the common mechanism over the extended domain (common ∪ bots)."""
        return self.mechanism.sensitive

    def preprocess(self, codes, personal_sensitive) -> np.ndarray:
        """Apply each user's pre-processor f_pre⁽ⁱ⁾.

        Parameters
        ----------
        codes : array_like of int, shape (n,)
            True values in 0..k−1.
        personal_sensitive : array_like of int, shape (n,), or sequence of n mappings
            Either the bot index (0..κ−1) report i's value maps to, −1 when the value is not
            personally sensitive; or, per user, a mapping ``{code: bot}`` of her personally
            sensitive values (𝒳_S⁽ⁱ⁾ = ∪_b 𝒳_{S,b}⁽ⁱ⁾). A single mapping applies to every user.

        Returns
        -------
        ndarray of int64, shape (n,)
            Codes in the extended domain 0..k+κ−1.

        Raises
        ------
        ParameterError
            Codes out of range, a bot index outside −1..κ−1, a length mismatch, or a value
            mapped to a bot whose ``bot_members`` exclude it.
        """
        x = check_codes(codes, self.k)
        bots = self._bots(x, personal_sensitive)
        mapped = bots >= 0
        if mapped.any():
            ok = self.prior[bots[mapped], x[mapped]] > 0
            if not ok.all():
                raise ParameterError("personal_sensitive maps a value to a bot outside its bot_members")
        return np.where(mapped, self.k + bots, x)

    def _bots(self, x: np.ndarray, ps) -> np.ndarray:
        if isinstance(ps, Mapping):
            lut = np.full(self.k, -1, np.int64)
            for c, b in ps.items():
                lut[self._code(c)] = self._bot(b)
            return lut[x]
        if isinstance(ps, np.ndarray) or (isinstance(ps, (list, tuple)) and ps
                                          and not isinstance(ps[0], Mapping)):
            b = np.asarray(ps)
            if b.shape != x.shape or b.dtype.kind not in "iu":
                raise ParameterError(f"personal_sensitive must be int bot indices of shape {x.shape}")
            b = b.astype(np.int64)
            if b.size and (b.min() < -1 or b.max() >= self.kappa):
                raise ParameterError(f"personal_sensitive bot indices must lie in [-1, {self.kappa - 1}]")
            return b
        try:
            maps = list(ps)
        except TypeError:
            raise ParameterError("personal_sensitive must be bot indices or mappings code→bot") from None
        if len(maps) != x.size:
            raise ParameterError(f"personal_sensitive must have {x.size} entries, got {len(maps)}")
        out = np.full(x.size, -1, np.int64)
        for i, m in enumerate(maps):
            if not isinstance(m, Mapping):
                raise ParameterError("personal_sensitive entries must be mappings code→bot")
            b = m.get(int(x[i]))
            if b is not None:
                out[i] = self._bot(b)
        return out

    def _code(self, c) -> int:
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= c < self.k:
            raise ParameterError(f"personal_sensitive codes must be integers in [0, {self.k - 1}], got {c!r}")
        return int(c)

    def _bot(self, b) -> int:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= b < self.kappa:
            raise ParameterError(
                f"personal_sensitive bots must be integers in [0, {self.kappa - 1}], got {b!r}")
        return int(b)

    def privatize(self, codes, personal_sensitive, rng: RngLike = None) -> np.ndarray | SparseBits:
        """Pre-process (:meth:`preprocess`) then privatize with the common mechanism.

        Returns
        -------
        ndarray of int32 (n,) for ``base="urr"``, SparseBits (n reports of K bits) for ``"urap"``.
        """
        z = self.preprocess(codes, personal_sensitive)
        return self.mechanism.privatize(z, as_generator(rng))

    def counts(self, reports) -> FrequencyCounts:
        """Counts of the common mechanism over the extended domain (mergeable)."""
        return self.mechanism.counts(reports)

    def empty_counts(self) -> FrequencyCounts:
        """Counts of zero reports."""
        return self.mechanism.empty_counts()

    def estimate_extended(self, counts: FrequencyCounts, method: str = "empirical",
                          level: float = 0.95) -> FrequencyEstimate:
        """Estimate r over the extended domain (shape (K,)) with the common mechanism."""
        return self.mechanism.estimate(counts, method, level)

    def estimate(self, counts: FrequencyCounts, method: str = "empirical", prior=None,
                 level: float = 0.95) -> FrequencyEstimate:
        """Estimate p over 𝒳: p̂(x) = r̂(x) + Σ_b π_b(x) r̂(⊥_b) (paper §5.3).

        Parameters
        ----------
        counts : FrequencyCounts
            From :meth:`counts`.
        method : {"empirical", "threshold", "projected", "em"}
            Applied to r over the extended domain (non-empirical methods give a distribution r̂,
            hence a distribution p̂).
        prior : array_like, shape (κ, k), optional
            π_b(x), rows non-negative summing to 1. Default: uniform over ``bot_members[b]``.
        level : float in (0, 1)

        Returns
        -------
        FrequencyEstimate of shape (k,)
            ``stderr`` is the plug-in SE of the *empirical* p̂, including the covariances between
            r̂(x) and the bot estimates (Cov(r̂ⱼ, r̂ₗ) = −gⱼgₗ/n, g = m̂/b for uRR, g = r̂ for uRAP).

        Raises
        ------
        ParameterError
            Bad method / level / prior, or counts of another mechanism.
        """
        if method not in METHODS:
            raise ParameterError(f"method must be one of {METHODS}, got {method!r}")
        level = check_open_unit("level", level)
        pi = self._check_prior(prior)
        mech = self.mechanism
        counts = mech.check_counts(counts)
        r = mech.estimate(counts, method, level).p
        r_emp, se, m = mech._empirical(counts)
        k = self.k
        p = r[:k] + r[k:] @ pi
        var = se**2
        g = mech._cov_factor(m, r_emp)
        piT = pi.T
        a1 = var[:k] + (piT**2) @ var[k:]
        G = g[:k] + piT @ g[k:]
        G2 = g[:k] ** 2 + (piT**2) @ (g[k:] ** 2)
        v = np.maximum(a1 - (G**2 - G2) / counts.n, 0.0)
        return make_estimate(p, np.sqrt(v), counts.n, method, level)

    def _check_prior(self, prior) -> np.ndarray:
        if prior is None:
            return self.prior
        pi = np.asarray(prior, dtype=np.float64)
        if pi.shape != (self.kappa, self.k) or not np.all(np.isfinite(pi)) or pi.min() < 0 \
                or np.any(np.abs(pi.sum(axis=1) - 1) > 1e-9):
            raise ParameterError(
                f"prior must have shape ({self.kappa}, {self.k}) with non-negative rows summing to 1"
            )
        return pi

    def __repr__(self) -> str:
        try:
            return (f"PUM(k={self.k}, kappa={self.kappa}, epsilon={self.epsilon!r}, base={self.base!r}, "
                    f"common_sensitive={self.common_sensitive.size})")
        except Exception:  # pragma: no cover
            return "PUM(<unprintable>)"
