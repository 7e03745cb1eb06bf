"""The in-memory unit of transport: a batch of privatized reports in columnar form (docs/schema.md §3)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ingest.errors import SchemaError
from mechanisms.uldp.sparse import SparseBits

CategoricalColumn = np.ndarray | SparseBits


@dataclass(frozen=True, eq=False)
class ReportBatch:
    """``n`` privatized reports of one schema, column by column.

    Attributes
    ----------
    fingerprint : bytes
        16-byte schema fingerprint (``TelemetrySchema.fingerprint``).
    numeric : ndarray of float64, shape (n, d)
        Released ZIL vectors ``X̃₁`` in original units, columns in the schema's numeric-field
        order; ``d == 0`` when the schema has no numeric field.
    categorical : mapping str → column
        One entry per categorical field, in schema order: uRR/RR fields hold an int32 array of
        shape (n,) with output codes; uRAP/RAPPOR fields hold a :class:`SparseBits` with ``n``
        reports. PUM fields use the extended domain (categories followed by the bot symbols).
    event_time : ndarray of int64, shape (n,), or None
        Event time of each report in Unix seconds (UTC), rounded down to the schema's
        resolution by the client (docs/windows.md §1); ``None`` when the schema has no time
        column (the worker then takes the Kafka record timestamps).

    Raises
    ------
    SchemaError
        If the columns do not all have ``n`` rows.
    """

    fingerprint: bytes
    numeric: np.ndarray
    categorical: Mapping[str, CategoricalColumn] = field(default_factory=dict)
    event_time: np.ndarray | None = None

    def __post_init__(self) -> None:
        num = np.asarray(self.numeric, dtype=np.float64)
        if num.ndim != 2:
            raise SchemaError(f"numeric must have shape (n, d), got {num.shape}")
        object.__setattr__(self, "numeric", num)
        n = num.shape[0]
        for name, col in self.categorical.items():
            m = col.n if isinstance(col, SparseBits) else np.shape(col)[0]
            if m != n:
                raise SchemaError(f"categorical field {name!r} has {m} reports, numeric block has {n}")
        if self.event_time is not None:
            t = np.asarray(self.event_time, dtype=np.int64)
            if t.shape != (n,):
                raise SchemaError(f"event_time must have shape ({n},), got {t.shape}")
            object.__setattr__(self, "event_time", t)

    @property
    def n(self) -> int:
        """Number of reports."""
        return int(self.numeric.shape[0])

    def __len__(self) -> int:
        return self.n

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReportBatch):
            return NotImplemented
        if self.fingerprint != other.fingerprint or list(self.categorical) != list(other.categorical):
            return False
        if not np.array_equal(self.numeric, other.numeric):
            return False
        if (self.event_time is None) != (other.event_time is None) or (
                self.event_time is not None and not np.array_equal(self.event_time, other.event_time)):
            return False
        for name, col in self.categorical.items():
            o = other.categorical[name]
            if isinstance(col, SparseBits) != isinstance(o, SparseBits):
                return False
            if not (col == o if isinstance(col, SparseBits) else np.array_equal(col, o)):
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"ReportBatch(n={self.n}, d={self.numeric.shape[1]}, "
            f"categorical={list(self.categorical)}, event_time={self.event_time is not None}, "
            f"fingerprint={self.fingerprint.hex()[:12]})"
        )


def slice_batch(batch: ReportBatch, start: int, stop: int) -> ReportBatch:
    """Reports ``start:stop`` of ``batch`` (same fingerprint and fields).

    Parameters
    ----------
    batch : ReportBatch
        ``n`` reports.
    start, stop : int
        ``0 <= start <= stop <= n``.

    Returns
    -------
    ReportBatch
        ``stop - start`` reports; numeric rows are a view when possible.
    """
    if not 0 <= start <= stop <= batch.n:
        raise SchemaError(f"slice must satisfy 0 <= start <= stop <= {batch.n}, got {start}:{stop}")
    cats = _SlicedColumns(batch.categorical, start, stop) if batch.categorical else {}
    t = None if batch.event_time is None else batch.event_time[start:stop]
    # a slice of a validated batch is valid: built without ``__post_init__``'s checks (a windowed
    # query slices every record into its panes)
    out = object.__new__(ReportBatch)
    for name, value in (("fingerprint", batch.fingerprint), ("numeric", batch.numeric[start:stop]),
                        ("categorical", cats), ("event_time", t)):
        object.__setattr__(out, name, value)
    return out


def with_event_time(batch: ReportBatch, event_time: np.ndarray) -> ReportBatch:
    """``batch`` with its event times set to ``event_time`` (int64 Unix seconds, shape (n,))."""
    return ReportBatch(batch.fingerprint, batch.numeric, batch.categorical, event_time)


class _SlicedColumns(Mapping):
    """The categorical columns of a slice, each cut from its parent's on first access (a windowed
    query slices every record into its panes and reads one column of each, if any)."""

    __slots__ = ("_cache", "_parent", "_start", "_stop")

    def __init__(self, parent: Mapping, start: int, stop: int) -> None:
        self._parent, self._start, self._stop = parent, start, stop
        self._cache: dict[str, CategoricalColumn] = {}

    def __getitem__(self, name: str) -> CategoricalColumn:
        col = self._cache.get(name)
        if col is None:
            col = self._parent[name]
            col = (_slice_bits(col, self._start, self._stop) if isinstance(col, SparseBits)
                   else np.asarray(col)[self._start:self._stop])
            self._cache[name] = col
        return col

    def __iter__(self):
        return iter(self._parent)

    def __len__(self) -> int:
        return len(self._parent)

    def __repr__(self) -> str:
        return f"{{{', '.join(repr(k) for k in self)}: sliced {self._start}:{self._stop}}}"


def _slice_bits(col: SparseBits, start: int, stop: int) -> SparseBits:
    """Contiguous reports ``start:stop`` of a validated SparseBits, without re-validation.

    A contiguous slice of a valid CSR structure is valid, and ``SparseBits.take`` + validation
    cost ~0.5 ms per call — the bottleneck of single-report records.
    """
    off = col.offsets[start : stop + 1]
    out = object.__new__(SparseBits)
    object.__setattr__(out, "indices", col.indices[off[0] : off[-1]])
    object.__setattr__(out, "offsets", off - off[0])
    object.__setattr__(out, "k", col.k)
    return out


def concat_batches(batches: list[ReportBatch]) -> ReportBatch:
    """Concatenate batches of one schema in order.

    Parameters
    ----------
    batches : list of ReportBatch
        At least one; all with the same fingerprint and categorical fields.

    Returns
    -------
    ReportBatch
        ``sum(b.n)`` reports.

    Raises
    ------
    SchemaError
        Empty list, or fingerprints / fields differ.
    """
    if not batches:
        raise SchemaError("concat_batches needs at least one batch")
    if len(batches) == 1:
        return batches[0]
    first = batches[0]
    for b in batches[1:]:
        if (b.fingerprint != first.fingerprint or b.numeric.shape[1] != first.numeric.shape[1]
                or list(b.categorical) != list(first.categorical)
                or (b.event_time is None) != (first.event_time is None)):
            raise SchemaError("cannot concatenate batches of different schemas")
    numeric = np.concatenate([b.numeric for b in batches], axis=0)
    cats: dict[str, CategoricalColumn] = {}
    for name, col in first.categorical.items():
        if isinstance(col, SparseBits):
            cats[name] = SparseBits.concat([b.categorical[name] for b in batches])
        else:
            cats[name] = np.concatenate([np.asarray(b.categorical[name]) for b in batches])
    t = None if first.event_time is None else np.concatenate([b.event_time for b in batches])
    return ReportBatch(first.fingerprint, numeric, cats, t)
