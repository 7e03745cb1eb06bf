"""Producer under broker outages (docs/reliability.md §6): bounded retries with exponential back-off, a clear
error, an exact count of reports not delivered, and never a report counted as sent that is not in
the topic. Each test runs its own EmbeddedBroker (never the session one)."""

from __future__ import annotations

import gc
import logging
import pathlib
import re
import threading
import time

import pytest

from ingest.client.schema import TelemetrySchema
from ingest.errors import ProducerError
from ingest.kafka.producer import ReportProducer, slice_batch
from ingest.local.broker import EmbeddedBroker
from ingest.local.processes import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]

# kafka-python 3.0.12 leaks a socket per refused (re)connection attempt to a dead broker
pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(scope="module")
def schema():
    return TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")


@pytest.fixture(scope="module")
def reports(schema):
    from ingest.client.codec import decode
    from ingest.kafka.producer import concat_batches
    from tests.integration.chaos_support import make_stream

    recs = make_stream(schema, n_records=60, per_record=100, seed=3)
    return concat_batches([decode(r, {schema.fingerprint: schema}) for r in recs])  # 6000 reports


def _count_in_topic(bootstrap: str, topic: str, schema, settle_s: float = 2.0) -> int:
    """Reports actually stored in ``topic`` (all partitions, from the beginning)."""
    from kafka import TopicPartition

    from ingest.client.codec import decode
    from ingest.kafka.clients import reader_client
    from ingest.kafka.settings import KafkaSettings

    c = reader_client(KafkaSettings(bootstrap_servers=bootstrap))
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        n, quiet_since = 0, time.monotonic()
        while time.monotonic() - quiet_since < settle_s:
            got = c.poll(timeout_ms=300)
            for recs in got.values():
                for r in recs:
                    n += decode(r.value, {schema.fingerprint: schema}).n
            if got:
                quiet_since = time.monotonic()
        return n
    finally:
        c.close()


def test_broker_down_at_start_bounded_backoff_clear_error(schema, caplog):
    port = free_port()
    with caplog.at_level(logging.WARNING, logger="ingest.kafka.producer"), \
            pytest.raises(ProducerError) as ei:
        ReportProducer(f"127.0.0.1:{port}", "reports", schema, max_retries=4, retry_backoff_s=0.05)
    msg = str(ei.value)
    assert f"127.0.0.1:{port}" in msg and "5 attempts" in msg and "'reports'" in msg
    assert ei.value.undelivered == 0
    delays = [float(m.group(1)) for r in caplog.records
              if (m := re.search(r"retry \d+/4 in ([0-9.]+) s", r.getMessage()))]
    assert delays == [0.05, 0.10, 0.20, 0.40]  # exponential back-off, bounded number of retries
    del ei
    gc.collect()


def test_broker_comes_up_during_retries(schema, reports):
    """The broker starts ~1 s after the producer: the retries connect and every report arrives."""
    port = free_port()
    broker = EmbeddedBroker(port=port, startup_timeout=30.0)
    starter = threading.Timer(1.0, broker.start)
    starter.start()
    try:
        p = ReportProducer(f"127.0.0.1:{port}", "late", schema, reports_per_record=100, partitions=2,
                           max_retries=10, retry_backoff_s=0.2, linger_s=0.01)
        starter.join()
        with p:
            p.send(reports)
        assert (p.reports_sent, p.reports_failed) == (reports.n, 0)
        assert _count_in_topic(broker.bootstrap_servers, "late", schema) == reports.n
    finally:
        starter.cancel()
        starter.join()
        broker.stop()
    gc.collect()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_broker_frozen_mid_stream_exact_accounting(request, schema, reports):
    """The broker is SIGSTOPped for longer than the delivery timeout while reports stream.

    Reports sent before and after the outage are acknowledged; those whose delivery timed out are
    counted as undelivered. Whatever the broker did with the timed-out requests once resumed, the
    producer never claims more than the topic holds (sent <= stored <= sent + undelivered), and
    sent + undelivered == queued.
    """
    with EmbeddedBroker(startup_timeout=30.0) as b:
        p = ReportProducer(b.bootstrap_servers, "outage", schema, reports_per_record=100, partitions=4,
                           linger_s=0.01, delivery_timeout_s=3.0)
        queued = 0
        for i in range(20):  # 2000 reports before the outage
            p.send(slice_batch(reports, i * 100, (i + 1) * 100))
            queued += 100
        p.flush()
        assert p.reports_sent == 2000
        b.freeze()
        try:
            for i in range(20, 40):  # 2000 reports into the frozen broker
                p.send(slice_batch(reports, i * 100, (i + 1) * 100))
                queued += 100
            with pytest.raises(ProducerError) as ei:
                p.flush()
            undelivered_outage = ei.value.undelivered
        finally:
            b.thaw()
        assert 0 < undelivered_outage <= 2000
        for i in range(40, 60):  # 2000 reports after the outage
            p.send(slice_batch(reports, i * 100, (i + 1) * 100))
            queued += 100
        with pytest.raises(ProducerError) as ei:
            p.close()
        stored = _count_in_topic(b.bootstrap_servers, "outage", schema)
    # exact accounting: every queued report is either acknowledged or counted as undelivered
    assert p.reports_sent + ei.value.undelivered == queued == reports.n
    assert ei.value.undelivered >= undelivered_outage
    assert p.reports_sent >= 2000  # everything before the outage was delivered
    # after SIGCONT kafka-python usually resumes (then all 2000 later reports are acknowledged),
    # but its client can stay wedged on the connection it had to the frozen broker; then close()
    # gives up after its bound and counts those reports as undelivered instead of hanging
    assert stored >= p.reports_sent  # nothing reported as sent that was not
    # Records whose produce request was in flight when the delivery timeout hit have an unknown
    # outcome: the frozen broker still holds the request and writes it after SIGCONT. They are
    # counted as undelivered (never as sent), so "undelivered" is an upper bound: exact for
    # records never handed to the socket (dead broker, tests/integration/test_producer.py), an
    # over-count by the late writes measured here (docs/reliability.md).
    late = stored - p.reports_sent
    assert stored <= p.reports_sent + ei.value.undelivered
    print("OUTAGE", {"queued": queued, "sent": p.reports_sent, "undelivered": ei.value.undelivered,
                     "stored": stored, "late_writes": late})
    request.node.user_properties.append(("outage", {"queued": queued, "sent": p.reports_sent,
                                                    "undelivered": ei.value.undelivered, "stored": stored}))
    del p, ei
    gc.collect()
