"""Compact representation of a batch of bit-vector reports (uRAP / RAPPOR outputs)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mechanisms.errors import ParameterError


@dataclass(frozen=True, eq=False)
class SparseBits:
    """A batch of ``n`` reports in ``{0,1}^k`` stored as the positions of their ones (CSR).

    Attributes
    ----------
    indices : ndarray of int32, shape (nnz,)
        Positions of the ones, report after report; within a report sorted ascending and unique.
    offsets : ndarray of int64, shape (n + 1,)
        Report ``i`` owns ``indices[offsets[i]:offsets[i+1]]``; ``offsets[0] == 0``.
    k : int
        Length of every bit vector (domain size).

    Raises
    ------
    ParameterError
        If the arrays are inconsistent (see :meth:`validate`).
    """

    indices: np.ndarray
    offsets: np.ndarray
    k: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", np.ascontiguousarray(self.indices, dtype=np.int32))
        object.__setattr__(self, "offsets", np.ascontiguousarray(self.offsets, dtype=np.int64))
        self.validate()

    @property
    def n(self) -> int:
        """Number of reports."""
        return int(self.offsets.size - 1)

    def __len__(self) -> int:
        return self.n

    def validate(self) -> None:
        """Check offsets are monotone from 0 to nnz and indices lie in ``[0, k)``, sorted and
        unique within each report."""
        k, idx, off = int(self.k), self.indices, self.offsets
        if k < 1:
            raise ParameterError(f"k must be >= 1, got {k}")
        if off.ndim != 1 or off.size < 1 or off[0] != 0 or off[-1] != idx.size:
            raise ParameterError("offsets must start at 0 and end at len(indices)")
        if np.any(np.diff(off) < 0):
            raise ParameterError("offsets must be non-decreasing")
        if idx.size:
            if idx.min() < 0 or idx.max() >= k:
                raise ParameterError(f"indices must lie in [0, {k}), got range [{idx.min()}, {idx.max()}]")
            # within a report indices must strictly increase
            inc = np.diff(idx) > 0
            starts = np.zeros(idx.size, dtype=bool)
            starts[off[1:-1][off[1:-1] < idx.size]] = True
            if not np.all(inc | starts[1:]):
                raise ParameterError("indices must be strictly increasing within each report")

    def to_dense(self) -> np.ndarray:
        """Return the reports as a dense ``(n, k)`` uint8 matrix (for small k and tests)."""
        out = np.zeros((self.n, self.k), dtype=np.uint8)
        rows = np.repeat(np.arange(self.n), np.diff(self.offsets))
        out[rows, self.indices] = 1
        return out

    @classmethod
    def from_dense(cls, bits) -> SparseBits:
        """Build from a dense ``(n, k)`` 0/1 matrix."""
        b = np.asarray(bits)
        if b.ndim != 2:
            raise ParameterError(f"bits must be a 2-d (n, k) array, got shape {b.shape}")
        rows, cols = np.nonzero(b)
        offsets = np.zeros(b.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=b.shape[0]), out=offsets[1:])
        return cls(cols.astype(np.int32), offsets, int(b.shape[1]))

    def column_counts(self) -> np.ndarray:
        """Number of reports with bit ``j`` set, shape (k,), int64."""
        return np.bincount(self.indices, minlength=self.k).astype(np.int64)

    def take(self, rows) -> SparseBits:
        """Return the sub-batch of the given report positions (in the given order)."""
        r = np.asarray(rows, dtype=np.int64)
        lens = np.diff(self.offsets)[r]
        new_off = np.zeros(r.size + 1, dtype=np.int64)
        np.cumsum(lens, out=new_off[1:])
        if new_off[-1] == 0:
            return SparseBits(np.zeros(0, np.int32), new_off, self.k)
        starts = self.offsets[r]
        pos = np.repeat(starts - new_off[:-1], lens) + np.arange(new_off[-1])
        return SparseBits(self.indices[pos], new_off, self.k)

    @staticmethod
    def concat(parts: list[SparseBits]) -> SparseBits:
        """Concatenate batches with the same ``k``."""
        if not parts:
            raise ParameterError("concat needs at least one SparseBits")
        k = parts[0].k
        if any(p.k != k for p in parts):
            raise ParameterError("all parts must have the same k")
        idx = np.concatenate([p.indices for p in parts])
        lens = np.concatenate([np.diff(p.offsets) for p in parts])
        off = np.zeros(lens.size + 1, dtype=np.int64)
        np.cumsum(lens, out=off[1:])
        return SparseBits(idx, off, k)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SparseBits):
            return NotImplemented
        return (
            self.k == other.k
            and np.array_equal(self.offsets, other.offsets)
            and np.array_equal(self.indices, other.indices)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SparseBits(n={self.n}, k={self.k}, nnz={self.indices.size})"
