"""Wire codec: exact round trip (hypothesis), hostile bytes raise only DecodeError, typed reasons."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest import codec
from ingest.batch import ReportBatch
from ingest.codec import DECODE_REASONS, decode, encode
from ingest.errors import DecodeError, SchemaError
from ingest.schema import TelemetrySchema
from mechanisms.uldp import SparseBits

FAST = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


def make_schema(d: int, cats: list[tuple[str, int]]) -> TelemetrySchema:
    data: dict = {"name": "h", "categorical": []}
    if d:
        data["numeric"] = {"zero_prob": 0.1, "scale": 1.0,
                           "fields": [{"name": f"x{j}", "low": 0.0, "high": 1.0} for j in range(d)]}
    for i, (mech, k) in enumerate(cats):
        data["categorical"].append({"name": f"c{i}", "categories": [f"v{j}" for j in range(k)],
                                    "sensitive": ["v0"], "mechanism": mech, "epsilon": 1.0})
    return TelemetrySchema.from_dict(data)


@st.composite
def batches(draw):
    d = draw(st.integers(0, 6))
    cats = draw(st.lists(st.tuples(st.sampled_from(["urr", "urap"]),
                                   st.sampled_from([2, 3, 7, 8, 9, 16, 105, 255, 256, 257, 300])),
                         min_size=0 if d else 1, max_size=3))
    n = draw(st.integers(0, 50))
    schema = make_schema(d, cats)
    floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
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
    assert reason_of(raw[:4] + b"\x02" + raw[5:], known) == "unsupported_version"
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
