"""Encoding reports into wire records, one record or many at once (docs/wire-format.md §1–§5).

:func:`encode_records` cuts a batch into consecutive records of ``size`` reports and encodes all of
them in one vectorized pass: every column is converted once for the whole batch, and each record is
the join of its slices. Record ``i`` is byte for byte ``encode(slice_batch(batch, i·size,
(i+1)·size))`` — the per-record choices of the format (the narrowest code width, the smaller of the
sparse and bitmap layouts of a uRAP column, the event-time base and offset width) are made per
record, as :func:`encode` makes them. :func:`encode` is the one-record case.

The layout itself is specified in :mod:`ingest.client.codec`'s docstring and docs/wire-format.md.
"""

from __future__ import annotations

import struct

import numpy as np

from ingest.client.batch import ReportBatch
from ingest.client.event_time import MAX_EVENT_TIME, MAX_RESOLUTION_S
from ingest.errors import SchemaError
from mechanisms.uldp.sparse import SparseBits

__all__ = ["FORMAT_VERSION", "FORMAT_VERSION_TIME", "MAGIC", "encode", "encode_records"]

MAGIC = b"LDPR"
#: Header version of records of schemas without ``[event_time]``.
FORMAT_VERSION = 1
#: Header version of records of schemas with ``[event_time]`` (a TIME block after the others).
FORMAT_VERSION_TIME = 2
KIND_CODES, KIND_SPARSE, KIND_BITMAP, KIND_TIME = 1, 2, 3, 4

HEADER = struct.Struct("<4sBBH16sIHH")
BLOCK = struct.Struct("<BBBBII")
UINT = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}
#: :data:`BLOCK` as a numpy record, to build one block header per record at once.
_BLOCK_DTYPE = np.dtype([("kind", "u1"), ("w", "u1"), ("lw", "u1"), ("r", "u1"), ("k", "<u4"),
                         ("len", "<u4")])
_F8 = np.dtype("<f8")
#: Records longer than this on average are joined one by one instead of gathered at once.
_JOIN_ABOVE_BYTES = 2048


def width(max_value: int) -> int:
    """Bytes (1, 2 or 4) of the narrowest unsigned integer that holds ``max_value``."""
    return 1 if max_value < 1 << 8 else 2 if max_value < 1 << 16 else 4


def _widths(max_values: np.ndarray) -> np.ndarray:
    """:func:`width` of every entry of an integer array."""
    return np.where(max_values < 1 << 8, 1, np.where(max_values < 1 << 16, 2, 4)).astype(np.int64)


def encode(batch: ReportBatch, *, time_resolution: int | None = None) -> bytes:
    """Serialize a batch of reports into one wire record.

    Parameters
    ----------
    batch : ReportBatch
        ``n`` reports; numeric ``(n, d)`` finite float64; categorical int codes ≥ 0 (uRR) or
        :class:`SparseBits` (uRAP), in schema order; ``event_time`` (int64 Unix seconds) set
        exactly when the schema has ``[event_time]``.
    time_resolution : int, optional
        The schema's event-time resolution in seconds (``TelemetrySchema.time_resolution_s``);
        required when ``batch.event_time`` is set, refused otherwise.

    Returns
    -------
    bytes
        ``32 + 8·n·d + Σ blocks`` bytes (docs/wire-format.md): a version-1 record without event
        times, a version-2 record with a TIME block (12 + 8 + n·width bytes, width 1, 2 or 4: the
        smallest that holds the largest offset) with them. uRAP columns use the smaller of the
        sparse and bitmap layouts.

    Raises
    ------
    SchemaError
        If the batch cannot be represented: fingerprint not 16 bytes, non-finite numbers,
        negative codes, n ≥ 2³², d or the number of fields ≥ 2¹⁶; event times without
        ``time_resolution`` (or the reverse), a resolution outside [1 s, 7 d], event times that
        are not multiples of it or lie outside ``[0, MAX_EVENT_TIME]``.
    """
    return _Records(batch, max(1, _n(batch)), time_resolution).record(0)


def encode_records(batch: ReportBatch, size: int, *, time_resolution: int | None = None) -> list[bytes]:
    """Encode reports ``[i·size, (i+1)·size)`` of ``batch`` as record ``i``, for every ``i``.

    Parameters
    ----------
    batch : ReportBatch
        ``n`` reports (as for :func:`encode`).
    size : int
        Reports per record, ≥ 1; the last record holds the remaining ``n mod size`` reports
        when that is not 0.
    time_resolution : int, optional
        As for :func:`encode`.

    Returns
    -------
    list of bytes
        ``ceil(n / size)`` records (none for ``n == 0``); record ``i`` equals
        ``encode(slice_batch(batch, i·size, min(n, (i+1)·size)))`` byte for byte.

    Raises
    ------
    SchemaError
        As :func:`encode`, for any report of the batch; ``size`` < 1.
    """
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
        raise SchemaError(f"size must be an int >= 1 reports per record, got {size!r}")
    enc = _Records(batch, int(size), time_resolution)  # checks the batch even when it is empty
    return enc.all_records() if batch.n else []


def _ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(a, b)`` over ``zip(starts, stops)`` (int64)."""
    lens = stops - starts
    total = int(lens.sum())
    return np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(total, dtype=np.int64)


def _n(batch) -> int:
    if not isinstance(batch, ReportBatch):
        raise SchemaError(f"batch must be a ReportBatch, got {type(batch).__name__}")
    return batch.n


class _Records:
    """The per-record pieces of a batch cut into records of ``size`` reports.

    Each column becomes one or more *segments*: a byte buffer plus per-record start and length,
    so that record ``i`` is the join of ``buf[start[i] : start[i] + length[i]]`` over segments.
    """

    def __init__(self, batch: ReportBatch, size: int, res: int | None) -> None:
        n = _n(batch)
        fp = bytes(batch.fingerprint)
        if len(fp) != 16:
            raise SchemaError(f"fingerprint must be 16 bytes, got {len(fp)}")
        num = batch.numeric
        d = num.shape[1]
        if n >= 1 << 32 or d >= 1 << 16 or len(batch.categorical) >= 1 << 16:
            raise SchemaError(f"batch too large for the wire format: n={n}, d={d}")
        if num.size and not np.isfinite(num).all():
            raise SchemaError("numeric reports must be finite to be encoded")
        self.count = -(-n // size) if n else 1  # an empty batch still encodes as one record
        self.starts = np.arange(self.count, dtype=np.int64) * size
        self.stops = np.minimum(self.starts + size, n)
        self.lens = self.stops - self.starts
        self._segments: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._lists: list | None = None  # the segments as memoryviews and lists, for record()
        time = self._time_parts(batch.event_time, res)
        version = FORMAT_VERSION if time is None else FORMAT_VERSION_TIME
        hdr = np.zeros(self.count, dtype=[("magic", "S4"), ("version", "u1"), ("flags", "u1"),
                                          ("reserved", "<u2"), ("fp", "S16"), ("n", "<u4"),
                                          ("d", "<u2"), ("n_cat", "<u2")])
        hdr["magic"], hdr["version"], hdr["fp"], hdr["n"] = MAGIC, version, fp, self.lens
        hdr["d"], hdr["n_cat"] = d, len(batch.categorical)
        self._add(hdr.view(np.uint8), np.arange(self.count) * HEADER.size, np.full(self.count, HEADER.size))
        row = 8 * d
        self._add(np.ascontiguousarray(num, dtype=_F8), self.starts * row, self.lens * row)
        for name, col in batch.categorical.items():
            if isinstance(col, SparseBits):
                self._bits(col)
            else:
                self._codes(name, np.asarray(col))
        if time is not None:
            for part in time:
                self._add(*part)

    # ------------------------------------------------------------------ assembly
    def _add(self, buf, start, length) -> None:
        """Append a segment: ``buf`` (array or bytes) and per-record byte start and length."""
        data = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
        self._segments.append((data, np.asarray(start, dtype=np.int64), np.asarray(length, dtype=np.int64)))

    def _blocks(self, kind, w, lw, k, payload_len):
        """The segment of one 12-byte block header per record: kind, width, len_width, 0, then
        ``k`` (a TIME block's resolution) and the payload length (scalars or per-record arrays)."""
        hdr = np.zeros(self.count, dtype=_BLOCK_DTYPE)
        hdr["kind"], hdr["w"], hdr["lw"], hdr["k"], hdr["len"] = kind, w, lw, k, payload_len
        return hdr.view(np.uint8), np.arange(self.count) * BLOCK.size, np.full(self.count, BLOCK.size)

    def all_records(self) -> list[bytes]:
        """The bytes of every record.

        Small records are assembled all at once: each segment becomes a ``(count, longest)``
        byte matrix (a reshape when its records are equal and back to back, else one gather),
        the matrices are put side by side, and one boolean mask keeps each record's bytes in
        order. Large records are joined one by one (a few slices each; the copy dominates).
        """
        count, segs = self.count, self._segments
        sizes = np.sum([seg[2] for seg in segs], axis=0)
        if count < 8 or sizes.mean() > _JOIN_ABOVE_BYTES:
            return [self.record(i) for i in range(count)]
        blocks, masks = [], []
        for data, start, length in segs:
            longest = int(length.max())
            if longest == 0:
                continue
            if (data.size == count * longest and (length == longest).all()
                    and (start == np.arange(count) * longest).all()):
                blocks.append(data.reshape(count, longest))
                masks.append(None)
                continue
            idx = np.minimum(start[:, None] + np.arange(longest), max(data.size - 1, 0))
            blocks.append(data[idx] if data.size else np.zeros((count, longest), dtype=np.uint8))
            masks.append(np.arange(longest) < length[:, None])
        keep = np.hstack([np.ones(b.shape, dtype=bool) if m is None else m for b, m in zip(blocks, masks)])
        out = np.hstack(blocks)[keep].tobytes()
        ends = np.cumsum(sizes).tolist()
        return [out[a:b] for a, b in zip([0, *ends[:-1]], ends)]

    def record(self, i: int) -> bytes:
        """The bytes of record ``i``."""
        if self._lists is None:
            self._lists = [(memoryview(data), start.tolist(), length.tolist())
                           for data, start, length in self._segments]
        parts = []
        for view, start, length in self._lists:
            s = start[i]
            parts.append(view[s:s + length[i]])
        return b"".join(parts)

    # ------------------------------------------------------------------ columns
    def _width_segment(self, values: np.ndarray, w: np.ndarray, first: np.ndarray):
        """The payload segment of unsigned ``values`` (one entry per report): record ``i`` as
        ``u{w[i]}`` from report ``first[i]`` for ``lens[i]`` reports, from one buffer per width in use."""
        used = sorted(set(w.tolist()))
        if len(used) == 1:
            u = used[0]
            return values.astype(UINT[u], copy=False), first * u, self.lens * u
        bufs, base, off = [], {}, 0
        for u in used:
            b = values.astype(UINT[u]).view(np.uint8)
            base[u], off = off, off + b.size
            bufs.append(b)
        start = np.array([base[u] for u in w.tolist()], dtype=np.int64) + first * w
        return np.concatenate(bufs), start, self.lens * w

    def _reduce(self, values: np.ndarray, op) -> np.ndarray:
        """Per-record ``op`` (np.maximum / np.minimum) of a per-report array; 0 for empty records."""
        if values.size == 0:
            return np.zeros(self.count, dtype=np.int64)
        return op.reduceat(values, self.starts).astype(np.int64)

    def _codes(self, name: str, codes: np.ndarray) -> None:
        if codes.dtype.kind not in "iu":
            raise SchemaError(f"categorical field {name!r}: codes must be integers, got {codes.dtype}")
        if codes.size and int(codes.min()) < 0:
            raise SchemaError(f"categorical field {name!r}: codes must be >= 0")
        w = _widths(self._reduce(codes, np.maximum))
        self._add(*self._blocks(KIND_CODES, w, 0, 0, self.lens * w))
        self._add(*self._width_segment(codes, w, self.starts))

    def _bits(self, col: SparseBits) -> None:
        k, off = int(col.k), col.offsets
        w, lw, row_bytes = width(k - 1), width(k), (k + 7) // 8
        nnz = off[self.stops] - off[self.starts]
        sparse_size = self.lens * lw + nnz * w
        bitmap_size = self.lens * row_bytes
        bitmap = bitmap_size < sparse_size
        kind = np.where(bitmap, KIND_BITMAP, KIND_SPARSE)
        self._add(*self._blocks(kind, np.where(bitmap, 0, w), np.where(bitmap, 0, lw), k,
                                np.where(bitmap, bitmap_size, sparse_size)))
        sparse = ~bitmap
        if sparse.any():
            lens = np.diff(off).astype(UINT[lw])
            self._add(lens, self.starts * lw, np.where(sparse, self.lens * lw, 0))
            self._add(col.indices.astype(UINT[w], copy=False), off[self.starts] * w,
                      np.where(sparse, nnz * w, 0))
        if bitmap.any():
            if bitmap.all():
                n_rows, ones, idx = self.stops[-1], np.diff(off), col.indices
            else:
                rows = _ranges(self.starts[bitmap], self.stops[bitmap])
                n_rows, ones = rows.size, off[rows + 1] - off[rows]
                idx = col.indices[_ranges(off[rows], off[rows + 1])]
            # bit j of a row at byte j // 8, bit j % 8 (LSB first)
            dense = np.zeros(int(n_rows) * row_bytes * 8, dtype=bool)
            dense[np.repeat(np.arange(n_rows, dtype=np.int64) * (row_bytes * 8), ones) + idx] = True
            packed = np.packbits(dense, bitorder="little")
            first = np.zeros(self.count, dtype=np.int64)
            first[bitmap] = np.cumsum(np.r_[0, self.lens[bitmap][:-1]])
            self._add(packed, first * row_bytes, np.where(bitmap, bitmap_size, 0))

    def _time_parts(self, t: np.ndarray | None, res: int | None):
        """Check the event times; return the TIME block's segments (header, base, offsets), or
        None for a batch without event times."""
        if t is None:
            if res is not None:
                raise SchemaError(f"time_resolution={res!r} is given but the batch has no event_time "
                                  "(a schema with [event_time] privatizes its event times)")
            return None
        if res is None:
            raise SchemaError("the batch has event times: encode needs time_resolution (the schema's "
                              "event_time.resolution in seconds, TelemetrySchema.time_resolution_s)")
        if isinstance(res, bool) or not isinstance(res, int | np.integer) or not 1 <= res <= MAX_RESOLUTION_S:
            raise SchemaError(f"time_resolution must be an int of seconds in [1, {MAX_RESOLUTION_S}], "
                              f"got {res!r}")
        res = int(res)
        if t.size:
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi > MAX_EVENT_TIME:
                raise SchemaError(f"event_time must be Unix seconds in [0, {MAX_EVENT_TIME}], got "
                                  f"{lo if lo < 0 else hi}")
            off = t // res
            rem = t - off * res
            if rem.any():
                i = int(np.flatnonzero(rem)[0])
                raise SchemaError(f"event_time of report {i} ({int(t[i])}) is not a multiple of "
                                  f"time_resolution={res} s (the privatizer rounds event times down)")
        else:
            off = t.astype(np.int64)
        base = self._reduce(off, np.minimum)
        w = _widths(self._reduce(off, np.maximum) - base)
        rel = off - np.repeat(base, self.lens)
        return [self._blocks(KIND_TIME, w, 0, res, 8 + self.lens * w),
                (base.astype("<u8"), np.arange(self.count) * 8, np.full(self.count, 8)),
                self._width_segment(rel, w, self.starts)]
