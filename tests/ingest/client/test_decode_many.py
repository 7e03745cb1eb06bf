"""``codec.decode_many`` (the worker's batched decoder) agrees with ``codec.decode`` record by
record: the same reports in the same order for every good record, the same error class and message
for every bad one, whatever good and hostile records are mixed in one call — through the compiled
decoder (``ingest.client.decode_kernel``, taken when it accepts every record) and through the Python
one (forced by switching the compiled one off)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.client import codec
from ingest.client.batch import concat_batches
from ingest.client.codec import DecodeError, SchemaMismatchError, decode, decode_many
from mechanisms.uldp import SparseBits
from tests.ingest.client.test_fuzz_codec import SEEDS, fz

KNOWN = fz.KNOWN
BY_SCHEMA: dict[bytes, list[bytes]] = {}
for _s in SEEDS:
    BY_SCHEMA.setdefault(codec.peek_header(_s)[1], []).append(_s)


def _assert_same_batch(a, b):
    assert a.fingerprint == b.fingerprint
    np.testing.assert_array_equal(a.numeric, b.numeric)
    assert (a.event_time is None) == (b.event_time is None)
    if a.event_time is not None:
        np.testing.assert_array_equal(a.event_time, b.event_time)
        assert a.event_time.dtype == np.int64
    assert list(a.categorical) == list(b.categorical)
    for name, col in a.categorical.items():
        other = b.categorical[name]
        if isinstance(col, SparseBits):
            np.testing.assert_array_equal(col.indices, other.indices)
            np.testing.assert_array_equal(col.offsets, other.offsets)
            assert col.k == other.k
        else:
            np.testing.assert_array_equal(col, other)


def _check(values):
    _check_one(values)
    with pytest.MonkeyPatch.context() as mp:  # the Python decoder alone
        mp.setattr(codec, "_decode_compiled", lambda *a: None)
        _check_one(values)


def _check_one(values):
    expected, good = [], []
    for v in values:
        try:
            b = decode(v, KNOWN)
        except DecodeError as exc:
            expected.append(exc)
        else:
            expected.append(b.n)
            good.append(b)
    batch, results = decode_many(values, KNOWN)
    assert len(results) == len(values)
    for got, exp in zip(results, expected, strict=True):
        if isinstance(exp, DecodeError):
            assert type(got) is type(exp) and str(got) == str(exp), (got, exp)
        else:
            assert got == exp
    if good:
        _assert_same_batch(batch, concat_batches(good))
    else:
        assert batch is None


@st.composite
def one_schema_records(draw):
    seeds = BY_SCHEMA[draw(st.sampled_from(sorted(BY_SCHEMA)))]
    out = []
    for _ in range(draw(st.integers(1, 6))):
        base = draw(st.sampled_from(seeds))
        if draw(st.booleans()):
            out.append(base)
            continue
        out.append(draw(fz.mutations([base], max_ops=1, max_chunk=8)))
    return out


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(one_schema_records())
def test_decode_many_agrees_with_decode_record_by_record(values):
    _check(values)


@pytest.mark.parametrize("fp", sorted(BY_SCHEMA), ids=lambda f: f.hex()[:8])
def test_all_good_records_take_the_compiled_path(fp, monkeypatch):
    seeds = BY_SCHEMA[fp] * 3
    good = [decode(v, KNOWN) for v in seeds]

    def python_path(*a):
        raise AssertionError("the compiled decoder refused a good record")

    monkeypatch.setattr(codec, "_parse", python_path)
    batch, results = decode_many(seeds, KNOWN)
    assert results == [b.n for b in good]
    _assert_same_batch(batch, concat_batches(good))


@pytest.mark.parametrize("fp", sorted(BY_SCHEMA), ids=lambda f: f.hex()[:8])
def test_all_good_records_take_the_combined_python_path(fp, monkeypatch):
    seeds = BY_SCHEMA[fp] * 3
    monkeypatch.setattr(codec, "_decode_compiled", lambda *a: None)
    calls = []
    real = codec._materialize
    monkeypatch.setattr(codec, "_materialize", lambda parsed: calls.append(len(parsed)) or real(parsed))
    _check_one(seeds)
    assert len(seeds) in calls  # one _materialize over every record (plus decode()'s own calls)


def test_a_bad_value_in_the_middle_is_attributed_to_its_record():
    seeds = BY_SCHEMA[sorted(BY_SCHEMA)[0]]
    good = seeds[1]
    data = bytearray(good)
    data[32:40] = np.array([np.nan]).tobytes()  # first numeric value of the first report
    values = [good, bytes(data), good]
    batch, results = decode_many(values, KNOWN)
    assert results[0] == results[2] == decode(good, KNOWN).n
    assert isinstance(results[1], codec.NonFiniteError)
    assert batch.n == 2 * results[0]


def test_records_of_a_second_schema_are_refused_in_one_call():
    (fa, fb) = sorted(BY_SCHEMA)[:2]
    a, b = BY_SCHEMA[fa][0], BY_SCHEMA[fb][0]
    batch, results = decode_many([a, b, a], KNOWN)
    assert isinstance(results[1], SchemaMismatchError)
    assert results[0] == results[2] == decode(a, KNOWN).n
    assert batch.fingerprint == fa


def test_mixed_block_layouts_are_combined_without_falling_back(monkeypatch):  # (Python path)
    """1-report records: the encoder picks sparse or bitmap per record, so one poll mixes
    layouts of a field; they are decoded together and put back in record order."""
    mixed = None
    for seeds in BY_SCHEMA.values():
        layouts = {tuple(b[0] for b in codec._parse(s, KNOWN, 10**6, 10**8).blocks) for s in seeds}
        if len(layouts) > 1:
            mixed = seeds
            break
    assert mixed is not None, "the seed corpus should hold records of one schema with different layouts"
    values = (mixed * 3)[::-1]
    monkeypatch.setattr(codec, "_decode_compiled", lambda *a: None)
    calls = []
    real = codec._materialize
    monkeypatch.setattr(codec, "_materialize", lambda parsed: calls.append(len(parsed)) or real(parsed))
    batch, results = decode_many(values, KNOWN)
    assert calls == [len(values)]  # one combined pass, no record-by-record fallback
    assert results == [decode(v, KNOWN).n for v in values]
    _assert_same_batch(batch, concat_batches([decode(v, KNOWN) for v in values]))


def test_a_failing_compiled_decoder_falls_back_to_python(monkeypatch, caplog):
    from ingest.client import decode_kernel

    def broken(*a):
        raise RuntimeError("kernel bug")

    seeds = BY_SCHEMA[sorted(BY_SCHEMA)[0]]
    want = concat_batches([decode(v, KNOWN) for v in seeds])
    monkeypatch.setattr(decode_kernel, "decode_bulk", broken)
    batch, results = decode_many(seeds, KNOWN)
    assert results == [decode(v, KNOWN).n for v in seeds]
    _assert_same_batch(batch, want)
    assert "compiled decoder failed (RuntimeError: kernel bug)" in caplog.text
