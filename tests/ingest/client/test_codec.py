"""Wire codec: exact round trip (hypothesis), hostile bytes raise only DecodeError, typed reasons;
version 1 byte for byte as it always was, version 2 (the TIME block of schemas with
[event_time]) and each of its refusals."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.client import codec
from ingest.client.batch import ReportBatch
from ingest.client.bounds import NUMERIC_REPORT_SPAN
from ingest.client.codec import DECODE_REASONS, decode, encode
from ingest.client.event_time import MAX_EVENT_TIME
from ingest.client.schema import TelemetrySchema
from ingest.errors import DecodeError, SchemaError
from mechanisms.uldp import SparseBits

FAST = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


def make_schema(d: int, cats: list[tuple[str, int]], resolution: str | None = None) -> TelemetrySchema:
    data: dict = {"name": "h", "categorical": []}
    if resolution is not None:
        data["event_time"] = {"field": "t", "resolution": resolution}
    if d:
        data["numeric"] = {"zero_prob": 0.1, "scale": 1.0,
                           "fields": [{"name": f"x{j}", "low": 0.0, "high": 1.0} for j in range(d)]}
    for i, (mech, k) in enumerate(cats):
        # uRAP: all but the last category sensitive, so that any bit pattern is a possible report
        # (at most one non-sensitive bit; the refusal of others is tested on its own)
        sens = ["v0"] if mech == "urr" else [f"v{j}" for j in range(k - 1)]
        data["categorical"].append({"name": f"c{i}", "categories": [f"v{j}" for j in range(k)],
                                    "sensitive": sens, "mechanism": mech, "epsilon": 1.0})
    return TelemetrySchema.from_dict(data)


@st.composite
def batches(draw):
    d = draw(st.integers(0, 6))
    cats = draw(st.lists(st.tuples(st.sampled_from(["urr", "urap"]),
                                   st.sampled_from([2, 3, 7, 8, 9, 16, 105, 255, 256, 257, 300])),
                         min_size=0 if d else 1, max_size=3))
    n = draw(st.integers(0, 50))
    schema = make_schema(d, cats)
    # any float64 a report of this schema can carry: [low, high] = [0, 1] ± 1000 σ (σ = λ·range = 1)
    floats = st.floats(min_value=-NUMERIC_REPORT_SPAN, max_value=1 + NUMERIC_REPORT_SPAN, width=64)
    num = np.array(draw(st.lists(floats, min_size=n * d, max_size=n * d)), dtype=np.float64).reshape(n, d)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    cat = {}
    for i, (mech, k) in enumerate(cats):
        if mech == "urr":
            cat[f"c{i}"] = rng.integers(0, k, size=n).astype(np.int32)
        else:
            density = draw(st.sampled_from([0.0, 0.02, 0.3, 1.0]))
            cat[f"c{i}"] = SparseBits.from_dense(rng.random((n, k)) < density)
    return schema, ReportBatch(schema.fingerprint, num, cat)


@FAST
@given(batches())
def test_round_trip(sb):
    schema, batch = sb
    data = encode(batch)
    out = decode(data, {schema.fingerprint: schema})
    assert out == batch
    assert out.numeric.shape == batch.numeric.shape
    assert np.array_equal(out.numeric.view(np.uint64), batch.numeric.view(np.uint64))  # bit-exact
    for col in out.categorical.values():
        if not isinstance(col, SparseBits):
            assert col.dtype == np.int32


def _check_decode(data, known):
    try:
        out = decode(data, known)
    except DecodeError as exc:
        assert exc.reason in DECODE_REASONS and exc.reason != "internal_error", exc
        return None
    assert isinstance(out, ReportBatch)
    return out


@FAST
@given(batches(), st.data())
def test_truncated_and_bitflipped_raise_only_decode_error(sb, data):
    schema, batch = sb
    known = {schema.fingerprint: schema}
    raw = encode(batch)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DecodeError):
        decode(raw[:cut], known)
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] ^= 1 << data.draw(st.integers(0, 7))
    _check_decode(bytes(buf), known)
    extra = data.draw(st.binary(min_size=1, max_size=16))
    with pytest.raises(DecodeError):
        decode(raw + extra, known)


@FAST
@given(st.binary(max_size=300), st.booleans())
def test_random_bytes_raise_only_decode_error(blob, with_header):
    schema = make_schema(2, [("urr", 3), ("urap", 20)])
    known = {schema.fingerprint: schema}
    if with_header:  # get past magic/version/fingerprint checks to fuzz the body
        n = len(blob) % 7
        blob = struct.pack("<4sBBH16sIHH", b"LDPR", 1, 0, 0, schema.fingerprint, n, 2, 2) + blob
    _check_decode(blob, known)


# ------------------------------------------------------------------ specific failures
@pytest.fixture
def setup():
    schema = make_schema(2, [("urr", 3), ("urap", 20)])
    rng = np.random.default_rng(0)
    n = 10
    batch = ReportBatch(schema.fingerprint, rng.normal(size=(n, 2)),
                        {"c0": rng.integers(0, 3, n).astype(np.int32),
                         "c1": SparseBits.from_dense(rng.random((n, 20)) < 0.1)})
    return schema, {schema.fingerprint: schema}, batch, encode(batch)


def reason_of(data, known, **kw):
    with pytest.raises(DecodeError) as info:
        decode(data, known, **kw)
    return info.value.reason


def test_header_failures(setup):
    schema, known, batch, raw = setup
    assert reason_of(raw[:10], known) == "truncated"
    assert reason_of(b"XXXX" + raw[4:], known) == "bad_magic"
    assert reason_of(raw[:4] + b"\x03" + raw[5:], known) == "unsupported_version"
    assert reason_of(raw[:4] + b"\x00" + raw[5:], known) == "unsupported_version"
    # version 2 is the layout of schemas with [event_time]: refused for this one
    assert reason_of(raw[:4] + b"\x02" + raw[5:], known) == "schema_mismatch"
    assert reason_of(raw[:5] + b"\x01" + raw[6:], known) == "malformed"
    assert reason_of(raw, {}) == "unknown_fingerprint"
    other = make_schema(2, [("urr", 3), ("urap", 21)])
    assert reason_of(raw, {other.fingerprint: other}) == "unknown_fingerprint"
    assert reason_of(raw + b"\0", known) == "trailing_bytes"
    assert reason_of(raw, known, max_reports=9) == "too_large"
    assert reason_of(raw, known, max_bytes=len(raw) - 1) == "too_large"
    assert reason_of("not bytes", known) == "malformed"
    # a schema with another shape under the same fingerprint: schema_mismatch
    for d, cats in [(3, [("urr", 3), ("urap", 20)]), (2, [("urap", 3), ("urap", 20)]),
                    (2, [("urr", 3), ("urap", 21)]), (2, [("urr", 3)])]:
        assert reason_of(raw, {schema.fingerprint: make_schema(d, cats)}) == "schema_mismatch"
    assert decode(bytearray(raw), known) == batch
    assert decode(memoryview(raw), known) == batch
    assert codec.peek_header(raw) == (1, schema.fingerprint, 10)


def test_body_failures(setup):
    _, known, _, raw = setup
    buf = bytearray(raw)
    struct.pack_into("<d", buf, 32 + 8 * 3, float("nan"))
    with pytest.raises(codec.NonFiniteError, match="'x1'"):
        decode(bytes(buf), known)
    buf = bytearray(raw)
    struct.pack_into("<d", buf, 32, float("-inf"))
    assert reason_of(bytes(buf), known) == "non_finite"
    codes_at = 32 + 10 * 2 * 8 + 12
    buf = bytearray(raw)
    buf[codes_at + 4] = 3  # code 3 with k = 3
    with pytest.raises(codec.OutOfRangeError, match="'c0'"):
        decode(bytes(buf), known)
    # codes block claiming one byte less
    buf = bytearray(raw)
    plen_at = 32 + 160 + 8
    struct.pack_into("<I", buf, plen_at, 9)
    assert reason_of(bytes(buf), known) in ("bad_length", "trailing_bytes")
    buf = bytearray(raw)
    buf[32 + 160] = 2  # codes block announced as sparse for a uRR field
    assert reason_of(bytes(buf), known) == "schema_mismatch"


def _urap_only(n, k, density, rng):
    schema = make_schema(0, [("urap", k)])
    bits = SparseBits.from_dense(rng.random((n, k)) < density)
    batch = ReportBatch(schema.fingerprint, np.zeros((n, 0)), {"c0": bits})
    return schema, {schema.fingerprint: schema}, batch


def test_layout_choice_and_sparse_validation():
    rng = np.random.default_rng(1)
    # dense reports → bitmap; sparse → index lists; each no larger than the other layout
    schema, known, b = _urap_only(40, 16, 0.5, rng)
    raw = encode(b)
    assert raw[32] == codec.KIND_BITMAP and len(raw) == 32 + 12 + 40 * 2
    schema, known, b = _urap_only(40, 105, 0.02, rng)
    raw = encode(b)
    nnz = b.categorical["c0"].indices.size
    assert raw[32] == codec.KIND_SPARSE and len(raw) == 32 + 12 + 40 + nnz
    assert len(raw) - 44 < 40 * 14
    # unsorted positions inside one report
    b2 = ReportBatch(schema.fingerprint, np.zeros((1, 0)),
                     {"c0": SparseBits(np.array([3, 7], np.int32), np.array([0, 2]), 105)})
    buf = bytearray(encode(b2))
    assert buf[32] == codec.KIND_SPARSE
    buf[44 + 1], buf[44 + 2] = 7, 3
    assert reason_of(bytes(buf), known) == "malformed"
    buf[44 + 2] = 200  # position ≥ k
    assert reason_of(bytes(buf), known) == "out_of_range"
    buf[44 + 2] = 7
    buf[44] = 3  # lengths no longer sum to nnz
    assert reason_of(bytes(buf), known) == "bad_length"
    # bitmap padding bit set
    schema, known, b = _urap_only(3, 12, 0.9, rng)
    buf = bytearray(encode(b))
    assert buf[32] == codec.KIND_BITMAP
    buf[44 + 1] |= 0x80  # bit 15 ≥ k = 12
    assert reason_of(bytes(buf), known) == "out_of_range"


def test_codes_use_smallest_width():
    schema = make_schema(0, [("urr", 300)])
    b = ReportBatch(schema.fingerprint, np.zeros((5, 0)), {"c0": np.array([0, 1, 2, 3, 4], np.int32)})
    raw = encode(b)
    assert raw[33] == 1 and len(raw) == 32 + 12 + 5
    b = ReportBatch(schema.fingerprint, np.zeros((5, 0)), {"c0": np.array([0, 1, 2, 3, 299], np.int32)})
    raw = encode(b)
    assert raw[33] == 2 and len(raw) == 32 + 12 + 10
    assert decode(raw, {schema.fingerprint: schema}) == b


def test_encode_rejects_unrepresentable_batches():
    schema = make_schema(1, [("urr", 3)])
    with pytest.raises(SchemaError, match="finite"):
        encode(ReportBatch(schema.fingerprint, np.array([[np.nan]]), {"c0": np.array([0], np.int32)}))
    with pytest.raises(SchemaError, match="16 bytes"):
        encode(ReportBatch(b"short", np.zeros((1, 1)), {"c0": np.array([0], np.int32)}))
    with pytest.raises(SchemaError, match="'c0'"):
        encode(ReportBatch(schema.fingerprint, np.zeros((1, 1)), {"c0": np.array([-1], np.int32)}))
    with pytest.raises(SchemaError, match="ReportBatch"):
        encode(b"bytes")


def test_reasons_are_distinct_labels():
    assert len(set(DECODE_REASONS)) == len(DECODE_REASONS)
    assert all(r.replace("_", "").isalpha() and r.islower() for r in DECODE_REASONS)
    for name in codec.__all__:
        obj = getattr(codec, name)
        if isinstance(obj, type) and issubclass(obj, DecodeError):
            assert obj.reason in DECODE_REASONS


# ------------------------------------------------------------------ version 1 is unchanged
#: a fixed record of a schema without [event_time], as encoded before version 2 existed
V1_RECORD = ("4c44505201000000c31355b1e9a8a5e3d86309c5a931134b0200000001000200000000000000e03f000000000000"
             "f4bf01010000000000000200000002000300000004000000020000000900")


def test_version_1_records_are_byte_identical():
    s = TelemetrySchema.from_dict({
        "name": "v1", "numeric": {"zero_prob": 0.1, "scale": 1.0,
                                  "fields": [{"name": "x", "low": 0.0, "high": 1.0}]},
        "categorical": [{"name": "c", "categories": ["a", "b", "c"], "sensitive": ["a"],
                         "mechanism": "urr", "epsilon": 1.0},
                        {"name": "u", "categories": ["a", "b", "c", "d"], "sensitive": ["a"],
                         "mechanism": "urap", "epsilon": 1.0}]})
    b = ReportBatch(s.fingerprint, np.array([[0.5], [-1.25]]),
                    {"c": np.array([2, 0], np.int32),
                     "u": SparseBits.from_dense(np.array([[1, 0, 0, 1], [0, 0, 0, 0]], bool))})
    raw = encode(b)
    assert raw.hex() == V1_RECORD and raw[4] == codec.FORMAT_VERSION == 1
    assert encode(b, time_resolution=None) == raw
    out = decode(raw, {s.fingerprint: s})
    assert out == b and out.event_time is None


# ------------------------------------------------------------------ version 2: the TIME block
RESOLUTIONS = {"1s": 1, "1m": 60, "1h": 3600, "1d": 86400, "7d": 604800}


@st.composite
def timed_batches(draw):
    schema, plain = draw(batches())
    res_text = draw(st.sampled_from(sorted(RESOLUTIONS)))
    res = RESOLUTIONS[res_text]
    schema = TelemetrySchema.from_dict(schema.to_dict() | {"event_time": {"field": "t",
                                                                         "resolution": res_text}})
    top = MAX_EVENT_TIME // res
    span = draw(st.sampled_from([0, 255, 256, 65535, 65536, top]))
    base = draw(st.integers(0, top - min(span, top)))
    units = draw(st.lists(st.integers(base, base + min(span, top)), min_size=plain.n, max_size=plain.n))
    t = np.array(units, dtype=np.int64) * res
    return schema, ReportBatch(schema.fingerprint, plain.numeric, plain.categorical, t), res


@FAST
@given(timed_batches())
def test_version_2_round_trip(sbr):
    schema, batch, res = sbr
    raw = encode(batch, time_resolution=res)
    out = decode(raw, {schema.fingerprint: schema})
    assert out == batch and out.event_time.dtype == np.int64
    assert raw[4] == codec.FORMAT_VERSION_TIME == 2
    plain = ReportBatch(batch.fingerprint, batch.numeric, batch.categorical)
    units = batch.event_time // res
    span = int(units.max() - units.min()) if batch.n else 0
    w = 1 if span < 256 else 2 if span < 65536 else 4
    assert len(raw) == len(encode(plain)) + 12 + 8 + batch.n * w
    kind, width, r1, r2, res_wire, plen = struct.unpack_from("<BBBBII", raw, len(raw) - 20 - batch.n * w)
    assert (kind, width, r1, r2, res_wire, plen) == (codec.KIND_TIME, w, 0, 0, res, 8 + batch.n * w)
    base = struct.unpack_from("<Q", raw, len(raw) - 8 - batch.n * w)[0]
    assert base == (int(units.min()) if batch.n else 0)


T0 = 1357034400  # 2013-01-01T10:00:00Z


@pytest.fixture
def timed():
    schema = make_schema(1, [("urr", 3)], resolution="1h")
    n = 3
    t = np.array([T0, T0 + 7200, T0 + 3600])
    batch = ReportBatch(schema.fingerprint, np.full((n, 1), 0.5), {"c0": np.array([0, 1, 2], np.int32)}, t)
    raw = encode(batch, time_resolution=3600)
    assert raw[4] == 2 and len(raw) == 32 + 8 * n + 12 + n + 12 + 8 + n  # 1-byte offsets
    return schema, {schema.fingerprint: schema}, batch, raw, len(raw) - (12 + 8 + n)


def test_time_block_layout(timed):
    schema, known, batch, raw, at = timed
    assert raw[at:at + 12] == struct.pack("<BBBBII", 4, 1, 0, 0, 3600, 11)
    assert struct.unpack_from("<Q", raw, at + 12)[0] == T0 // 3600
    assert list(raw[at + 20:]) == [0, 2, 1]
    out = decode(raw, known)
    assert out.event_time.tolist() == [T0, T0 + 7200, T0 + 3600] and out == batch
    assert codec.peek_header(raw) == (2, schema.fingerprint, 3)


def test_time_block_refusals(timed):
    schema, known, _, raw, at = timed

    def patched(offset, fmt, value):
        buf = bytearray(raw)
        struct.pack_into(fmt, buf, offset, value)
        return bytes(buf)

    assert reason_of(patched(4, "<B", 1), known) == "schema_mismatch"  # version 1 for a timed schema
    assert reason_of(patched(4, "<B", 3), known) == "unsupported_version"
    plain = make_schema(1, [("urr", 3)])
    assert reason_of(raw, {schema.fingerprint: plain}) == "schema_mismatch"  # version 2, no [event_time]
    other = make_schema(1, [("urr", 3)], resolution="30m")
    assert reason_of(raw, {schema.fingerprint: other}) == "schema_mismatch"  # another resolution
    assert reason_of(patched(at, "<B", 1), known) == "malformed"  # kind
    for w in (0, 3, 8):
        assert reason_of(patched(at + 1, "<B", w), known) == "malformed"  # width
    assert reason_of(patched(at + 2, "<B", 1), known) == "malformed"  # reserved
    assert reason_of(patched(at + 3, "<B", 1), known) == "malformed"  # reserved
    assert reason_of(patched(at + 4, "<I", 1800), known) == "schema_mismatch"  # resolution_s
    assert reason_of(patched(at + 1, "<B", 2), known) == "bad_length"  # 2-byte offsets need 14 bytes
    assert reason_of(patched(at + 8, "<I", 10), known) == "bad_length"
    assert reason_of(patched(at + 8, "<I", 12), known) == "truncated"  # more than the record holds
    assert reason_of(raw[:at], known) == "truncated"  # no TIME block
    assert reason_of(raw[:at + 11], known) == "truncated"
    assert reason_of(raw[:-1], known) == "truncated"
    assert reason_of(raw + b"\0", known) == "trailing_bytes"
    # event times past MAX_EVENT_TIME: the base, or base + offset
    last_hour = MAX_EVENT_TIME // 3600
    assert reason_of(patched(at + 12, "<Q", last_hour + 1), known) == "out_of_range"
    assert reason_of(patched(at + 12, "<Q", 1 << 63), known) == "out_of_range"
    assert reason_of(patched(at + 12, "<Q", last_hour - 1), known) == "out_of_range"  # + offset 2
    with pytest.raises(codec.OutOfRangeError, match="after 2106-02-07T06:28:15Z"):
        decode(patched(at + 12, "<Q", last_hour - 1), known)
    edge = decode(patched(at + 12, "<Q", last_hour - 2), known)
    assert edge.event_time.max() == last_hour * 3600 <= MAX_EVENT_TIME


def test_offset_widths_and_empty_records():
    schema = make_schema(0, [("urr", 3)], resolution="1s")
    known = {schema.fingerprint: schema}
    for span, w in [(0, 1), (255, 1), (256, 2), (65535, 2), (65536, 4), (MAX_EVENT_TIME, 4)]:
        t = np.array([MAX_EVENT_TIME - span, MAX_EVENT_TIME])
        b = ReportBatch(schema.fingerprint, np.zeros((2, 0)), {"c0": np.array([1, 2], np.int32)}, t)
        raw = encode(b, time_resolution=1)
        assert raw[-(12 + 8 + 2 * w) + 1] == w and decode(raw, known) == b
    empty = ReportBatch(schema.fingerprint, np.zeros((0, 0)), {"c0": np.zeros(0, np.int32)},
                        np.zeros(0, np.int64))
    raw = encode(empty, time_resolution=1)
    assert raw[-20:] == struct.pack("<BBBBIIQ", 4, 1, 0, 0, 1, 8, 0)
    out = decode(raw, known)
    assert out.n == 0 and out.event_time.shape == (0,) and out.event_time.dtype == np.int64


def test_encode_refuses_inconsistent_event_times():
    schema = make_schema(1, [("urr", 3)], resolution="1h")
    cat = {"c0": np.array([0, 1], np.int32)}
    timed = ReportBatch(schema.fingerprint, np.zeros((2, 1)), cat, np.array([T0, T0 + 3600]))
    plain = ReportBatch(schema.fingerprint, np.zeros((2, 1)), cat)
    with pytest.raises(SchemaError, match="encode needs time_resolution"):
        encode(timed)
    with pytest.raises(SchemaError, match="time_resolution=3600 is given but the batch has no event_time"):
        encode(plain, time_resolution=3600)
    for res in (0, -1, 7 * 86400 + 1, True, 3600.0, "1h"):
        with pytest.raises(SchemaError, match=r"time_resolution must be an int of seconds in \[1, 604800\]"):
            encode(timed, time_resolution=res)
    with pytest.raises(SchemaError, match=r"event_time of report 1 \(1357038060\) is not a multiple of "
                                          r"time_resolution=3600 s"):
        encode(ReportBatch(schema.fingerprint, np.zeros((2, 1)), cat, np.array([T0, T0 + 3660])),
               time_resolution=3600)
    for bad in (-3600, (MAX_EVENT_TIME // 3600 + 1) * 3600):
        with pytest.raises(SchemaError, match=r"event_time must be Unix seconds in \[0, 4294967295\]"):
            encode(ReportBatch(schema.fingerprint, np.zeros((2, 1)), cat, np.array([T0, bad])),
                   time_resolution=3600)
    assert encode(timed, time_resolution=np.int64(3600)) == encode(timed, time_resolution=3600)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_decode_many_merges_event_times_of_records_with_different_bases(compiled, monkeypatch):
    schema = make_schema(1, [("urr", 3), ("urap", 12)], resolution="1h")
    known = {schema.fingerprint: schema}
    rng = np.random.default_rng(2)
    records, batches = [], []
    for base_hour, span in [(0, 3), (T0 // 3600, 200), (T0 // 3600 - 5000, 60000), (400000, 0),
                            (MAX_EVENT_TIME // 3600 - 70000, 70000)]:
        n = int(rng.integers(1, 9))
        t = (base_hour + rng.integers(0, span + 1, n)) * 3600
        b = ReportBatch(schema.fingerprint, rng.normal(size=(n, 1)),
                        {"c0": rng.integers(0, 3, n).astype(np.int32),
                         "c1": SparseBits.from_dense(rng.random((n, 12)) < 0.4)}, t)
        records.append(encode(b, time_resolution=3600))
        batches.append(b)
    if not compiled:
        monkeypatch.setattr(codec, "_decode_compiled", lambda *a: None)
    with pytest.MonkeyPatch.context() as mp:
        if compiled:
            mp.setattr(codec, "_parse", lambda *a: pytest.fail("the compiled decoder refused a record"))
        batch, results = codec.decode_many(records, known)
    assert results == [b.n for b in batches]
    want = np.concatenate([b.event_time for b in batches])
    assert batch.event_time.dtype == np.int64 and batch.event_time.tolist() == want.tolist()
    np.testing.assert_array_equal(batch.numeric, np.concatenate([b.numeric for b in batches]))
    # a bad record among them is attributed to itself, the others keep their event times
    bad = bytearray(records[1])
    struct.pack_into("<Q", bad, len(bad) - 8 - batches[1].n * 1, 1 << 40)
    batch, results = codec.decode_many([records[0], bytes(bad), records[2]], known)
    assert isinstance(results[1], codec.OutOfRangeError)
    assert batch.event_time.tolist() == [*batches[0].event_time, *batches[2].event_time]


def _urap_record(k: int, rows: list[list[int]]) -> tuple[TelemetrySchema, bytes]:
    """A one-field uRAP schema over ``k`` categories whose last three are non-sensitive, and the
    record of ``rows`` (each report's set bit positions)."""
    schema = TelemetrySchema.from_dict({"name": "u", "categorical": [{
        "name": "c", "categories": [f"v{j}" for j in range(k)],
        "sensitive": [f"v{j}" for j in range(k - 3)], "mechanism": "urap", "epsilon": 1.0}]})
    dense = np.zeros((len(rows), k), dtype=bool)
    for i, row in enumerate(rows):
        dense[i, row] = True
    batch = ReportBatch(schema.fingerprint, np.zeros((len(rows), 0)), {"c": SparseBits.from_dense(dense)})
    return schema, encode(batch)


# (k, the bits every report carries besides its non-sensitive ones, the layout encode picks)
LAYOUTS = [(300, [5], 2), (9, list(range(6)), 3)]


@pytest.mark.parametrize(("k", "base", "kind"), LAYOUTS, ids=["positions", "bitmap"])
@pytest.mark.parametrize("n_ns", [0, 1, 2, 3])
def test_a_urap_report_with_two_or_more_non_sensitive_bits_is_impossible(k, base, kind, n_ns):
    """uRAP sets at most one non-sensitive bit (docs/frequency.md §3): 0 or 1 decode; 2 or 3
    are refused as ``impossible_report`` by decode and by decode_many's compiled pass, in both
    wire layouts, and only that record is refused."""
    ns = list(range(k - 3, k))[:n_ns]
    schema, bad = _urap_record(k, [base, base + ns, base])
    _, good = _urap_record(k, [base, base + ns[:1]])
    assert bad[32] == good[32] == kind  # the block layout under test
    known = {schema.fingerprint: schema}
    batch, results = codec.decode_many([good, bad, good], known)
    if n_ns <= 1:
        col = decode(bad, known).categorical["c"]
        assert col.n == 3 and list(col.indices[col.offsets[1]:col.offsets[2]]) == base + ns
        assert results == [2, 3, 2] and batch.n == 7
        return
    with pytest.raises(codec.ImpossibleReportError, match=f"report 1 has {n_ns} non-sensitive bits"):
        decode(bad, known)
    assert codec.ImpossibleReportError.reason == "impossible_report" in DECODE_REASONS
    assert results[0] == results[2] == 2 and isinstance(results[1], codec.ImpossibleReportError)
    assert batch.n == 4
    good_rows = base + base + ns[:1]  # the two good records' reports, in order
    np.testing.assert_array_equal(batch.categorical["c"].indices, np.array(good_rows * 2))
