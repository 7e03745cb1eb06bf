"""Columnar wire format of a batch of reports (specification: docs/wire-format.md §1–§5).

``encode(batch, time_resolution=None) -> bytes`` (with ``encode_records`` for many records at
once, both from :mod:`ingest.client.encode`) and ``decode(data, known_schemas) -> ReportBatch``. All
integers are little-endian. Layout::

    header (32 bytes)  magic b"LDPR" | version u8 (1, or 2 with a TIME block) | flags u8 = 0
                       | reserved u16 = 0 | fingerprint 16 bytes | n u32 | d u16 | n_cat u16
    numeric block      n × d float64 (row-major, report after report)
    n_cat blocks       block header (12 bytes): kind u8 | width u8 | len_width u8 | reserved u8 = 0
                                                | k u32 | payload_len u32
                       then payload_len bytes:
                       kind 1 CODES  (uRR):  n codes as u{width}; k = 0 (domain from the schema)
                       kind 2 SPARSE (uRAP): n report lengths as u{len_width}, then the
                                             positions of the ones as u{width}
                       kind 3 BITMAP (uRAP): n × ceil(k/8) bytes, bit j of a report at byte j//8,
                                             bit j%8 (LSB first); padding bits 0
    TIME block         version 2 only (schemas with ``[event_time]``), after the categorical
                       blocks: block header kind u8 = 4 | width u8 | 0 | 0 | resolution_s u32
                       | payload_len u32 = 8 + n·width, then base u64 and n offsets u{width}:
                       report i's event time is (base + offset_i) · resolution_s Unix seconds

The decoder validates everything and raises a :class:`DecodeError` subclass whose ``reason``
class attribute is a stable metric label (see :data:`DECODE_REASONS`); the subclasses are defined
in :mod:`ingest.errors` and importable from here.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ingest.client.batch import ReportBatch, concat_batches
from ingest.client.bounds import check_non_sensitive, check_numeric_span, non_sensitive_mask
from ingest.client.encode import (
    BLOCK,
    FORMAT_VERSION,
    FORMAT_VERSION_TIME,
    HEADER,
    KIND_BITMAP,
    KIND_CODES,
    KIND_SPARSE,
    KIND_TIME,
    MAGIC,
    UINT,
    encode,
    encode_records,
)
from ingest.client.event_time import MAX_EVENT_TIME, iso_utc
from ingest.client.schema import TelemetrySchema
from ingest.errors import (
    BadLengthError,
    BadMagicError,
    DecodeError,
    ImpossibleReportError,
    InternalDecodeError,
    MalformedError,
    NonFiniteError,
    OutOfRangeError,
    SchemaMismatchError,
    TooLargeError,
    TrailingBytesError,
    TruncatedError,
    UnknownFingerprintError,
    UnsupportedVersionError,
)
from mechanisms.uldp.sparse import SparseBits

logger = logging.getLogger(__name__)

__all__ = [
    "DECODE_REASONS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_REPORTS",
    "FORMAT_VERSION",
    "FORMAT_VERSION_TIME",
    "KIND_TIME",
    "MAGIC",
    "BadLengthError",
    "BadMagicError",
    "ImpossibleReportError",
    "InternalDecodeError",
    "MalformedError",
    "NonFiniteError",
    "OutOfRangeError",
    "SchemaMismatchError",
    "TooLargeError",
    "TrailingBytesError",
    "TruncatedError",
    "UnknownFingerprintError",
    "UnsupportedVersionError",
    "decode",
    "decode_many",
    "encode",
    "encode_records",
    "peek_header",
]

DEFAULT_MAX_REPORTS = 1_000_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


_HEADER, _BLOCK, _UINT = HEADER, BLOCK, UINT
_F8 = np.dtype("<f8")
_U8 = struct.Struct("<Q")


#: Every ``reason`` label a decode failure can carry.
DECODE_REASONS = tuple(
    c.reason
    for c in (TruncatedError, BadMagicError, UnsupportedVersionError, UnknownFingerprintError,
              SchemaMismatchError, BadLengthError, NonFiniteError, OutOfRangeError,
              ImpossibleReportError, TooLargeError, TrailingBytesError, MalformedError,
              InternalDecodeError)
)


# ---------------------------------------------------------------------- decode
def peek_header(data: bytes) -> tuple[int, bytes, int]:
    """Read ``(version, fingerprint, n)`` from a record header without decoding the body.

    Raises
    ------
    TruncatedError, BadMagicError, MalformedError
    """
    mv = _as_view(data)
    if len(mv) < _HEADER.size:
        raise TruncatedError(f"record has {len(mv)} bytes, the header needs {_HEADER.size}")
    magic, version, _flags, _res, fp, n, _d, _nc = _HEADER.unpack_from(mv, 0)
    if magic != MAGIC:
        raise BadMagicError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    return int(version), bytes(fp), int(n)


def decode(data: bytes, known_schemas: Mapping[bytes, TelemetrySchema], *,
           max_reports: int = DEFAULT_MAX_REPORTS, max_bytes: int = DEFAULT_MAX_BYTES) -> ReportBatch:
    """Parse and validate one wire record.

    Parameters
    ----------
    data : bytes-like
        One record as produced by :func:`encode`.
    known_schemas : mapping fingerprint (16 bytes) → TelemetrySchema
        Records of any other schema are refused.
    max_reports : int
        Largest accepted report count (default 10⁶).
    max_bytes : int
        Largest accepted record size in bytes (default 64 MiB).

    Returns
    -------
    ReportBatch
        Numeric ``(n, d)`` float64; uRR columns int32 ``(n,)``; uRAP columns :class:`SparseBits`,
        keyed by the schema's field names in schema order; ``event_time`` int64 ``(n,)`` Unix
        seconds for a schema with ``[event_time]`` (a version-2 record), else None.

    Raises
    ------
    DecodeError
        Always a subclass with a ``reason`` label: ``truncated``, ``bad_magic``,
        ``unsupported_version``, ``unknown_fingerprint``, ``schema_mismatch``, ``bad_length``,
        ``non_finite``, ``out_of_range``, ``impossible_report`` (a uRAP report with more than
        one non-sensitive bit), ``too_large``, ``trailing_bytes``, ``malformed``
        (``internal_error`` would mean a decoder bug). Never any other exception.
    """
    try:
        return _materialize([_parse(data, known_schemas, max_reports, max_bytes)])
    except DecodeError:
        raise
    except Exception as exc:  # safety net: a wire record must never crash a worker
        raise _internal_error(exc) from exc


def _internal_error(exc: Exception) -> InternalDecodeError:
    """Log an unexpected exception of the decoder (a bug) and wrap it as a decode failure."""
    logger.exception("unexpected error while decoding a record")
    return InternalDecodeError(f"internal decoder error: {type(exc).__name__}: {exc}")


def decode_many(values: Sequence, known_schemas: Mapping[bytes, TelemetrySchema], *,
                max_reports: int = DEFAULT_MAX_REPORTS, max_bytes: int = DEFAULT_MAX_BYTES,
                ) -> tuple[ReportBatch | None, list[int | DecodeError]]:
    """Decode several records into one batch: the same validation as :func:`decode` per record,
    with the array work done once for all of them.

    First a compiled pass (``ingest.client.decode_kernel``) checks and decodes all records at once; it
    is taken when every record passes. Otherwise headers and block layouts are parsed record by
    record (scalar checks), the numeric blocks and each field's payloads are concatenated and
    decoded and validated together, and if that finds a bad value every record is decoded alone,
    so that each failure is attributed to its record with the same error :func:`decode` raises.

    Parameters
    ----------
    values : sequence of bytes-like
        Records (in stream order).
    known_schemas, max_reports, max_bytes
        As in :func:`decode`.

    Returns
    -------
    batch : ReportBatch or None
        The reports of every decodable record, in order (None if there is none), with the event
        times of all records in one ``event_time`` column for a schema with ``[event_time]``.
        One batch holds one schema: a record of another known schema than the first is refused
        with :class:`SchemaMismatchError`.
    results : list, one entry per record
        Its report count, or the :class:`DecodeError` that refused it (never raised).
    """
    fast = _decode_compiled(values, known_schemas, max_reports, max_bytes)
    if fast is not None:
        return fast
    results: list[int | DecodeError] = [0] * len(values)
    parsed: list[_Parsed] = []
    where: list[int] = []
    for i, v in enumerate(values):
        try:
            p = _parse(v, known_schemas, max_reports, max_bytes)
            if parsed and p.schema is not parsed[0].schema:
                raise SchemaMismatchError(
                    f"record of schema {p.schema.name!r} among records of {parsed[0].schema.name!r}")
        except DecodeError as exc:
            results[i] = exc
            continue
        except Exception as exc:  # safety net, as in decode()
            results[i] = _internal_error(exc)
            continue
        parsed.append(p)
        where.append(i)
    if not parsed:
        return None, results
    try:
        batch = _materialize(parsed)
    except Exception:  # a bad value or mixed layouts somewhere: attribute record by record
        good = []
        for i, p in zip(where, parsed, strict=True):
            try:
                good.append(_materialize([p]))
                results[i] = p.n
            except DecodeError as exc:
                results[i] = exc
            except Exception as exc:
                results[i] = _internal_error(exc)
        return (concat_batches(good) if good else None), results
    for i, p in zip(where, parsed, strict=True):
        results[i] = p.n
    return batch, results


def _decode_compiled(values: Sequence, known: Mapping[bytes, TelemetrySchema], max_reports: int,
                     max_bytes: int):
    """``decode_many``'s result from the compiled decoder, or None where it does not apply (no
    records, not all ``bytes``, first record of no known schema) or refuses any record."""
    if not values or not all(type(v) is bytes for v in values):
        return None
    first = values[0]
    schema = known.get(first[8:24]) if len(first) >= _HEADER.size else None
    if schema is None:
        return None
    try:  # numba (the server extra) loads on the first bulk decode, not with the codec
        from ingest.client import decode_kernel

        out = decode_kernel.decode_bulk(values, schema, max_reports, max_bytes)
    except Exception as exc:  # a bug; the Python decoder below still decodes (and names errors)
        logger.warning("compiled decoder failed (%s: %s); decoding in Python", type(exc).__name__, exc)
        return None
    if out is None:
        return None
    numeric, columns, ns, event_time = out
    cat: dict[str, np.ndarray | SparseBits] = {}
    for f, col in zip(schema.categorical, columns, strict=True):
        cat[f.name] = col if isinstance(col, np.ndarray) else _sparse(f.name, col[0], col[1], f.k)
    return ReportBatch(bytes(schema.fingerprint), numeric, cat, event_time), ns.tolist()


def _as_view(data) -> memoryview:
    if isinstance(data, bytes | bytearray | memoryview):
        mv = memoryview(data)
        return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
    raise MalformedError(f"record must be bytes, got {type(data).__name__}")


@dataclass(slots=True)
class _Parsed:
    """A record whose header and block layout passed the scalar checks (payloads not decoded)."""

    schema: TelemetrySchema
    fp: bytes
    n: int
    numeric: memoryview
    blocks: list  # per categorical field: ((kind, width, len_width, k), payload)
    time: tuple | None  # the TIME block: (width, resolution_s, payload), or None (version 1)


def _parse(data, known: Mapping[bytes, TelemetrySchema], max_reports: int, max_bytes: int) -> _Parsed:
    mv = _as_view(data)
    size = len(mv)
    if size > max_bytes:
        raise TooLargeError(f"record has {size} bytes, more than max_bytes={max_bytes}")
    if size < _HEADER.size:
        raise TruncatedError(f"record has {size} bytes, the header needs {_HEADER.size}")
    magic, version, flags, reserved, fp, n, d, n_cat = _HEADER.unpack_from(mv, 0)
    if magic != MAGIC:
        raise BadMagicError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version not in (FORMAT_VERSION, FORMAT_VERSION_TIME):
        raise UnsupportedVersionError(f"format version {version} not supported (this decoder reads "
                                      f"{FORMAT_VERSION} and {FORMAT_VERSION_TIME})")
    if flags or reserved:
        raise MalformedError(f"reserved header bits set: flags={flags}, reserved={reserved}")
    schema = known.get(bytes(fp))
    if schema is None:
        raise UnknownFingerprintError(f"unknown schema fingerprint {bytes(fp).hex()}")
    et = schema.event_time
    if (version == FORMAT_VERSION_TIME) != (et is not None):
        want, has = ((FORMAT_VERSION_TIME, "has") if et is not None else (FORMAT_VERSION, "has no"))
        raise SchemaMismatchError(f"record has format version {version}, schema {schema.name!r} {has} "
                                  f"[event_time] (version {want})")
    if n > max_reports:
        raise TooLargeError(f"record declares {n} reports, more than max_reports={max_reports}")
    if d != schema.dim:
        raise SchemaMismatchError(
            f"record has d={d} numeric columns, schema {schema.name!r} has {schema.dim}")
    if n_cat != len(schema.categorical):
        raise SchemaMismatchError(f"record has {n_cat} categorical blocks, schema {schema.name!r} has "
                                  f"{len(schema.categorical)}")
    pos = _HEADER.size
    nb = n * d * 8
    if pos + nb > size:
        raise TruncatedError(f"numeric block needs {nb} bytes, {size - pos} left")
    numeric = mv[pos:pos + nb]
    pos += nb
    blocks = []
    for f in schema.categorical:
        if pos + _BLOCK.size > size:
            raise TruncatedError(
                f"field {f.name!r}: block header needs {_BLOCK.size} bytes, {size - pos} left")
        kind, w, lw, res, k, plen = _BLOCK.unpack_from(mv, pos)
        pos += _BLOCK.size
        if res:
            raise MalformedError(f"field {f.name!r}: reserved block byte set")
        if pos + plen > size:
            raise TruncatedError(f"field {f.name!r}: payload needs {plen} bytes, {size - pos} left")
        payload = mv[pos:pos + plen]
        pos += plen
        if f.mechanism == "urr":
            if kind != KIND_CODES:
                raise SchemaMismatchError(f"field {f.name!r}: uRR field needs a codes block, got kind {kind}")
            if w not in _UINT or lw != 0 or k != 0:
                raise MalformedError(
                    f"field {f.name!r}: bad codes block header (width={w}, len_width={lw}, k={k})")
            if plen != n * w:
                raise BadLengthError(f"field {f.name!r}: codes block has {plen} bytes, expected {n * w}")
        else:
            if kind not in (KIND_SPARSE, KIND_BITMAP):
                raise SchemaMismatchError(f"field {f.name!r}: uRAP field needs a sparse or bitmap block, "
                                          f"got kind {kind}")
            if k != f.k:
                raise SchemaMismatchError(f"field {f.name!r}: block has k={k}, schema has k={f.k}")
            if kind == KIND_SPARSE:
                if w not in _UINT or lw not in _UINT:
                    raise MalformedError(
                        f"field {f.name!r}: bad sparse block widths (width={w}, len_width={lw})")
                head = n * lw
                if plen < head or (plen - head) % w:
                    raise BadLengthError(f"field {f.name!r}: sparse payload of {plen} bytes does not fit "
                                         f"{n} lengths of {lw} bytes plus whole {w}-byte indices")
            else:
                if w or lw:
                    raise MalformedError(f"field {f.name!r}: bad bitmap block header (width={w}, "
                                         f"len_width={lw})")
                rb = (k + 7) // 8
                if plen != n * rb:
                    raise BadLengthError(f"field {f.name!r}: bitmap has {plen} bytes, expected {n * rb}")
        blocks.append(((kind, w, lw, k), payload))
    time = None
    if et is not None:
        time, pos = _parse_time(mv, pos, n, et.resolution_s)
    if pos != size:
        raise TrailingBytesError(f"{size - pos} bytes after the last block")
    return _Parsed(schema, bytes(fp), int(n), numeric, blocks, time)


def _parse_time(mv: memoryview, pos: int, n: int, res_schema: int) -> tuple[tuple, int]:
    """The TIME block at ``mv[pos:]``: ``((width, resolution_s, payload), end position)``."""
    size = len(mv)
    if pos + _BLOCK.size > size:
        raise TruncatedError(f"time block: block header needs {_BLOCK.size} bytes, {size - pos} left")
    kind, w, r1, r2, res, plen = _BLOCK.unpack_from(mv, pos)
    pos += _BLOCK.size
    if kind != KIND_TIME or w not in _UINT or r1 or r2:
        raise MalformedError(f"time block: bad block header (kind={kind}, width={w}, "
                             f"reserved={r1},{r2}; expected kind {KIND_TIME}, width 1, 2 or 4)")
    if pos + plen > size:
        raise TruncatedError(f"time block: payload needs {plen} bytes, {size - pos} left")
    if res != res_schema:
        raise SchemaMismatchError(f"time block: resolution_s={res}, the schema's event_time.resolution "
                                  f"is {res_schema} s")
    if plen != 8 + n * w:
        raise BadLengthError(f"time block has {plen} bytes, expected {8 + n * w} (base and {n} "
                             f"offsets of {w} bytes)")
    return (w, res, mv[pos:pos + plen]), pos + plen


def _join(views: list, dtype) -> np.ndarray:
    """The concatenated contents of byte views as one array of ``dtype``."""
    if len(views) == 1:
        return np.frombuffer(views[0], dtype=dtype)
    return np.concatenate([np.frombuffer(v, dtype=dtype) for v in views])


def _materialize(parsed: list[_Parsed]) -> ReportBatch:
    """Decode and validate the payloads of parsed records of one schema into one batch."""
    p0 = parsed[0]
    schema = p0.schema
    d = schema.dim
    n = sum(p.n for p in parsed)
    numeric = _join([p.numeric for p in parsed], _F8).reshape(n, d)
    numeric = numeric.astype(np.float64, copy=len(parsed) == 1)
    if numeric.size and not np.isfinite(numeric).all():
        bad = np.argwhere(~np.isfinite(numeric))[0]
        raise NonFiniteError(
            f"numeric field {schema.numeric_names[bad[1]]!r}: non-finite value in report {bad[0]}")
    check_numeric_span(schema, numeric)
    cat: dict[str, np.ndarray | SparseBits] = {}
    for j, f in enumerate(schema.categorical):
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(parsed):
            groups.setdefault(p.blocks[j][0], []).append(i)
        if len(groups) == 1:
            cat[f.name] = _decode_group(f, j, parsed)
            continue
        # records encoded this field with different layouts (the encoder picks the smaller of
        # sparse and bitmap per record): decode each layout's records together, then put every
        # report back in record order
        ns = np.array([p.n for p in parsed], dtype=np.int64)
        starts = np.cumsum(ns) - ns
        parts = [(_positions(starts[m], ns[m]), _decode_group(f, j, [parsed[i] for i in m]))
                 for m in groups.values()]
        cat[f.name] = _interleave(parts, n)
    for f in schema.categorical:
        if f.mechanism == "urap":
            check_non_sensitive(f.name, cat[f.name], non_sensitive_mask(f.k, f.sensitive_codes))
    t = _decode_times(parsed) if schema.event_time is not None else None
    return ReportBatch(p0.fp, numeric, cat, t)


def _decode_times(parsed: list[_Parsed]) -> np.ndarray:
    """The event times (int64 Unix seconds) of the parsed records' TIME blocks, concatenated.

    Raises
    ------
    OutOfRangeError
        A record's base or an event time is after ``MAX_EVENT_TIME`` (2106-02-07T06:28:15Z).
    """
    out = []
    for p in parsed:
        w, res, payload = p.time
        base = _U8.unpack_from(payload, 0)[0]
        off = np.frombuffer(payload[8:], dtype=_UINT[w])
        top = base + (int(off.max()) if off.size else 0)
        if top * res > MAX_EVENT_TIME:
            raise OutOfRangeError(f"time block: event time {top * res} (base {base} + offset, times "
                                  f"{res} s) is after {iso_utc(MAX_EVENT_TIME)}")
        out.append((off.astype(np.int64) + base) * res)
    return out[0] if len(out) == 1 else np.concatenate(out)


def _decode_group(f, j: int, parsed: list[_Parsed]):
    """Field ``j`` (schema field ``f``) of records that share one block layout, as one column."""
    kind, w, lw, k = parsed[0].blocks[j][0]
    payloads = [p.blocks[j][1] for p in parsed]
    if kind == KIND_CODES:
        return _decode_codes(f.name, _join(payloads, _UINT[w]), f.k)
    if kind == KIND_SPARSE:
        lens = _join([pl[:p.n * lw] for pl, p in zip(payloads, parsed, strict=True)], _UINT[lw])
        idx = _join([pl[p.n * lw:] for pl, p in zip(payloads, parsed, strict=True)], _UINT[w])
        nnz = [(len(pl) - p.n * lw) // w for pl, p in zip(payloads, parsed, strict=True)]
        return _decode_sparse(f.name, lens, idx, [p.n for p in parsed], nnz, k)
    raw = _join(payloads, np.uint8).reshape(sum(p.n for p in parsed), (k + 7) // 8)
    return _decode_bitmap(f.name, raw, k)


def _positions(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` over ``zip(starts, lens)``."""
    total = int(lens.sum())
    first = np.cumsum(lens) - lens
    return np.repeat(starts - first, lens) + np.arange(total)


def _interleave(parts: list, n: int):
    """One column of ``n`` reports from ``(report positions, column)`` parts covering 0 … n−1."""
    if not isinstance(parts[0][1], SparseBits):
        out = np.empty(n, dtype=np.int32)
        for pos, col in parts:
            out[pos] = col
        return out
    lens = np.zeros(n, dtype=np.int64)
    for pos, col in parts:
        lens[pos] = np.diff(col.offsets)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    idx = np.empty(int(offsets[-1]), dtype=np.int32)
    for pos, col in parts:
        idx[_positions(offsets[pos], lens[pos])] = col.indices
    return _sparse("", idx, offsets, parts[0][1].k)


def _decode_codes(name: str, codes: np.ndarray, k_schema: int) -> np.ndarray:
    if codes.size and int(codes.max()) >= k_schema:
        raise OutOfRangeError(f"field {name!r}: code {int(codes.max())} >= k={k_schema}")
    return codes.astype(np.int32)


def _decode_sparse(name: str, lens: np.ndarray, idx: np.ndarray, ns: list[int], nnz: list[int],
                   k: int) -> SparseBits:
    n, total = lens.size, idx.size
    if n and int(lens.max()) > k:
        raise OutOfRangeError(f"field {name!r}: a report has {int(lens.max())} ones, more than k={k}")
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    if len(ns) == 1:
        if offsets[-1] != total:
            raise BadLengthError(
                f"field {name!r}: report lengths sum to {int(offsets[-1])}, payload holds {total}")
    else:  # every record's lengths must sum to its own number of positions
        ends = np.cumsum(ns)
        per_record = np.diff(offsets[np.concatenate([[0], ends])])
        if not np.array_equal(per_record, nnz):
            raise BadLengthError(f"field {name!r}: report lengths do not match the positions of a record")
    if total and int(idx.max()) >= k:
        raise OutOfRangeError(f"field {name!r}: bit position {int(idx.max())} >= k={k}")
    idx = idx.astype(np.int32)
    if total > 1:
        inc = idx[1:] > idx[:-1]
        # a non-increase is allowed only where a report starts: mark those positions
        starts = offsets[1:-1]
        inc[starts[(starts > 0) & (starts < total)] - 1] = True
        if not inc.all():
            raise MalformedError(f"field {name!r}: bit positions not strictly increasing within a report")
    return _sparse(name, idx, offsets, k)


def _decode_bitmap(name: str, raw: np.ndarray, k: int) -> SparseBits:
    n = raw.shape[0]
    bits = np.unpackbits(raw, axis=1, bitorder="little")
    if bits.shape[1] > k:
        if bits[:, k:].any():
            raise OutOfRangeError(f"field {name!r}: bitmap padding bit set (position >= k={k})")
        bits = np.ascontiguousarray(bits[:, :k])
    # positions of the ones in row-major order (1-d nonzero of a bool view: ~6x faster than 2-d)
    flat = np.flatnonzero(bits.view(np.bool_))
    rows, cols = np.divmod(flat, k)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=offsets[1:])
    return _sparse(name, cols.astype(np.int32), offsets, k)


def _sparse(name: str, idx: np.ndarray, offsets: np.ndarray, k: int) -> SparseBits:
    """Wrap arrays the decoder has already validated (offsets from a cumsum of lengths that sum
    to nnz, positions < k and strictly increasing within a report) without re-validating."""
    out = object.__new__(SparseBits)
    object.__setattr__(out, "indices", np.ascontiguousarray(idx, dtype=np.int32))
    object.__setattr__(out, "offsets", np.ascontiguousarray(offsets, dtype=np.int64))
    object.__setattr__(out, "k", int(k))
    return out
