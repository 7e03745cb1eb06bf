"""Exactly once per key (docs/collector.md §6): duplicates, reused keys, keys in flight, failed
and late sends, the window and its bound; the rate limit and the in-flight byte bound (§7)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from aggregator.collector.forward import Forwarder
from aggregator.collector.idempotency import ACCEPTED, IN_FLIGHT, UNCONFIRMED, IdempotencyTable
from aggregator.collector.ratelimit import RateLimiter
from aggregator.errors import RequestRefused
from tests.aggregator.collector_support import TOPIC, Clock, FakeTransport, Served, body, metric


@pytest.fixture
def served(tmp_path):
    s = Served(tmp_path, ack_timeout_s=2.0)
    yield s
    s.close()


def in_thread(fn, *args, **kwargs):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn(*args, **kwargs)), daemon=True)
    t.start()
    return t, out


def wait_for(cond, timeout=3.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_a_retried_key_is_a_duplicate_with_the_first_count_and_is_forwarded_once(served):
    data = body(9)
    first = served.post(data, "dup-1")
    again = served.post(data, "dup-1")
    assert first[:2] == (202, {"accepted": 9, "idempotency_key": "dup-1", "duplicate": False})
    assert again[:2] == (202, {"accepted": 9, "idempotency_key": "dup-1", "duplicate": True})
    assert served.transport.sent == [data]


def test_keys_are_scoped_per_token(served):
    from aggregator.collector.tokens import mint_token

    other = mint_token(served.tokens_path, "dev-b")
    served.collector.tokens.maybe_reload(force=True)
    assert served.post(body(2, 1), "same")[1]["duplicate"] is False
    status, js, _ = served.post(body(2, 2), "same", headers=served.headers("same", token=other))
    assert (status, js["duplicate"]) == (202, False)
    assert len(served.transport.sent) == 2


def test_the_same_key_with_another_body_is_422_and_not_forwarded(served):
    assert served.post(body(3, seed=1), "reuse")[0] == 202
    status, js, _ = served.post(body(3, seed=2), "reuse")
    assert status == 422 and js["error"] == "idempotency_key_reused"
    assert len(served.transport.sent) == 1


def test_a_retry_while_the_first_copy_is_in_flight_waits_for_it_and_is_not_forwarded(served):
    served.transport.mode = "hold"
    data = body(4)
    t1, r1 = in_thread(served.post, data, "fly-1")
    wait_for(lambda: len(served.transport.sent) == 1)
    t2, r2 = in_thread(served.post, data, "fly-1")
    t3, r3 = in_thread(served.post, data, "fly-1")
    wait_for(lambda: metric(served.get("/metrics")[1], "ldp_collector_idempotency_keys",
                            state="in_flight") == 1)
    time.sleep(0.05)  # the retries are waiting now
    assert not r1 and not r2 and not r3  # nobody answered before the ack
    served.transport.ack_all()
    for t in (t1, t2, t3):
        t.join(5)
    answers = sorted(r["r"][1]["duplicate"] for r in (r1, r2, r3))
    assert [r["r"][0] for r in (r1, r2, r3)] == [202, 202, 202]
    assert answers == [False, True, True]
    assert served.transport.sent == [data] and served.transport.delivered == [data]


def test_a_failed_send_is_read_back_on_the_retry_and_forwarded_when_absent(served):
    data = body(4)
    served.transport.mode = "fail"
    status, js, headers = served.post(data, "f-1")
    assert status == 503 and js["error"] == "broker_unavailable" and int(headers["retry-after"]) >= 1
    assert served.transport.delivered == []
    assert served.collector.table.lookup("dev-a", "f-1").state == UNCONFIRMED
    served.transport.mode = "ack"
    status, js, _ = served.post(data, "f-1")
    assert (status, js["duplicate"]) == (202, False)
    assert served.transport.delivered == [data] and len(served.transport.sent) == 2
    assert len(served.transport.finds) == 1


def test_a_send_that_raises_frees_the_key_too(served):
    served.transport.mode = "raise"
    assert served.post(body(4), "r-1")[1]["error"] == "broker_unavailable"
    assert served.collector.table.inflight == 0 and served.collector.table.inflight_bytes == 0
    served.transport.mode = "ack"
    assert served.post(body(4), "r-1")[1]["duplicate"] is False
    assert len(served.transport.delivered) == 1


def test_no_ack_within_ack_timeout_is_503_and_the_late_ack_makes_the_retry_a_duplicate(tmp_path):
    s = Served(tmp_path, ack_timeout_s=0.2)
    try:
        s.transport.mode = "hold"
        data = body(5)
        t0 = time.monotonic()
        status, js, headers = s.post(data, "late-1")
        assert status == 503 and js["error"] == "broker_unavailable" and headers["retry-after"] == "1"
        assert 0.18 < time.monotonic() - t0 < 1.5
        # the client is still retrying: the key stays in flight, a retry now waits and times out too
        assert s.collector.table.lookup("dev-a", "late-1").state == IN_FLIGHT
        assert s.post(data, "late-1")[0] == 503
        assert len(s.transport.sent) == 1
        s.transport.ack_all()  # the late acknowledgement
        wait_for(lambda: s.collector.table.lookup("dev-a", "late-1").state == ACCEPTED)
        status, js, _ = s.post(data, "late-1")
        assert (status, js["duplicate"], js["accepted"]) == (202, True, 5)
        assert s.transport.sent == [data] and s.transport.delivered == [data]
        text = s.get("/metrics")[1]
        assert metric(text, "ldp_collector_refused_total", reason="broker_unavailable") == 2
        # the late acknowledgement put the 5 reports in the topic: counted once, the duplicate adds none
        assert metric(text, "ldp_collector_reports_accepted_total") == 5
    finally:
        s.close()


def test_a_late_failure_after_the_timeout_is_read_back_and_the_retry_forwards(tmp_path):
    s = Served(tmp_path, ack_timeout_s=0.1)
    try:
        s.transport.mode = "hold"
        data = body(5)
        assert s.post(data, "lf")[0] == 503
        s.transport.fail_all()
        wait_for(lambda: s.collector.table.lookup("dev-a", "lf").state == UNCONFIRMED)
        s.transport.mode = "ack"
        assert s.post(data, "lf")[:2] == (202, {"accepted": 5, "idempotency_key": "lf", "duplicate": False})
        assert s.transport.delivered == [data]
    finally:
        s.close()


def test_the_rate_limit_is_429_with_retry_after_and_charges_after_decoding(tmp_path):
    s = Served(tmp_path, rate_limit_reports_per_s=2.0, rate_limit_burst=5)
    try:
        assert s.post(body(10), "rl-1")[0] == 202  # 5 in the bucket ≥ 1: let in, charged 10 → -5
        status, js, headers = s.post(body(1), "rl-2")
        assert status == 429 and js["error"] == "rate_limited"
        assert headers["retry-after"] == "3"  # (1 - (-5)) / 2 reports/s
        assert len(s.transport.sent) == 1
    finally:
        s.close()


def test_the_rate_bucket_refills_and_may_go_into_debt():
    clock = Clock()
    rl = RateLimiter(10.0, 20, clock)
    assert rl.retry_after("a") == 0
    rl.charge("a", 50)
    assert rl.level("a") == -30 and rl.retry_after("a") == 4  # ceil(31 / 10)
    clock.t += 3.2
    assert rl.retry_after("a") == 0 and rl.level("a") == pytest.approx(2.0)
    rl.charge("a", 0)  # a refused body still costs one
    assert rl.level("a") == pytest.approx(1.0)
    clock.t += 100
    assert rl.level("a") == 20 and rl.level("b") == 20


# ---------------------------------------------------------------------- the table and forwarder
def run(coro):
    return asyncio.run(coro)


def test_concurrent_waiters_of_a_failed_send_forward_it_once():
    async def main():
        transport = FakeTransport("hold")
        table = IdempotencyTable(60.0, 100)
        fw = Forwarder(transport, TOPIC, table, ack_timeout_s=2.0, max_inflight_bytes=1 << 20,
                       readback=transport)
        data = body(3)
        first = asyncio.create_task(fw.submit("t", "k", data, 3))
        while not transport.pending:
            await asyncio.sleep(0.001)
        waiters = [asyncio.create_task(fw.submit("t", "k", data, 3)) for _ in range(3)]
        await asyncio.sleep(0.02)
        transport.fail_all()  # from this thread: the callbacks go through call_soon_threadsafe
        with pytest.raises(RequestRefused) as info:
            await first
        assert info.value.code == "broker_unavailable"
        while not transport.pending:
            await asyncio.sleep(0.001)
        assert len(transport.sent) == 2  # one waiter forwarded anew, the others wait on it
        transport.ack_all()
        done = await asyncio.gather(*waiters)
        assert sorted(d.duplicate for d in done) == [False, True, True]
        assert transport.delivered == [data]

    run(main())


def test_an_accepted_key_is_forgotten_after_the_window():
    async def main():
        clock = Clock()
        transport = FakeTransport()
        table = IdempotencyTable(900.0, 100, clock)
        fw = Forwarder(transport, TOPIC, table, ack_timeout_s=1.0, max_inflight_bytes=1 << 20,
                       readback=transport)
        data = body(2)
        assert not (await fw.submit("t", "w", data, 2)).duplicate
        clock.t += 899.0
        assert (await fw.submit("t", "w", data, 2)).duplicate
        clock.t += 1.0  # 900 s after the acknowledgement
        assert not (await fw.submit("t", "w", data, 2)).duplicate
        assert len(transport.delivered) == 2 and table.expired == 1

    run(main())


def test_the_window_is_bounded_by_max_keys_least_recently_used_first():
    async def main():
        transport = FakeTransport()
        table = IdempotencyTable(900.0, 2)
        evicted = []
        table.on_evict = lambda: evicted.append(1)
        fw = Forwarder(transport, TOPIC, table, ack_timeout_s=1.0, max_inflight_bytes=1 << 20,
                       readback=transport)
        data = {k: body(1, i) for i, k in enumerate("abc")}
        await fw.submit("t", "a", data["a"], 1)
        await fw.submit("t", "b", data["b"], 1)
        assert (await fw.submit("t", "a", data["a"], 1)).duplicate  # a is now the most recent
        await fw.submit("t", "c", data["c"], 1)  # evicts b
        assert table.accepted == 2 and evicted == [1]
        assert (await fw.submit("t", "a", data["a"], 1)).duplicate
        assert not (await fw.submit("t", "b", data["b"], 1)).duplicate  # forgotten: forwarded again
        assert len(transport.delivered) == 4

    run(main())


def test_in_flight_bytes_beyond_the_bound_are_503_overloaded_and_not_forwarded():
    async def main():
        transport = FakeTransport("hold")
        table = IdempotencyTable(900.0, 100)
        a, b = body(3, 1), body(3, 2)
        fw = Forwarder(transport, TOPIC, table, ack_timeout_s=1.0, max_inflight_bytes=len(a) + len(b) - 1,
                       readback=transport)
        first = asyncio.create_task(fw.submit("t", "a", a, 3))
        while not transport.pending:
            await asyncio.sleep(0.001)
        assert table.inflight_bytes == len(a)
        with pytest.raises(RequestRefused) as info:
            await fw.submit("t", "b", b, 3)
        assert (info.value.code, info.value.status, info.value.retry_after) == ("overloaded", 503, 1)
        assert transport.sent == [a]
        transport.ack_all()
        assert not (await first).duplicate and table.inflight_bytes == 0
        transport.mode = "ack"
        assert not (await fw.submit("t", "b", b, 3)).duplicate

    run(main())


def test_a_resolution_is_applied_once():
    async def main():
        table = IdempotencyTable(900.0, 10)
        e = table.begin("t", "k", b"h" * 32, 1, 10)
        done = e.done
        with pytest.raises(KeyError):
            table.begin("t", "k", b"h" * 32, 1, 10)
        table.resolve(e, True)
        table.resolve(e, False)  # a stray second callback changes nothing
        assert table.lookup("t", "k").state == ACCEPTED and table.inflight_bytes == 0
        assert done.result() is True and e.done is None

    run(main())
