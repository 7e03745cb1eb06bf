"""Compiled bulk decoder of wire records (numba, ``nogil``): the fast path of
:func:`ingest.client.codec.decode_many`.

A worker decodes every record of a poll at once. Parsing headers record by record in Python cost
≈ 20 µs per record, more than kafka-python spends fetching it; these two loops do the same checks
on the records' concatenated bytes:

* :func:`scan` — every scalar check of ``codec._parse`` (size limits, magic, version, reserved
  bits, fingerprint, report count, ``d``, block count, each block's kind, widths, ``k`` and
  length, the TIME block's header of a version-2 record, no trailing bytes) and the number of
  ones of every uRAP column;
* :func:`fill` — every value check of ``codec._materialize`` but the numeric span, checked in
  numpy after it (finite numbers, codes < k, sparse
  lengths ≤ k that add up to the positions, positions < k and strictly increasing within a
  report, bitmap padding bits 0, event times ≤ ``MAX_EVENT_TIME``) while writing the columns of
  one batch.

They only *accept* or *refuse* a record: any refusal sends the whole call back to the Python
decoder, which names the error of each record. The contract — accept exactly what
``codec.decode`` accepts, with the same reports — is tested in ``tests/ingest/client/test_decode_kernel.py``
(every single-byte change, deletion and insertion of the fuzz seeds) and through ``decode_many``
in ``tests/ingest/client/test_decode_many.py``. Layout: docs/wire-format.md §1–§5; the layout
constants are ``ingest.client.encode``'s, the report bounds ``ingest.client.bounds``'.
"""

from __future__ import annotations

import numpy as np

from ingest.client.bounds import non_sensitive_mask, numeric_outside
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
)
from ingest.client.event_time import MAX_EVENT_TIME
from ingest.jit import jit

__all__ = ["decode_bulk", "fill", "scan", "warm"]

_HEADER_SIZE = HEADER.size
_BLOCK_SIZE = BLOCK.size
_CODES, _SPARSE, _BITMAP, _TIME = KIND_CODES, KIND_SPARSE, KIND_BITMAP, KIND_TIME
_MAX_EVENT_TIME = MAX_EVENT_TIME
_MAGIC = np.frombuffer(MAGIC, dtype=np.uint8)
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)
#: Slots after each uRAP field's positions in ``fill``'s output: a bitmap byte writes all 8.
_SLACK = 8
#: Positions of the set bits of each byte value (LSB first), padded with 0.
_BITPOS = np.array([[b for b in range(8) if v >> b & 1] + [0] * (8 - bin(v).count("1"))
                    for v in range(256)], dtype=np.int64)


@jit(nogil=True)
def _uint(buf, p, w):  # pragma: no cover - compiled
    """Little-endian unsigned integer of ``w`` (1, 2 or 4) bytes at ``buf[p]``."""
    if w == 1:
        return np.int64(buf[p])
    if w == 2:
        return np.int64(buf[p]) | (np.int64(buf[p + 1]) << 8)
    return (np.int64(buf[p]) | (np.int64(buf[p + 1]) << 8) | (np.int64(buf[p + 2]) << 16)
            | (np.int64(buf[p + 3]) << 24))


@jit(nogil=True)
def _good_width(w):  # pragma: no cover - compiled
    return w == 1 or w == 2 or w == 4


@jit(nogil=True)
def scan(buf, starts, fp, magic, version, d, is_codes, ks, time_res, max_reports, max_bytes, popcount,
         ns, lay, nnz, tlay):  # pragma: no cover - compiled
    """Scalar checks of records ``r`` = ``buf[starts[r]:starts[r + 1]]``.

    Writes ``ns[r]`` (reports), ``lay[r, j] = (kind, width, len_width, payload offset, payload
    length)`` and ``nnz[r, j]`` (ones of a uRAP column) per categorical field ``j``, and for a
    schema with event time (``time_res`` > 0 s, ``version`` 2) ``tlay[r] = (width, payload
    offset)`` of the TIME block. Stops at the first refused record and returns 1; returns 0 when
    every record passes. ``is_codes[j]`` marks uRR fields (codes blocks), ``ks[j]`` is the field's
    k.
    """
    ncat = is_codes.shape[0]
    for r in range(starts.shape[0] - 1):
        a = starts[r]
        size = starts[r + 1] - a
        if size > max_bytes or size < _HEADER_SIZE:
            return 1
        ok = True
        for i in range(4):
            if buf[a + i] != magic[i]:
                ok = False
        if buf[a + 4] != version or buf[a + 5] != 0 or buf[a + 6] != 0 or buf[a + 7] != 0:
            ok = False
        for i in range(16):
            if buf[a + 8 + i] != fp[i]:
                ok = False
        n = _uint(buf, a + 24, 4)
        if not ok or n > max_reports or _uint(buf, a + 28, 2) != d or _uint(buf, a + 30, 2) != ncat:
            return 1
        pos = _HEADER_SIZE + n * d * 8
        if pos > size:
            return 1
        for j in range(ncat):
            if pos + _BLOCK_SIZE > size:
                ok = False
                break
            p = a + pos
            kind = np.int64(buf[p])
            w = np.int64(buf[p + 1])
            lw = np.int64(buf[p + 2])
            k = _uint(buf, p + 4, 4)
            plen = _uint(buf, p + 8, 4)
            pos += _BLOCK_SIZE
            if buf[p + 3] != 0 or pos + plen > size:
                ok = False
                break
            if is_codes[j]:
                if kind != _CODES or not _good_width(w) or lw != 0 or k != 0 or plen != n * w:
                    ok = False
                    break
                count = 0
            elif kind == _SPARSE:
                if k != ks[j] or not _good_width(w) or not _good_width(lw):
                    ok = False
                    break
                head = n * lw
                if plen < head or (plen - head) % w != 0:
                    ok = False
                    break
                count = (plen - head) // w
            elif kind == _BITMAP:
                if k != ks[j] or w != 0 or lw != 0 or plen != n * ((k + 7) // 8):
                    ok = False
                    break
                count = 0
                for i in range(a + pos, a + pos + plen):
                    count += popcount[buf[i]]
            else:
                ok = False
                break
            lay[r, j, 0] = kind
            lay[r, j, 1] = w
            lay[r, j, 2] = lw
            lay[r, j, 3] = a + pos
            lay[r, j, 4] = plen
            nnz[r, j] = count
            pos += plen
        if ok and time_res > 0:
            if pos + _BLOCK_SIZE > size:
                return 1
            p = a + pos
            w = np.int64(buf[p + 1])
            pos += _BLOCK_SIZE
            plen = _uint(buf, p + 8, 4)
            if (buf[p] != _TIME or not _good_width(w) or buf[p + 2] != 0 or buf[p + 3] != 0
                    or _uint(buf, p + 4, 4) != time_res or plen != 8 + n * w or pos + plen > size):
                return 1
            tlay[r, 0] = w
            tlay[r, 1] = a + pos
            pos += plen
        if not ok or pos != size:
            return 1
        ns[r] = n
    return 0


@jit(nogil=True)
def fill(buf, starts, ns, lay, d, is_codes, slot, ks, numeric, codes, offsets, indices, ibase,
         popcount, bitpos, max_positions, tlay, time_res, event_time, nsmask,
         nsbyte):  # pragma: no cover - compiled
    """Value checks and the columns of records that passed :func:`scan` (all of them).

    ``numeric (N, d)``, ``codes (n_codes_fields, N)`` int32, ``offsets (n_urap_fields, N + 1)``
    int64 and ``indices`` int32 (field ``s``'s positions from ``ibase[s]``, followed by 8 slots
    of slack that bitmap blocks may scribble on) are written in place; ``slot[j]`` is field
    ``j``'s row in ``codes`` or ``offsets``; ``max_positions`` bounds the positions of one sparse
    block. With ``time_res`` > 0, ``event_time (N,)`` int64 gets the Unix seconds of the TIME
    blocks at ``tlay``. Stops at the first refused record and returns 1; returns 0 when every
    record passes. ``nsmask[s, v]`` is 1 where position ``v`` of uRAP field ``s`` is
    non-sensitive and ``nsbyte[s, b, byte]`` counts the non-sensitive bits of ``byte`` at bitmap
    byte ``b``: a report with more than one non-sensitive bit is refused.
    """
    nurap = offsets.shape[0]
    cur = np.zeros(nurap, np.int64)  # positions written so far, per uRAP field
    # mark[t] == stamp: a report of the current sparse block starts at its position t
    mark = np.zeros(max_positions + 1, np.int64)
    stamp = np.int64(1)
    for s in range(nurap):
        offsets[s, 0] = 0
    row0 = 0
    for r in range(starts.shape[0] - 1):
        n = ns[r]
        ok = True
        if n * d:
            vals = buf[starts[r] + _HEADER_SIZE:starts[r] + _HEADER_SIZE + 8 * n * d].view(np.float64)
            for i in range(n):
                for c in range(d):
                    v = vals[i * d + c]
                    if not np.isfinite(v):
                        ok = False
                    numeric[row0 + i, c] = v
        for j in range(is_codes.shape[0]):
            kind = lay[r, j, 0]
            w = lay[r, j, 1]
            lw = lay[r, j, 2]
            p = lay[r, j, 3]
            k = ks[j]
            s = slot[j]
            if is_codes[j]:
                for i in range(n):
                    v = _uint(buf, p + i * w, w)
                    if v >= k:
                        ok = False
                    codes[s, row0 + i] = v
                continue
            base = ibase[s]
            c = cur[s]
            if kind == _SPARSE:
                # lengths first (offsets), then every position of the record in one flat loop:
                # no loop whose trip count is a report's length (its exit mispredicts per report)
                q0 = p + n * lw  # first position
                m = (lay[r, j, 4] - n * lw) // w  # positions in the record (scan: divisible)
                tot = 0
                for i in range(n):
                    length = _uint(buf, p + i * lw, lw)
                    if length > k:
                        ok = False
                    if tot <= m:  # (a lying length may overshoot: refused below)
                        mark[tot] = stamp  # position tot starts a report: no order check there
                    tot += length
                    offsets[s, row0 + i + 1] = c + tot
                if not ok or tot != m:
                    ok = False
                    break
                prev = np.int64(-1)
                nsc = np.int64(0)  # non-sensitive bits of the current report
                for t in range(m):
                    v = _uint(buf, q0 + t * w, w)
                    start = mark[t] == stamp
                    # v < k, and strictly above the previous position unless a report starts here
                    ok &= (v < k) & ((v > prev) | start)
                    if start:
                        nsc = 0
                    if v < k:
                        nsc += nsmask[s, v]
                    ok &= nsc <= 1
                    prev = v
                    indices[base + c + t] = v
                stamp += 1
                cur[s] = c + m
            else:
                rb = (k + 7) // 8
                for i in range(n):
                    q = p + i * rb
                    nsc = np.int64(0)
                    for b in range(rb):
                        v = buf[q + b]
                        nsc += nsbyte[s, b, v]
                        # all 8 slots written (the set bits' positions, then padding that the
                        # next byte overwrites; the field has 8 slots of slack): a fixed trip
                        # count instead of one that mispredicts per byte
                        for t in range(8):
                            indices[base + c + t] = 8 * b + bitpos[v, t]
                        c += popcount[v]
                    offsets[s, row0 + i + 1] = c
                    if nsc > 1:
                        ok = False  # more non-sensitive bits than uRAP sets
                    if rb * 8 > k and buf[q + rb - 1] >> (k - 8 * (rb - 1)):
                        ok = False  # a padding bit (position >= k) is set
                cur[s] = c
            if not ok:
                break
        if ok and time_res > 0:
            # base u64: an event time ≤ 2³² − 1 s needs base < 2³² (its high half 0)
            q = tlay[r, 1]
            w = tlay[r, 0]
            base = _uint(buf, q, 4)
            if _uint(buf, q + 4, 4) != 0:
                ok = False
            top = base
            for i in range(n):
                v = base + _uint(buf, q + 8 + i * w, w)
                top = max(top, v)
                event_time[row0 + i] = v * time_res  # < 2⁵³: base, offset < 2³², res ≤ 7 d
            if top * time_res > _MAX_EVENT_TIME:
                ok = False
        if not ok:
            return 1  # the caller falls back to the Python decoder for the whole call
        row0 += n
    return 0


def decode_bulk(values, schema, max_reports: int, max_bytes: int):
    """Decode records of one schema in one pass, or ``None`` if any record is refused.

    Parameters
    ----------
    values : list of bytes, length R
        Records.
    schema : TelemetrySchema
        The schema every record must carry (its fingerprint is checked).
    max_reports, max_bytes : int
        As in :func:`ingest.client.codec.decode`.

    Returns
    -------
    (numeric, columns, ns, event_time) or None
        ``numeric`` float64 ``(N, d)``; ``columns`` one entry per categorical field in schema
        order — int32 codes ``(N,)`` or ``(indices int32, offsets int64 (N + 1,))`` —, ``ns``
        int64 ``(R,)`` the reports per record and ``event_time`` int64 ``(N,)`` Unix seconds
        (None for a schema without ``[event_time]``). ``None`` when a record fails any check: the
        caller decodes record by record to name the error.
    """
    cats = schema.categorical
    ncat = len(cats)
    d = schema.dim
    is_codes = np.array([f.mechanism == "urr" for f in cats], dtype=np.bool_)
    ks = np.array([f.k for f in cats], dtype=np.int64)
    r_count = len(values)
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=r_count)
    starts = np.zeros(r_count + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    buf = np.frombuffer(b"".join(values), dtype=np.uint8)
    fp = np.frombuffer(bytes(schema.fingerprint), dtype=np.uint8)
    ns = np.empty(r_count, dtype=np.int64)
    lay = np.zeros((r_count, ncat, 5), dtype=np.int64)
    nnz = np.zeros((r_count, ncat), dtype=np.int64)
    tlay = np.zeros((r_count, 2), dtype=np.int64)
    time_res = schema.time_resolution_s or 0
    version = FORMAT_VERSION_TIME if time_res else FORMAT_VERSION
    if scan(buf, starts, fp, _MAGIC, version, d, is_codes, ks, time_res, max_reports, max_bytes,
            _POPCOUNT, ns, lay, nnz, tlay):
        return None
    n_total = int(ns.sum())
    slot = np.empty(ncat, dtype=np.int64)
    slot[is_codes] = np.arange(int(is_codes.sum()))
    slot[~is_codes] = np.arange(int((~is_codes).sum()))
    per_field = nnz[:, ~is_codes].sum(axis=0)
    ibase = np.zeros(per_field.size, dtype=np.int64)
    np.cumsum(per_field[:-1] + _SLACK, out=ibase[1:])
    numeric = np.empty((n_total, d), dtype=np.float64)
    codes = np.empty((int(is_codes.sum()), n_total), dtype=np.int32)
    offsets = np.empty((per_field.size, n_total + 1), dtype=np.int64)
    indices = np.empty(int(per_field.sum()) + _SLACK * per_field.size, dtype=np.int32)
    max_positions = int(nnz.max(initial=0))
    event_time = np.empty(n_total if time_res else 0, dtype=np.int64)
    nsmask, nsbyte = _non_sensitive_tables(schema)
    if fill(buf, starts, ns, lay, d, is_codes, slot, ks, numeric, codes, offsets, indices, ibase,
            _POPCOUNT, _BITPOS, max_positions, tlay, time_res, event_time, nsmask, nsbyte):
        return None
    if numeric.size and numeric_outside(schema, numeric).any():
        return None  # numbers no report takes (``bounds.check_numeric_span``): named in Python
    columns = []
    for j in range(ncat):
        s = int(slot[j])
        if is_codes[j]:
            columns.append(codes[s])
        else:
            columns.append((indices[ibase[s]:ibase[s] + per_field[s]], offsets[s]))
    return numeric, columns, ns, (event_time if time_res else None)


_TABLES: dict = {}


def _non_sensitive_tables(schema) -> tuple[np.ndarray, np.ndarray]:
    """``fill``'s ``nsmask`` (uint8 ``(n_urap, max k)``) and ``nsbyte`` (int64 ``(n_urap, max
    bytes, 256)``) of ``schema``'s uRAP fields, from :func:`ingest.client.bounds.non_sensitive_mask`
    (cached per fingerprint)."""
    key = bytes(schema.fingerprint)
    out = _TABLES.get(key)
    if out is None:
        masks = [non_sensitive_mask(f.k, f.sensitive_codes)
                 for f in schema.categorical if f.mechanism != "urr"]
        kmax = max((m.size for m in masks), default=1)
        rbmax = (kmax + 7) // 8
        nsmask = np.zeros((max(len(masks), 1), kmax), dtype=np.uint8)
        nsbyte = np.zeros((max(len(masks), 1), rbmax, 256), dtype=np.int64)
        bits = (np.arange(256)[:, None] >> np.arange(8)) & 1  # (256, 8): a byte's bits, LSB first
        for s, m in enumerate(masks):
            nsmask[s, :m.size] = m
            padded = np.zeros(rbmax * 8, dtype=np.int64)
            padded[:m.size] = m
            for b in range(rbmax):
                nsbyte[s, b] = bits @ padded[8 * b:8 * b + 8]
        out = _TABLES[key] = (nsmask, nsbyte)
    return out


def warm() -> None:
    """Compile or load the two loops now (once per process)."""
    buf = np.frombuffer(b"", np.uint8)  # read-only, as the records' bytes
    z = np.zeros(1, np.int64)
    b = np.zeros(1, np.bool_)
    lay = np.zeros((0, 1, 5), np.int64)
    tlay = np.zeros((0, 2), np.int64)
    scan(buf, z, _MAGIC, _MAGIC, 1, 0, b, z, 0, 1, 1, _POPCOUNT, z[:0], lay, np.zeros((0, 1), np.int64),
         tlay)
    fill(buf, z, z[:0], lay, 0, b, z, z, np.zeros((0, 0)), np.zeros((1, 0), np.int32),
         np.zeros((0, 1), np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64), _POPCOUNT, _BITPOS, 0,
         tlay, 0, np.zeros(0, np.int64), np.zeros((1, 1), np.uint8), np.zeros((1, 1, 256), np.int64))
