"""ReportProducer against an in-memory fake transport: record cutting, keys, delivery accounting."""

from __future__ import annotations

import pathlib
import threading

import numpy as np
import pytest

from ingest.client.batch import ReportBatch
from ingest.client.codec import decode
from ingest.client.privatizer import Privatizer
from ingest.client.schema import TelemetrySchema
from ingest.errors import ConfigError, ProducerError, SchemaError
from ingest.kafka.producer import ReportProducer, concat_batches, slice_batch
from ingest.kafka.transport import Transport

ROOT = pathlib.Path(__file__).resolve().parents[3]
CARRIERS = ["UA", "AA", "B6", "DL", "EV", "MQ", "US", "WN", "VX", "FL", "AS", "9E", "F9", "HA", "YV", "OO"]


@pytest.fixture(scope="module")
def schema():
    return TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")


def _events(schema, n, rng):
    cols = {}
    for name in schema.numeric_names:
        f = schema.field(name)
        cols[name] = rng.uniform(f.low, f.high, n)
    for name in schema.categorical_names:
        cats = list(schema.field(name).categories)
        cols[name] = np.array(cats, dtype=object)[rng.integers(0, len(cats), n)]
    if schema.event_time is not None:  # hours of 2013, in order
        cols[schema.event_time.field] = 1356998400 + 3600 * np.arange(n) // 10
    return cols


def _batch(schema, n, seed):
    rng = np.random.default_rng(seed)
    return Privatizer(schema, rng).privatize_batch(_events(schema, n, rng))


class FakeFuture:
    """kafka-python's ``FutureRecordMetadata`` as the producer reads it (two attributes)."""

    def __init__(self):
        self.is_done, self.exception = False, None

    def add_callback(self, fn):  # not used by ReportProducer (it reads is_done / exception)
        raise AssertionError("ReportProducer must not register callbacks")

    add_errback = add_callback

    def resolve(self, ok=True):
        self.exception = None if ok else RuntimeError("broker said no")
        self.is_done = True


class FakeTransport:
    """Records sends; resolves futures on flush: every ``fail_every``-th record fails."""

    def __init__(self, fail_every=0, auto=True, raise_on_send=False):
        self.sent, self.futures = [], []
        self.fail_every, self.auto, self.raise_on_send = fail_every, auto, raise_on_send
        self.closed = False
        self.lock = threading.Lock()

    def send(self, topic, value, key=None, partition=None):
        if self.raise_on_send:
            raise RuntimeError("buffer full")
        fut = FakeFuture()
        with self.lock:
            self.sent.append((topic, value, key))
            self.futures.append(fut)
        return fut

    def flush(self, timeout=None):
        if not self.auto:
            return
        with self.lock:
            todo = [(i, f) for i, f in enumerate(self.futures) if not f.is_done]
        for i, f in todo:
            f.resolve(ok=not (self.fail_every and (i + 1) % self.fail_every == 0))

    def close(self, timeout=None):
        self.closed = True


def _producer(schema, transport, **kw):
    kw.setdefault("linger_s", 0.0)
    return ReportProducer("127.0.0.1:1", "reports", schema, transport=transport, create_topic=False, **kw)


def test_fake_transport_is_a_transport():
    assert isinstance(FakeTransport(), Transport)


def test_slice_and_concat_roundtrip(schema):
    b = _batch(schema, 57, seed=1)
    parts = [slice_batch(b, 0, 10), slice_batch(b, 10, 10), slice_batch(b, 10, 57)]
    assert [p.n for p in parts] == [10, 0, 47]
    assert concat_batches(parts) == b
    other = _batch(schema, 3, seed=2)
    assert concat_batches([b, other]).n == 60
    with pytest.raises(SchemaError):
        concat_batches([])


@pytest.mark.parametrize("rpr", [1, 7, 100, 1000])
def test_records_cut_exactly_and_in_order(schema, rpr):
    batches = [_batch(schema, n, seed=i) for i, n in enumerate([3, 150, 1, 0, 64, 82])]
    total = sum(b.n for b in batches)
    t = FakeTransport()
    with _producer(schema, t, reports_per_record=rpr, linger_s=0.5) as p:
        for b in batches:
            p.send(b)
        # while lingering, only full records have gone out (checked on the last one)
        assert not t.sent or decode(t.sent[-1][1], {schema.fingerprint: schema}).n == rpr
    records = [decode(v, {schema.fingerprint: schema}) for _, v, _ in t.sent]
    sizes = [r.n for r in records]
    assert sum(sizes) == total
    assert all(s == rpr for s in sizes[:-1]) and 1 <= sizes[-1] <= rpr
    assert len(sizes) == -(-total // rpr)
    got = concat_batches(records)
    assert got == concat_batches([b for b in batches if b.n])
    assert p.reports_sent == total and p.records_sent == len(sizes) and p.reports_failed == 0
    assert t.closed


def test_keys_never_share_a_record(schema):
    t = FakeTransport()
    p = _producer(schema, t, reports_per_record=100, key="dev-a")
    p.send(_batch(schema, 30, 1))
    p.send(_batch(schema, 30, 2), key=b"dev-b")
    p.send(_batch(schema, 30, 3))
    p.close()
    keys = [k for _, _, k in t.sent]
    assert keys == [b"dev-a", b"dev-b", b"dev-a"]


def test_linger_sends_partial_record(schema):
    t = FakeTransport(auto=False)
    p = _producer(schema, t, reports_per_record=1000, linger_s=0.02)
    p.send(_batch(schema, 5, 1))
    ev = threading.Event()
    for _ in range(500):  # bounded wait for the linger thread; not a timing assertion
        if t.sent:
            break
        ev.wait(0.01)
    assert len(t.sent) == 1
    t.futures[0].resolve()
    p.close()
    assert p.reports_sent == 5


def test_failures_counted_exactly_and_raised(schema):
    t = FakeTransport(fail_every=3)
    p = _producer(schema, t, reports_per_record=10)
    p.send(_batch(schema, 95, 1))  # records of 10,10,...,5: #3, #6, #9 fail -> 30 reports
    with pytest.raises(ProducerError) as ei:
        p.flush()
    assert ei.value.undelivered == 30
    assert p.reports_sent == 65 and p.reports_failed == 30
    p.flush()  # nothing new failed
    with pytest.raises(ProducerError) as ei:
        p.close()
    assert ei.value.undelivered == 30
    p.close()  # idempotent


def test_unresolved_reports_are_not_sent(schema):
    t = FakeTransport(auto=False)
    p = _producer(schema, t, reports_per_record=4)
    p.send(_batch(schema, 10, 1))
    t.futures[0].resolve()
    with pytest.raises(ProducerError) as ei:
        p.flush(timeout=0)
    assert ei.value.undelivered == 6
    assert p.reports_sent == 4 and p.stats.reports_pending == 6


def test_synchronous_send_error_is_a_failure(schema):
    p = _producer(schema, FakeTransport(raise_on_send=True), reports_per_record=5)
    p.send(_batch(schema, 12, 1))
    with pytest.raises(ProducerError) as ei:
        p.close()
    assert ei.value.undelivered == 12 and p.reports_sent == 0
    assert "buffer full" in str(p.last_error)


def test_send_events_privatizes(schema):
    t = FakeTransport()
    p = ReportProducer("127.0.0.1:1", "r", schema, transport=t, create_topic=False, linger_s=0,
                       reports_per_record=50, rng=np.random.default_rng(5))
    cols = _events(schema, 120, np.random.default_rng(6))
    cols["arr_delay"][:3] = np.nan
    assert p.send_events(cols) == 117
    p.close()
    assert p.reports_sent == 117
    assert p.privatizer.stats.skipped["missing"] == 3


def test_rejects_foreign_batches(schema):
    p = _producer(schema, FakeTransport())
    b = _batch(schema, 3, 1)
    with pytest.raises(SchemaError, match="fingerprint"):
        p.send(type(b)(b"\x00" * 16, b.numeric, b.categorical))
    with pytest.raises(SchemaError, match="ReportBatch"):
        p.send(b.numeric)
    p.close()
    with pytest.raises(ProducerError, match="closed"):
        p.send(b)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"reports_per_record": 0}, "reports_per_record"),
        ({"reports_per_record": 2.5}, "reports_per_record"),
        ({"linger_s": -1}, "linger_s"),
        ({"partitions": 0}, "partitions"),
        ({"max_retries": -1}, "max_retries"),
        ({"retry_backoff_s": 0}, "retry_backoff_s"),
        ({"delivery_timeout_s": 0}, "delivery_timeout_s"),
        ({"key": 5}, "key"),
        ({"transport": object()}, "transport"),
    ],
)
def test_bad_parameters(schema, kwargs, match):
    kwargs.setdefault("transport", FakeTransport())
    with pytest.raises(ConfigError, match=match):
        ReportProducer("127.0.0.1:1", "r", schema, create_topic=False, **kwargs)


def test_bad_topic_and_schema(schema):
    with pytest.raises(ConfigError, match="topic"):
        ReportProducer("127.0.0.1:1", "", schema, transport=FakeTransport(), create_topic=False)
    with pytest.raises(ConfigError, match="schema"):
        ReportProducer("127.0.0.1:1", "r", object(), transport=FakeTransport(), create_topic=False)


def test_event_times_travel_in_version_2_records(schema):
    d = schema.to_dict()
    d.pop("event_time", None)
    plain = TelemetrySchema.from_dict(d)
    timed = TelemetrySchema.from_dict(d | {"event_time": {"field": "time_hour", "resolution": "1h"}})
    rng = np.random.default_rng(3)
    cols = _events(timed, 25, rng)
    cols["time_hour"] = np.array([f"2013-01-{1 + i % 3:02d}T{i % 24:02d}:{i:02d}:00Z" for i in range(25)],
                                 dtype=object)
    t = FakeTransport()
    untimed = _batch(plain, 1, seed=0)
    with _producer(timed, t, reports_per_record=10) as p:
        assert p.send_events(cols) == 25
        with pytest.raises(SchemaError, match="batch has no event times but the producer's schema has "
                                              r"\[event_time\]"):
            p.send(ReportBatch(timed.fingerprint, untimed.numeric, untimed.categorical))
    records = [decode(v, {timed.fingerprint: timed}) for _, v, _ in t.sent]
    assert [v[4] for _, v, _ in t.sent] == [2, 2, 2] and [r.n for r in records] == [10, 10, 5]
    got = np.concatenate([r.event_time for r in records])
    want = [1356998400 + (i % 3) * 86400 + (i % 24) * 3600 for i in range(25)]
    assert got.tolist() == want
    t2 = FakeTransport()
    with _producer(plain, t2, reports_per_record=10) as p:
        p.send(_batch(plain, 3, seed=4))
        with pytest.raises(SchemaError, match=r"batch has event times but the producer's schema has no"):
            b = _batch(plain, 1, seed=4)
            p.send(ReportBatch(plain.fingerprint, b.numeric, b.categorical, np.array([0])))
    assert t2.sent[0][1][4] == 1
