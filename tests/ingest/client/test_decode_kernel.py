"""The compiled bulk decoder (``ingest.client.decode_kernel``) accepts exactly the records
``codec.decode`` accepts, with the same reports: every single-byte change (7 values), deletion
(1, 2, 8 bytes) and insertion at every position of every seed record of the fuzz corpus (flights
with bitmap/codes/sparse blocks, uRR codes, uRAP sparse, a k = 300 bitmap with padding bits, and
version-2 records whose TIME blocks have 1-, 2- and 4-byte offsets), alone and after a good record
of the same schema."""

from __future__ import annotations

import numpy as np
import pytest

from ingest.client import codec, decode_kernel
from ingest.client.codec import DecodeError, decode
from mechanisms.uldp import SparseBits
from tests.ingest.client.test_fuzz_codec import SEEDS, fz


def _mutants(seed: bytes):
    for pos in range(len(seed)):
        b = seed[pos]
        for v in sorted({0, 1, 255, b ^ 1, b ^ 0x80, (b + 1) % 256, (b - 1) % 256} - {b}):
            yield seed[:pos] + bytes([v]) + seed[pos + 1:]
        for m in (1, 2, 8):
            yield seed[:pos] + seed[pos + m:]
        yield seed[:pos] + b"\x07" + seed[pos:]
    yield seed + b"\x00"


def _python(values, known):
    out = []
    for v in values:
        try:
            out.append(decode(v, known))
        except DecodeError:
            return None
    return out


def _same(got, want):
    numeric, columns, ns, event_time = got
    assert ns.tolist() == [b.n for b in want]
    if want[0].event_time is None:
        assert event_time is None
    else:
        np.testing.assert_array_equal(event_time, np.concatenate([b.event_time for b in want]))
    np.testing.assert_array_equal(numeric, np.concatenate([b.numeric for b in want]))
    for j, f in enumerate(want[0].categorical):
        cols = [b.categorical[f] for b in want]
        if isinstance(cols[0], SparseBits):
            idx, off = columns[j]
            np.testing.assert_array_equal(idx, np.concatenate([c.indices for c in cols]))
            lens = np.concatenate([np.diff(c.offsets) for c in cols])
            np.testing.assert_array_equal(np.diff(off), lens)
            assert off[0] == 0
        else:
            np.testing.assert_array_equal(columns[j], np.concatenate(cols))


@pytest.mark.parametrize("i", range(len(SEEDS)))
def test_compiled_decoder_accepts_exactly_what_decode_accepts(i):
    seed = SEEDS[i]
    fp = codec.peek_header(seed)[1]
    schema = fz.KNOWN[fp]
    known = {fp: schema}
    checked = refused = 0
    for m in _mutants(seed):
        for values in ([m], [seed, m]):
            want = _python(values, known)
            got = decode_kernel.decode_bulk(values, schema, codec.DEFAULT_MAX_REPORTS,
                                             codec.DEFAULT_MAX_BYTES)
            assert (got is None) == (want is None), (values, want)
            if want is not None:
                _same(got, want)
            checked += 1
            refused += want is None
    assert checked > 500 and 0 < refused < checked


def test_limits_are_enforced():
    seed = SEEDS[1]  # 7 flights reports
    fp = codec.peek_header(seed)[1]
    schema = fz.KNOWN[fp]
    assert decode_kernel.decode_bulk([seed], schema, 7, len(seed)) is not None
    assert decode_kernel.decode_bulk([seed], schema, 6, len(seed)) is None
    assert decode_kernel.decode_bulk([seed], schema, 7, len(seed) - 1) is None
    other = fz.KNOWN[codec.peek_header(SEEDS[2])[1]]
    assert decode_kernel.decode_bulk([seed], other, 7, len(seed)) is None  # foreign fingerprint


def test_version_2_seeds_are_in_the_contract():
    """The corpus holds version-2 records with every offset width, so the contract above covers
    the TIME block."""
    widths = set()
    for seed in SEEDS:
        if seed[4] == codec.FORMAT_VERSION_TIME:
            assert fz.KNOWN[codec.peek_header(seed)[1]].event_time is not None
            widths.add(codec._parse(seed, fz.KNOWN, 10**6, 10**8).time[0])
    assert widths == {1, 2, 4}


def test_event_time_limits_in_the_compiled_path():
    """A base whose high half is set, or one event time past MAX_EVENT_TIME, is refused by both."""
    import struct

    seed = next(s for s in SEEDS if s[4] == 2 and codec._parse(s, fz.KNOWN, 10**6, 10**8).time[0] == 4)
    schema = fz.KNOWN[codec.peek_header(seed)[1]]
    n = decode(seed, fz.KNOWN).n
    base_at = len(seed) - 4 * n - 8
    for base in (1 << 32, (1 << 32) // 3600 + 1, 1 << 63):
        bad = bytearray(seed)
        struct.pack_into("<Q", bad, base_at, base)
        assert _python([bytes(bad)], fz.KNOWN) is None
        assert decode_kernel.decode_bulk([bytes(bad)], schema, codec.DEFAULT_MAX_REPORTS,
                                          codec.DEFAULT_MAX_BYTES) is None
