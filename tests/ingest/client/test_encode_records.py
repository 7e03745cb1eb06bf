"""encode_records: many records in one vectorized pass, each equal to encoding its slice alone."""

from __future__ import annotations

import pathlib
import struct

import numpy as np
import pytest

import ingest.client.encode as enc
from ingest.client.batch import ReportBatch, slice_batch
from ingest.client.codec import decode, encode, encode_records
from ingest.errors import SchemaError
from mechanisms.uldp.sparse import SparseBits

FP = bytes(range(16))
ROOT = pathlib.Path(__file__).resolve().parents[3]


def _random_batch(rng, n, *, k_bits, code_top, d, with_time):
    dens = rng.uniform(0.02, 0.9) if k_bits < 100 else rng.uniform(0.0, 0.05)
    rows = [np.flatnonzero(rng.uniform(size=k_bits) < dens) for _ in range(n)]
    off = np.r_[0, np.cumsum([r.size for r in rows])].astype(np.int64)
    idx = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    codes = rng.integers(0, code_top, n)
    if n:  # a few large codes, so that records differ in their code width
        codes[rng.uniform(size=n) < 0.05] = code_top - 1
    t = None
    if with_time:
        span = int(rng.choice([10, 1000, 100_000]))
        t = (1_000_000 + rng.integers(0, span, n)) * 60
    return ReportBatch(FP, rng.normal(size=(n, d)), {"a": codes, "b": SparseBits(idx, off, k_bits)}, t)


@pytest.mark.parametrize("seed", range(6))
def test_each_record_is_its_slice_encoded_alone(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        n = int(rng.integers(0, 60))
        b = _random_batch(rng, n, k_bits=int(rng.choice([3, 9, 64, 300, 70_000])),
                          code_top=int(rng.choice([5, 300, 70_000])), d=int(rng.integers(0, 3)),
                          with_time=bool(rng.integers(0, 2)))
        res = 60 if b.event_time is not None else None
        size = int(rng.integers(1, 14))
        records = encode_records(b, size, time_resolution=res)
        assert len(records) == -(-n // size)
        for i, rec in enumerate(records):
            part = slice_batch(b, i * size, min(n, (i + 1) * size))
            assert rec == encode(part, time_resolution=res)


def test_records_decode_to_their_slices():
    """Independent of the encoder: the decoder reads every record back as its slice (the flights
    schema: five numeric fields, uRR and uRAP fields, event times)."""
    from ingest.client.privatizer import Privatizer
    from ingest.client.schema import TelemetrySchema
    from tests.ingest.kafka.test_producer_unit import _events

    schema = TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")
    rng = np.random.default_rng(7)
    batch = Privatizer(schema, rng).privatize_batch(_events(schema, 1003, rng))
    res = schema.time_resolution_s
    for size in (1, 10, 1000, 5000):
        records = encode_records(batch, size, time_resolution=res)
        got = [decode(r, {schema.fingerprint: schema}) for r in records]
        assert sum(g.n for g in got) == batch.n
        for i, g in enumerate(got):
            assert g == slice_batch(batch, i * size, min(batch.n, (i + 1) * size))


def test_gathered_and_joined_assembly_agree(monkeypatch):
    rng = np.random.default_rng(11)
    b = _random_batch(rng, 500, k_bits=16, code_top=300, d=2, with_time=True)
    gathered = encode_records(b, 1, time_resolution=60)
    monkeypatch.setattr(enc, "_JOIN_ABOVE_BYTES", -1)
    joined = encode_records(b, 1, time_resolution=60)
    assert gathered == joined and len(joined) == 500


def test_a_record_built_by_hand():
    """Header, numeric block, a codes block and a sparse block, packed with struct directly."""
    num = np.array([[1.5], [-2.0], [0.25]])
    codes = np.array([2, 0, 300])
    bits = SparseBits(np.array([1, 0, 2]), np.array([0, 1, 1, 3]), 5)
    b = ReportBatch(FP, num, {"c": codes, "u": bits})
    records = encode_records(b, 2)
    r0 = (struct.pack("<4sBBH16sIHH", b"LDPR", 1, 0, 0, FP, 2, 1, 2) + struct.pack("<2d", 1.5, -2.0)
          + struct.pack("<BBBBII", 1, 1, 0, 0, 0, 2) + bytes([2, 0])
          # 2 reports, k = 5: sparse = 2·1 + 1·1 = 3 bytes, bitmap = 2·1 = 2 bytes → bitmap
          + struct.pack("<BBBBII", 3, 0, 0, 0, 5, 2) + bytes([0b10, 0]))
    r1 = (struct.pack("<4sBBH16sIHH", b"LDPR", 1, 0, 0, FP, 1, 1, 2) + struct.pack("<d", 0.25)
          + struct.pack("<BBBBII", 1, 2, 0, 0, 0, 2) + struct.pack("<H", 300)
          # 1 report with 2 ones: sparse = 1 + 2 = 3 bytes, bitmap = 1 byte → bitmap
          + struct.pack("<BBBBII", 3, 0, 0, 0, 5, 1) + bytes([0b101]))
    assert records == [r0, r1]


def test_bad_sizes_and_batches_are_schema_errors():
    b = ReportBatch(FP, np.zeros((3, 1)))
    for size in (0, -1, True, 1.5):
        with pytest.raises(SchemaError, match="size"):
            encode_records(b, size)
    with pytest.raises(SchemaError, match="finite"):
        encode_records(ReportBatch(FP, np.array([[0.0], [np.nan]])), 1)
    with pytest.raises(SchemaError, match=">= 0"):
        encode_records(ReportBatch(FP, np.zeros((2, 0)), {"c": np.array([1, -1])}), 1)
    with pytest.raises(SchemaError, match="ReportBatch"):
        encode_records(object(), 1)
    assert encode_records(ReportBatch(FP, np.zeros((0, 1))), 4) == []
