"""Common machinery of the categorical frequency mechanisms: validation, empirical / threshold /
projected / EM estimation, expected-loss formulas (docs/frequency.md §4, §5; Murakami & Kawamoto
2019 §2.5, §4.3)."""

from __future__ import annotations

import hashlib
import logging
import math

import numpy as np
from scipy.special import ndtri

from mechanisms._validate import check_open_unit, check_positive
from mechanisms.errors import ParameterError
from mechanisms.uldp.counts import FrequencyCounts, FrequencyEstimate

logger = logging.getLogger(__name__)

METHODS = ("empirical", "threshold", "projected", "em")
#: significance level of the ``threshold`` method (docs/frequency.md §4: α = 0.05, Bonferroni over k).
THRESHOLD_ALPHA = 0.05


def check_k(k) -> int:
    """Return ``k`` as int if it is an integer >= 2, else raise ``ParameterError``."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ParameterError(f"k must be an integer >= 2, got {k!r}")
    if int(k) < 2:
        raise ParameterError(f"k must be an integer >= 2, got {k!r}")
    return int(k)


def check_sensitive(sensitive, k: int, name: str = "sensitive") -> np.ndarray:
    """Return the sensitive codes as a sorted unique int64 array; they must be a non-empty subset
    of ``0..k-1`` given as integers."""
    if sensitive is None:
        raise ParameterError(f"{name} must be a non-empty set of codes in [0, {k - 1}], got None")
    try:
        vals = list(sensitive)
    except TypeError:
        raise ParameterError(f"{name} must be a set or sequence of integer codes, got {sensitive!r}") \
            from None
    if not vals:
        raise ParameterError(f"{name} must be a non-empty set of codes in [0, {k - 1}], got empty")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ParameterError(f"{name} must contain integer codes in [0, {k - 1}], got {v!r}")
    a = np.unique(np.asarray(vals, dtype=np.int64))
    if a[0] < 0 or a[-1] >= k:
        raise ParameterError(f"{name} must contain codes in [0, {k - 1}], got range [{a[0]}, {a[-1]}]")
    return a


def check_epsilon(epsilon) -> float:
    """Return ``epsilon`` as float if finite and > 0."""
    return check_positive("epsilon", epsilon)


def check_theta(theta) -> float:
    """Return ``theta`` as float if in (0, 1)."""
    return check_open_unit("theta", theta)


def check_codes(codes, k: int, name: str = "codes") -> np.ndarray:
    """Return ``codes`` as a 1-d int64 array with values in ``0..k-1``.

    Raises
    ------
    ParameterError
        If not 1-d, not integral, or out of range.
    """
    a = np.asarray(codes)
    if a.ndim == 0:
        a = a.reshape(1)
    if a.ndim != 1:
        raise ParameterError(f"{name} must be a 1-d array of integer codes, got shape {a.shape}")
    if a.size == 0:
        return np.zeros(0, np.int64)
    if a.dtype.kind not in "iu":
        if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
            a = a.astype(np.int64)
        else:
            raise ParameterError(f"{name} must be integer codes in [0, {k - 1}], got dtype {a.dtype}")
    a = a.astype(np.int64, copy=False)
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= k:
        raise ParameterError(f"{name} must lie in [0, {k - 1}], got range [{lo}, {hi}]")
    return a


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection of ``v`` (shape (k,)) onto the probability simplex.

    Sort-based algorithm (Held et al. 1974; Duchi et al. 2008), O(k log k). Source:
    docs/frequency.md §4 (``projected``).
    """
    v = np.asarray(v, dtype=np.float64)
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    idx = np.arange(1, v.size + 1)
    rho = np.nonzero(u - css / idx > 0)[0][-1]
    tau = css[rho] / (rho + 1.0)
    return np.maximum(v - tau, 0.0)


def threshold_estimate(p: np.ndarray, se: np.ndarray, alpha: float = THRESHOLD_ALPHA) -> np.ndarray:
    """docs/frequency.md §4 ``threshold`` ("emp+thr"): zero every estimate below z_{1−α/k}·SEⱼ; if the kept
    mass is < 1 give the remainder uniformly to the zeroed entries, otherwise rescale the kept
    entries to sum to 1. Returns a distribution of shape (k,)."""
    k = p.size
    z = float(ndtri(1.0 - alpha / k))
    keep = p >= z * se
    keep &= p > 0
    out = np.where(keep, p, 0.0)
    total = out.sum()
    if not keep.any():
        return np.full(k, 1.0 / k)
    if total < 1.0:
        nz = (~keep).sum()
        if nz:
            out[~keep] = (1.0 - total) / nz
        else:
            out /= total
    else:
        out /= total
    return out


class FrequencyMechanism:
    """Base of uRR, uRAP and their baselines: a mechanism whose expected output frequency of each
    output symbol/bit j is affine in the input distribution, ``m_j = a_j + b_j p_j``.

    Subclasses set ``k``, ``sensitive``, ``epsilon``, ``output_kind`` and implement
    ``_intercept_slope``, ``privatize``, ``counts`` and ``_em``.
    """

    kind = "base"
    output_kind = "codes"

    k: int
    sensitive: np.ndarray
    epsilon: float

    # -- subclass hooks ------------------------------------------------------------------------
    def _intercept_slope(self) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _cov_factor(self, m: np.ndarray, p: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _signature_params(self) -> str:
        return ""

    # -- shared helpers ------------------------------------------------------------------------
    @property
    def s(self) -> int:
        """Number of sensitive values."""
        return int(self.sensitive.size)

    @property
    def is_sensitive(self) -> np.ndarray:
        """Boolean mask of shape (k,), True on sensitive codes."""
        mask = np.zeros(self.k, dtype=bool)
        mask[self.sensitive] = True
        return mask

    @property
    def signature(self) -> str:
        """Identity string of the mechanism carried by its :class:`FrequencyCounts`."""
        h = hashlib.sha1(self.sensitive.astype("<i8").tobytes()).hexdigest()[:16]
        return f"{self.kind}|k={self.k}|s={self.s}:{h}|eps={self.epsilon!r}{self._signature_params()}"

    def expected_output(self, p) -> np.ndarray:
        """Expected output frequencies ``m = a + b ⊙ p``, shape (k,), for an input distribution
        ``p`` (shape (k,)). Source: docs/frequency.md §1."""
        p = self._check_p(p)
        a, b = self._intercept_slope()
        return a + b * p

    def _check_p(self, p) -> np.ndarray:
        a = np.asarray(p, dtype=np.float64).reshape(-1)
        if a.shape != (self.k,) or not np.all(np.isfinite(a)) or a.min() < 0 or abs(a.sum() - 1) > 1e-9:
            raise ParameterError(f"p must be a probability vector of shape ({self.k},) summing to 1")
        return a

    def expected_l2(self, p, n: int) -> float:
        """Expected squared l2 loss E‖p̂ − p‖₂² of the empirical estimator with ``n`` reports.

        ``Σⱼ vⱼ² mⱼ(1 − mⱼ)/n`` with vⱼ = 1/bⱼ the inverse slope (docs/frequency.md §5; paper §4.3).

        Parameters
        ----------
        p : array_like, shape (k,)
            True distribution.
        n : int
            Number of reports (> 0).
        """
        n = _check_n(n)
        m = self.expected_output(p)
        _, b = self._intercept_slope()
        return float(np.sum(m * (1 - m) / b**2) / n)

    def expected_l1(self, p, n: int) -> float:
        """Approximate expected l1 loss ``√(2/(nπ)) Σⱼ vⱼ √(mⱼ(1−mⱼ))`` (normal approximation;
        docs/frequency.md §5, paper §4.3)."""
        n = _check_n(n)
        m = self.expected_output(p)
        _, b = self._intercept_slope()
        return float(math.sqrt(2.0 / (n * math.pi)) * np.sum(np.sqrt(m * (1 - m)) / b))

    def check_counts(self, counts: FrequencyCounts) -> FrequencyCounts:
        """Raise ``ParameterError`` unless ``counts`` were produced by this mechanism's shape."""
        if not isinstance(counts, FrequencyCounts):
            raise ParameterError(f"counts must be FrequencyCounts, got {type(counts).__name__}")
        if counts.signature != self.signature or counts.counts.shape != (self.k,):
            raise ParameterError(
                f"counts of another mechanism: signature {counts.signature!r}, expected {self.signature!r}"
            )
        if counts.n <= 0:
            raise ParameterError("counts must hold at least one report (n > 0), got n=0")
        return counts

    def empty_counts(self) -> FrequencyCounts:
        """Counts of zero reports (the identity of ``merge``)."""
        return FrequencyCounts(self.signature, 0, np.zeros(self.k, np.int64))

    def _empirical(self, counts: FrequencyCounts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a, b = self._intercept_slope()
        m = counts.counts / counts.n
        p = (m - a) / b
        se = np.sqrt(m * (1 - m) / counts.n) / b
        return p, se, m

    def estimate(self, counts: FrequencyCounts, method: str = "empirical", level: float = 0.95,
                 **em_options) -> FrequencyEstimate:
        """Estimate the input distribution from counts.

        Parameters
        ----------
        counts : FrequencyCounts
            From :meth:`counts` of this mechanism (same signature), ``n > 0``.
        method : {"empirical", "threshold", "projected", "em"}
            ``empirical``: p̂ = (m̂ − a)/b, unbiased, may be negative (docs/frequency.md §4).
            ``threshold``: Bonferroni significance threshold z_{1−0.05/k}·SEⱼ (emp+thr, docs/frequency.md §4).
            ``projected``: Euclidean projection of the empirical estimate onto the simplex.
            ``em``: EM reconstruction (maximum likelihood; exact for uRR from counts, for uRAP from
            the sensitive-bit pattern counts, see :class:`FrequencyCounts`).
        level : float in (0, 1)
            Confidence level of the intervals.
        **em_options
            ``max_iter`` (default 2000) and ``tol`` (default 1e-7, l1 change between iterations) for ``em``.

        Returns
        -------
        FrequencyEstimate
            ``stderr`` is always the plug-in standard error of the *empirical* estimator,
            sqrt(m̂ⱼ(1−m̂ⱼ)/n)/bⱼ (binomial variance of the output frequency); for the other
            methods it is a conservative yardstick (they shrink), and ``ci_low/ci_high`` =
            p̂ ∓ z·stderr clipped to [0, 1].

        Raises
        ------
        ParameterError
            Unknown method, level outside (0, 1), or counts of another mechanism / with n = 0.
        """
        counts = self.check_counts(counts)
        level = check_open_unit("level", level)
        p_emp, se, _ = self._empirical(counts)
        if method == "empirical":
            p = p_emp
        elif method == "threshold":
            p = threshold_estimate(p_emp, se)
        elif method == "projected":
            p = project_simplex(p_emp)
        elif method == "em":
            p = self._em(counts, **em_options)
        else:
            raise ParameterError(f"method must be one of {METHODS}, got {method!r}")
        return make_estimate(p, se, counts.n, method, level)

    def _em(self, counts: FrequencyCounts, **kw) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        try:
            return f"{type(self).__name__}(k={self.k}, s={self.s}, epsilon={self.epsilon!r})"
        except Exception:  # pragma: no cover
            return f"{type(self).__name__}(<unprintable>)"


def make_estimate(p, se, n, method, level) -> FrequencyEstimate:
    """Assemble a :class:`FrequencyEstimate` with normal-approximation CIs (clipped unless
    ``method == "empirical"``). Raises ``ParameterError`` rather than returning NaN."""
    z = float(ndtri(0.5 + level / 2))
    lo, hi = p - z * se, p + z * se
    if method != "empirical":
        lo, hi = np.clip(lo, 0, 1), np.clip(hi, 0, 1)
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(se))):
        raise ParameterError("estimate is not finite; counts are inconsistent with the mechanism")
    return FrequencyEstimate(p, se, lo, hi, int(n), method)


def _check_n(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or int(n) < 1:
        raise ParameterError(f"n must be an integer >= 1, got {n!r}")
    return int(n)


def em_loop(update, p0: np.ndarray, max_iter: int = 2000, tol: float = 1e-7) -> np.ndarray:
    """Iterate ``p ← update(p)`` until the l1 change is < ``tol`` or ``max_iter`` iterations."""
    p = p0
    for it in range(int(max_iter)):
        new = update(p)
        new = np.maximum(new, 0.0)
        new /= new.sum()
        if np.abs(new - p).sum() < tol:
            logger.debug("EM converged after %d iterations", it + 1)
            return new
        p = new
    logger.info("EM stopped at max_iter=%d without reaching tol=%g", max_iter, tol)
    return p
