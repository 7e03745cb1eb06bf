"""Unconfirmed batches (docs/collector.md §6): a record the Kafka client failed after the broker
may have written it is not sent again blindly; the retry reads its partition back from a lower
bound on its offset and answers a duplicate when the batch id is there."""

from __future__ import annotations

import asyncio

import pytest

from aggregator.collector.forward import PRODUCER_OPTIONS, Forwarder
from aggregator.collector.idempotency import ACCEPTED, UNCONFIRMED, IdempotencyTable
from aggregator.collector.readback import BATCH_ID_HEADER, batch_id, partition_of
from aggregator.errors import RequestRefused
from tests.aggregator.collector_support import TOPIC, Clock, FakeTransport, Served, body, metric


@pytest.fixture
def served(tmp_path):
    s = Served(tmp_path)
    yield s
    s.close()


def forwarder(transport: FakeTransport, table: IdempotencyTable | None = None, counts=None) -> Forwarder:
    table = table if table is not None else IdempotencyTable(900.0, 1000)
    fw = Forwarder(transport, TOPIC, table, ack_timeout_s=1.0,
                   max_inflight_bytes=1 << 20, readback=transport,
                   on_readback=None if counts is None else counts.append)
    fw.start()
    return fw


def test_the_batch_id_names_token_and_key_and_fixes_the_partition():
    bid = batch_id("dev-a", "k-1")
    assert len(bid) == 16
    assert len({bid, batch_id("dev-b", "k-1"), batch_id("dev-a", "k-2"), batch_id("dev-a\x00k", "-1")}) == 4
    parts = [partition_of(batch_id("t", f"k{i}"), {0, 1, 2, 3}) for i in range(400)]
    assert set(parts) == {0, 1, 2, 3} and min(parts.count(p) for p in range(4)) > 60  # spread
    assert partition_of(bid, [3, 1, 2, 0]) == partition_of(bid, {0, 1, 2, 3})
    with pytest.raises(ValueError, match="no partitions"):
        partition_of(bid, set())


def test_the_collectors_producer_never_retries_on_its_own():
    assert PRODUCER_OPTIONS == {"retries": 0, "enable_idempotence": False}


def test_every_record_carries_its_batch_id_on_its_partition(served):
    s = served
    s.transport.partitions = {0, 1, 2, 3}
    for i in range(8):
        assert s.post(body(2, i), f"h-{i}")[0] == 202
    for i in range(8):
        bid = batch_id("dev-a", f"h-{i}")
        records = s.transport.log[partition_of(bid, {0, 1, 2, 3})]
        assert (body(2, i), [(BATCH_ID_HEADER, bid)]) in records


def test_a_lost_acknowledgement_is_found_by_the_read_back_and_not_written_twice(served):
    s = served
    data = body(6)
    s.transport.mode = "lost-ack"  # the broker stored it, then the connection dropped
    status, js, _ = s.post(data, "la-1")
    assert (status, js["error"]) == (503, "broker_unavailable")
    assert s.collector.table.lookup("dev-a", "la-1").state == UNCONFIRMED
    s.transport.mode = "ack"
    status, js, _ = s.post(data, "la-1")
    assert (status, js) == (202, {"accepted": 6, "idempotency_key": "la-1", "duplicate": True})
    assert s.transport.delivered == [data] and s.transport.sent == [data]
    assert s.collector.table.lookup("dev-a", "la-1").state == ACCEPTED
    assert s.post(data, "la-1")[1]["duplicate"] is True and len(s.transport.finds) == 1
    text = s.get("/metrics")[1]
    assert metric(text, "ldp_collector_readbacks_total", outcome="found") == 1
    assert metric(text, "ldp_collector_readbacks_total", outcome="absent") == 0
    assert metric(text, "ldp_collector_batches_total", outcome="duplicate") == 2


def test_reports_accepted_counts_batches_settled_by_a_read_back_or_a_late_ack(tmp_path):
    """``ldp_collector_reports_accepted_total`` counts every record known to be in the topic
    once, also those whose first request was answered 503: a lost acknowledgement found by the
    read-back, an acknowledgement that came after ``ack_timeout_s``."""
    from ingest.client.codec import decode
    from tests.aggregator.collector_support import SCHEMA

    s = Served(tmp_path, ack_timeout_s=0.3)
    try:
        lost, late, plain = body(6, 1), body(4, 2), body(3, 3)
        s.transport.mode = "lost-ack"  # stored, then the connection dropped
        assert s.post(lost, "c-lost")[0] == 503
        s.transport.mode = "hold"
        assert s.post(late, "c-late")[0] == 503  # no acknowledgement within ack_timeout_s
        s.transport.ack_all()  # ... it comes later
        s.transport.mode = "ack"
        assert s.post(lost, "c-lost")[1]["duplicate"] is True  # read back: found
        assert s.post(late, "c-late")[1]["duplicate"] is True
        assert s.post(plain, "c-plain")[1]["duplicate"] is False
        assert s.post(plain, "c-plain")[1]["duplicate"] is True
        in_topic = sum(decode(v, {SCHEMA.fingerprint: SCHEMA}).n for v in s.transport.delivered)
        text = s.get("/metrics")[1]
        assert in_topic == 13 and metric(text, "ldp_collector_reports_accepted_total") == in_topic
        assert metric(text, "ldp_collector_readbacks_total", outcome="found") == 1
        assert metric(text, "ldp_collector_batches_total", outcome="accepted") == 1
    finally:
        s.close()


def test_a_failed_read_back_is_503_and_keeps_the_batch_unconfirmed(served):
    s = served
    data = body(3)
    s.transport.mode = "lost-ack"
    assert s.post(data, "rb")[0] == 503
    s.transport.mode, s.transport.readback_error = "ack", TimeoutError("partition 0 not read")
    status, js, headers = s.post(data, "rb")
    assert (status, js["error"]) == (503, "broker_unavailable") and "read the topic back" in js["reason"]
    assert int(headers["retry-after"]) >= 1
    assert s.collector.table.lookup("dev-a", "rb").state == UNCONFIRMED and s.transport.sent == [data]
    s.transport.readback_error = None
    assert s.post(data, "rb")[1]["duplicate"] is True
    assert s.transport.delivered == [data]
    text = s.get("/metrics")[1]
    assert metric(text, "ldp_collector_readbacks_total", outcome="failed") == 1


def run(coro):
    return asyncio.run(coro)


def test_one_read_back_settles_every_unconfirmed_batch_of_the_partition_from_the_lowest_mark():
    async def main():
        transport = FakeTransport("ack")
        counts: list[str] = []
        fw = forwarder(transport, counts=counts)
        await fw.submit("t", "before", body(1, 99), 1)  # one acknowledged record: mark 1
        assert fw.marks == {0: 1}
        transport.mode = "hold"
        bodies = {f"k{i}": body(2, i) for i in range(5)}
        tasks = [asyncio.create_task(fw.submit("t", k, b, 2)) for k, b in bodies.items()]
        while len(transport.pending) < 5:
            await asyncio.sleep(0.001)
        # the broker wrote k0, k2 and k4 and died; k1 and k3 never reached it
        pending, transport.pending = transport.pending, []
        transport.pending = [pending[0], pending[2], pending[4]]
        transport.lose_acks()
        transport.pending = [pending[1], pending[3]]
        transport.fail_all()
        for t in tasks:
            with pytest.raises(RequestRefused):
                await t
        assert fw.table.unconfirmed == 5 and all(
            fw.table.lookup("t", k).start == 1 for k in bodies)
        transport.mode = "ack"
        done = {k: await fw.submit("t", k, b, 2) for k, b in bodies.items()}
        assert [done[k].duplicate for k in bodies] == [True, False, True, False, True]
        assert transport.finds == [(0, 1, 5)]  # one scan from the mark, for all five
        assert sorted(counts) == ["absent", "absent", "found", "found", "found"]
        assert sorted(transport.delivered) == sorted([body(1, 99), *bodies.values()])  # each once

    run(main())


def test_marks_follow_the_acknowledgements_per_partition():
    async def main():
        transport = FakeTransport("ack")
        transport.partitions = {0, 1}
        transport.log = {0: [(b"old", [])] * 3, 1: []}  # records written before the collector started
        fw = forwarder(transport)
        assert fw.marks == {0: 3, 1: 0}
        for i in range(6):
            await fw.submit("t", f"m{i}", body(1, i), 1)
        assert fw.marks == {p: len(transport.log[p]) for p in (0, 1)}

    run(main())


def test_concurrent_retries_of_unconfirmed_batches_share_one_scan():
    async def main():
        transport = FakeTransport("lost-ack")
        fw = forwarder(transport)
        bodies = {f"c{i}": body(1, i) for i in range(4)}
        for k, b in bodies.items():
            with pytest.raises(RequestRefused):
                await fw.submit("t", k, b, 1)
        transport.mode = "ack"
        done = await asyncio.gather(*(fw.submit("t", k, b, 1) for k, b in bodies.items()))
        assert all(d.duplicate for d in done) and len(transport.finds) == 1
        assert len(transport.delivered) == 4

    run(main())


def test_an_unconfirmed_batch_expires_after_the_window():
    async def main():
        clock = Clock()
        transport = FakeTransport("fail")
        table = IdempotencyTable(900.0, 100, clock)
        fw = forwarder(transport, table)
        with pytest.raises(RequestRefused):
            await fw.submit("t", "x", body(1), 1)
        clock.t += 899.0
        assert table.lookup("t", "x").state == UNCONFIRMED
        clock.t += 1.0
        assert table.lookup("t", "x") is None and table.expired == 1 and table.unconfirmed == 0
        transport.mode = "ack"
        assert not (await fw.submit("t", "x", body(1), 1)).duplicate and transport.finds == []

    run(main())


def test_a_confirmation_is_applied_once_and_only_to_an_unconfirmed_entry():
    async def main():
        table = IdempotencyTable(900.0, 10)
        e = table.begin("t", "k", b"h" * 32, 1, 10)
        table.confirm(e, True)  # still in flight: ignored
        assert table.lookup("t", "k").state == "in_flight"
        table.unconfirm(e)
        table.resolve(e, True)  # a stray callback after the failure: ignored
        assert table.lookup("t", "k").state == UNCONFIRMED and table.inflight_bytes == 0
        table.confirm(e, False)
        table.confirm(e, True)
        assert table.lookup("t", "k") is None and len(table) == 0

    run(main())
