"""Mergeable sufficient statistics and estimates of categorical frequency mechanisms
(docs/frequency.md §8)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np

from mechanisms.errors import ParameterError

logger = logging.getLogger(__name__)

#: default cap on the number of distinct sensitive-bit patterns kept by uRAP counts.
DEFAULT_MAX_PATTERNS = 65536


class FrequencyCounts:
    """Mergeable counts of the reports of one categorical mechanism.

    Produced by ``mechanism.counts(reports)``; combined with ``+``, ``+=`` or :meth:`merge`;
    consumed by ``mechanism.estimate(counts)``. Plain data: :meth:`to_dict` gives JSON-able
    builtins and :meth:`from_dict` restores it exactly.

    Parameters
    ----------
    signature : str
        Identity of the mechanism (kind, k, sensitive set, epsilon, theta). Counts with different
        signatures are never merged or estimated with the wrong mechanism.
    n : int
        Number of reports counted (>= 0).
    counts : array_like of int, shape (k_out,)
        uRR / RR: number of reports with output code ``y``. uRAP / RAPPOR: number of reports with
        bit ``j`` set.
    patterns : dict str → int, optional
        uRAP / RAPPOR only (what EM needs): among the *protected* reports (no non-sensitive bit
        set) the number of reports per distinct sensitive-bit pattern. The key is the hex string
        of ``numpy.packbits`` of the pattern over the sensitive bits in ascending code order
        (``ceil(s/8)`` bytes, so a pattern costs O(s/8) bytes whatever its number of ones).
    overflow_n : int
        Number of protected reports whose pattern was *not* kept because the number of distinct
        patterns exceeded ``max_patterns`` (least frequent patterns go first, ties by key).
    overflow_bits : array_like of int, shape (s,), optional
        Per sensitive bit, the number of overflowed protected reports with that bit set. EM uses
        these in a mean-field E-step for the overflowed reports (documented fallback: exact when
        ``overflow_n == 0``, an approximation otherwise).
    max_patterns : int
        Cap on ``len(patterns)``; 0 disables pattern tracking (all protected reports overflow).

    Raises
    ------
    ParameterError
        If ``n`` or a count is negative, or shapes are inconsistent.

    Notes
    -----
    Merging is exact (equal to counting the concatenated reports in one pass) as long as the
    number of distinct patterns stays within ``max_patterns``. Source: docs/frequency.md §8 (EM for
    uRAP keeps the counts of distinct sensitive-bit patterns: §4).
    """

    __slots__ = ("counts", "max_patterns", "n", "overflow_bits", "overflow_n", "patterns", "signature")

    def __init__(
        self,
        signature: str,
        n: int,
        counts,
        patterns: dict[str, int] | None = None,
        overflow_n: int = 0,
        overflow_bits=None,
        max_patterns: int = DEFAULT_MAX_PATTERNS,
    ) -> None:
        self.signature = str(signature)
        self.n = int(n)
        if self.n < 0:
            raise ParameterError(f"n must be >= 0, got {n}")
        c = np.array(counts, dtype=np.int64).reshape(-1)
        if c.size and c.min() < 0:
            raise ParameterError("counts must be >= 0")
        self.counts = c
        self.patterns = None if patterns is None else {str(a): int(b) for a, b in patterns.items()}
        if self.patterns and min(self.patterns.values()) <= 0:
            raise ParameterError("patterns counts must be > 0")
        self.overflow_n = int(overflow_n)
        if self.overflow_n < 0:
            raise ParameterError(f"overflow_n must be >= 0, got {overflow_n}")
        self.overflow_bits = None if overflow_bits is None else np.array(overflow_bits, np.int64).reshape(-1)
        self.max_patterns = int(max_patterns)
        if self.max_patterns < 0:
            raise ParameterError(f"max_patterns must be >= 0, got {max_patterns}")

    # -- merging -------------------------------------------------------------------------------
    def _check_same(self, other: FrequencyCounts) -> None:
        if not isinstance(other, FrequencyCounts):
            raise ParameterError(f"other must be FrequencyCounts, got {type(other).__name__}")
        if other.signature != self.signature or other.counts.shape != self.counts.shape:
            raise ParameterError(
                f"counts of another mechanism: signature {other.signature!r} != {self.signature!r}"
            )

    def merge(self, other: FrequencyCounts) -> FrequencyCounts:
        """Return the counts of the union of both report sets (neither operand is changed).

        Raises
        ------
        ParameterError
            If ``other`` comes from a mechanism with another signature or shape.
        """
        self._check_same(other)
        patterns = None
        ov_n = self.overflow_n + other.overflow_n
        ov_b = _add_opt(self.overflow_bits, other.overflow_bits)
        cap = min(self.max_patterns, other.max_patterns)
        if self.patterns is not None or other.patterns is not None:
            patterns = dict(self.patterns or {})
            for key, c in (other.patterns or {}).items():
                patterns[key] = patterns.get(key, 0) + c
            patterns, extra_n, extra_b = cap_patterns(patterns, cap, ov_b.size if ov_b is not None else 0)
            if extra_n:
                ov_n += extra_n
                ov_b = extra_b if ov_b is None else ov_b + extra_b
        return FrequencyCounts(self.signature, self.n + other.n, self.counts + other.counts,
                               patterns, ov_n, ov_b, cap)

    def copy(self) -> FrequencyCounts:
        """An independent copy (its arrays and patterns copied)."""
        out = object.__new__(FrequencyCounts)
        out.signature, out.n, out.max_patterns = self.signature, self.n, self.max_patterns
        out.counts, out.overflow_n = self.counts.copy(), self.overflow_n
        out.patterns = None if self.patterns is None else dict(self.patterns)
        out.overflow_bits = None if self.overflow_bits is None else self.overflow_bits.copy()
        return out

    def add_unpatterned(self, n: int, counts: np.ndarray, overflow_n: int, overflow_bits: np.ndarray) -> None:
        """In place: add ``n`` reports counted without patterns — the same result as
        ``self += FrequencyCounts(self.signature, n, counts, {}, overflow_n, overflow_bits, 0)``
        (all their protected reports overflow), without building that object (a windowed
        query adds many small batches).

        Parameters
        ----------
        n : int
            Reports (≥ 0).
        counts : ndarray of int64, shape (k_out,)
        overflow_n : int
            Their protected reports.
        overflow_bits : ndarray of int64, shape (s,)
            Per sensitive bit, the protected reports with it set.

        Raises
        ------
        ParameterError
            If a shape differs from this object's, or ``self`` keeps patterns.
        """
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != self.counts.shape or self.patterns:
            raise ParameterError("add_unpatterned needs counts of this shape and no kept patterns")
        self.counts = self.counts + counts
        self.n += int(n)
        self.overflow_n += int(overflow_n)
        ob = np.asarray(overflow_bits, dtype=np.int64)
        self.overflow_bits = ob.copy() if self.overflow_bits is None else self.overflow_bits + ob
        self.patterns = {}
        self.max_patterns = 0

    def __add__(self, other: FrequencyCounts) -> FrequencyCounts:
        if not isinstance(other, FrequencyCounts):
            return NotImplemented
        return self.merge(other)

    def __iadd__(self, other: FrequencyCounts) -> FrequencyCounts:
        if not isinstance(other, FrequencyCounts):
            return NotImplemented
        m = self.merge(other)
        for name in self.__slots__:
            setattr(self, name, getattr(m, name))
        return self

    # -- serialization -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain JSON-able representation (str, int, list, dict only)."""
        return {
            "signature": self.signature,
            "n": self.n,
            "counts": self.counts.tolist(),
            "patterns": None if self.patterns is None else dict(sorted(self.patterns.items())),
            "overflow_n": self.overflow_n,
            "overflow_bits": None if self.overflow_bits is None else self.overflow_bits.tolist(),
            "max_patterns": self.max_patterns,
        }

    @classmethod
    def from_dict(cls, data: dict) -> FrequencyCounts:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        ParameterError
            If a key is missing or a value is invalid.
        """
        try:
            return cls(data["signature"], data["n"], data["counts"], data.get("patterns"),
                       data.get("overflow_n", 0), data.get("overflow_bits"),
                       data.get("max_patterns", DEFAULT_MAX_PATTERNS))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ParameterError(f"data is not a FrequencyCounts dict: {exc!r}") from None

    def to_bytes(self) -> bytes:
        """UTF-8 JSON of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> FrequencyCounts:
        """Inverse of :meth:`to_bytes`. Raises ``ParameterError`` on malformed input."""
        try:
            data = json.loads(bytes(blob).decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise ParameterError(f"blob is not FrequencyCounts JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ParameterError("blob is not FrequencyCounts JSON: not an object")
        return cls.from_dict(data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FrequencyCounts):
            return NotImplemented
        return (
            self.signature == other.signature
            and self.n == other.n
            and np.array_equal(self.counts, other.counts)
            and (self.patterns or {}) == (other.patterns or {})
            and self.overflow_n == other.overflow_n
            and _opt_equal(self.overflow_bits, other.overflow_bits)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        try:
            npat = None if self.patterns is None else len(self.patterns)
            return (f"FrequencyCounts(signature={self.signature!r}, n={self.n}, "
                    f"size={self.counts.size}, patterns={npat}, overflow_n={self.overflow_n})")
        except Exception:  # pragma: no cover - repr must never raise
            return "FrequencyCounts(<unprintable>)"


def cap_patterns(patterns: dict[str, int], cap: int, s: int) -> tuple[dict[str, int], int, np.ndarray]:
    """Keep the ``cap`` most frequent patterns (ties broken by key); return the rest as overflow.

    Returns
    -------
    kept : dict str → int
    overflow_n : int
        Number of reports in the dropped patterns.
    overflow_bits : ndarray of int64, shape (s,)
        Per sensitive bit, the number of dropped reports with that bit set.
    """
    extra_b = np.zeros(s, np.int64)
    if len(patterns) <= cap:
        return patterns, 0, extra_b
    order = sorted(patterns.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = dict(order[:cap])
    extra_n = 0
    for key, c in order[cap:]:
        bits = np.unpackbits(np.frombuffer(bytes.fromhex(key), np.uint8))[:s].astype(np.int64)
        extra_b += c * bits
        extra_n += c
    logger.debug("pattern cap %d exceeded: %d reports moved to overflow", cap, extra_n)
    return kept, extra_n, extra_b


def _add_opt(a, b):
    if a is None:
        return None if b is None else b.copy()
    return a.copy() if b is None else a + b


def _opt_equal(a, b) -> bool:
    if a is None or b is None:
        return (a is None or not a.any()) and (b is None or not b.any())
    return np.array_equal(a, b)


@dataclass(frozen=True, eq=False)
class FrequencyEstimate:
    """An estimated categorical distribution with per-category uncertainty.

    Attributes
    ----------
    p : ndarray of float64, shape (k,)
        Estimated probabilities (``empirical``: unbiased, may be negative or sum != 1 for uRAP;
        other methods: a distribution).
    stderr : ndarray of float64, shape (k,)
        Plug-in standard error of the *empirical* estimator of each coordinate (see
        ``FrequencyMechanism.estimate``).
    ci_low, ci_high : ndarray of float64, shape (k,)
        Normal-approximation confidence bounds at the requested level (clipped to [0, 1] for every
        method except ``empirical``).
    n : int
        Number of reports.
    method : str
        Estimation method used.

    Source: docs/frequency.md §4–§5.
    """

    p: np.ndarray
    stderr: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    n: int
    method: str = "empirical"

    def to_dict(self) -> dict:
        """JSON-able dict of the fields."""
        return {"p": self.p.tolist(), "stderr": self.stderr.tolist(), "ci_low": self.ci_low.tolist(),
                "ci_high": self.ci_high.tolist(), "n": int(self.n), "method": self.method}

    def __repr__(self) -> str:
        try:
            return f"FrequencyEstimate(method={self.method!r}, n={self.n}, k={np.size(self.p)})"
        except Exception:  # pragma: no cover
            return "FrequencyEstimate(<unprintable>)"
