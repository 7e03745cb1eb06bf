"""Unit tests of the worker's run loop: the fold and update threads, checkpoints in the background,
rebalances and shutdown (fake clients, no broker)."""

from __future__ import annotations

import time

import pytest

from aggregator.checkpoint import Checkpoint
from aggregator.worker import PartitionState
from tests.aggregator.worker_support import (
    ClosingProducer,
    FakeConsumer,
    FakeProducer,
    GroupConsumer,
    UnackedProducer,
    build_records,
    build_runtime,
    inline_checkpoint,
    make_worker,
    polls,
    rec,
    run_on,
    state_offsets,
    with_update_thread,
)


@pytest.fixture(scope="module")
def runtime():
    return build_runtime()


@pytest.fixture(scope="module")
def records(runtime):
    return build_records(runtime)


@pytest.mark.parametrize("overlap", [False, True])
def test_run_folds_every_poll_and_the_final_checkpoint_holds_them(runtime, records, overlap):
    """run() with the fold and update threads (overlap) ends with the same states, offsets and
    counts as everything inline in the main thread."""
    w = make_worker(runtime, overlap=overlap, consumer=FakeConsumer(polls(records, [3, 4, 5])))
    n = run_on(w, max_reports=12 * 7)
    assert n == w.processed_reports == 12 * 7 and w.processed_records == 12
    ck = Checkpoint.from_bytes(w.producer.sent[-1][2])
    want = inline_checkpoint(runtime, records, [3, 4, 5])
    assert ck.next_offset == want.next_offset == 12 and ck.reports == want.reports
    assert ck.states == want.states
    assert w.threads.folder is None and w.threads.updater is None  # both threads shut down


def test_the_main_thread_polls_again_while_the_previous_poll_is_folded(runtime, records):
    """The fold of poll 1 cannot finish until poll 2 has been called: with the fold in the main
    thread this would never happen (the wait times out and the test fails)."""
    import threading

    second_poll = threading.Event()
    consumer = FakeConsumer(polls(records, [6, 6]), on_poll=lambda k: k == 2 and second_poll.set())
    w = make_worker(runtime, overlap=True, consumer=consumer)
    inner = w.process
    seen = []

    def process(partition, recs):
        if not seen:
            seen.append(second_poll.wait(timeout=10))
        return inner(partition, recs)

    w.process = process
    assert run_on(w, max_reports=12 * 7) == 12 * 7
    assert seen == [True]


def test_checkpoints_due_in_run_are_sent_by_the_update_thread_and_committed_once_acknowledged(
        runtime, records):
    """With overlap, a due checkpoint is marked on the fold thread and sent by the update thread;
    neither waits for the broker: the main thread polls twice more before the records are
    acknowledged. Offsets are committed on the main thread (kafka-python's consumer is not
    thread-safe), and only for acknowledged checkpoints."""
    import threading

    class AckLaterProducer(UnackedProducer):
        """Records are acknowledged two polls after they were sent (flush: at once)."""

        def __init__(self):
            super().__init__()
            self.pending = []  # (future, polls made when it was sent, offset)
            self.threads, self.flushes = [], []

        def send(self, topic, key=None, value=None, headers=None):
            fut = super().send(topic, key, value, headers)
            if topic == "state":
                self.threads.append(threading.current_thread().name)
                self.pending.append((fut, consumer.calls, Checkpoint.from_bytes(value).next_offset))
            return fut

        def ack(self, calls):
            for fut, at, _ in self.pending:
                if calls >= at + 2:
                    fut.is_done = True

        def flush(self, timeout=None):
            self.flushes.append((threading.current_thread().name, bool(shutting)))
            super().flush(timeout)

    class Consumer(FakeConsumer):
        def commit(self, offsets):
            (om,) = offsets.values()
            acked = {o for f, _, o in w.producer.pending if f.is_done}
            commits.append((threading.current_thread().name, om.offset, om.offset in acked))
            super().commit(offsets)

    commits, shutting = [], []
    consumer = Consumer(polls(records, [2] * 6), on_poll=lambda calls: w.producer.ack(calls))
    w = make_worker(runtime, overlap=True, checkpoint_reports=14,  # due after every 2 records
                    producer=AckLaterProducer(), consumer=consumer)
    inner_shutdown = w.shutdown
    w.shutdown = lambda: (shutting.append(1), inner_shutdown())
    assert run_on(w, max_reports=12 * 7) == 12 * 7
    background = w.producer.threads[:-1]  # the last one is the final checkpoint's (main thread)
    assert background and all(name.startswith("ldp-update") for name in background)
    assert len(commits) >= 2 and all(name == "MainThread" and acked for name, _, acked in commits)
    # only the final checkpoint (and the one on its way then) waits for the broker
    assert w.producer.flushes and set(w.producer.flushes) == {("MainThread", True)}
    assert [o for _, _, o in commits] == sorted(o for _, _, o in commits) and commits[-1][1] == 12
    # the states sent in the background are those of an inline fold of the same polls
    first = next(v for t, _, v, _ in w.producer.sent if t == "state")
    ck = Checkpoint.from_bytes(first)
    assert ck.states == inline_checkpoint(runtime, records, [2] * (ck.next_offset // 2)).states
    assert ck.reports == ck.next_offset * 7 and ck.records == ck.next_offset


def test_a_broker_error_while_publishing_in_the_background_is_retried(runtime, records, caplog):
    from kafka.errors import KafkaTimeoutError

    consumer = FakeConsumer(polls(records, [2] * 6))
    w = make_worker(runtime, overlap=True, checkpoint_reports=14, consumer=consumer,
                    producer=FakeProducer(error=KafkaTimeoutError("broker away")))
    w.broker_trouble = lambda what, exc: w.producer.__setattr__("error", None)  # broker back
    assert run_on(w, max_reports=12 * 7) == 12 * 7
    assert w.threads.failure is None
    assert Checkpoint.from_bytes(w.producer.sent[-1][2]).next_offset == 12
    assert consumer.commits  # committed once the broker was back


def test_a_send_refused_before_it_leaves_is_retried_and_does_not_stop_the_worker(runtime, records, caplog):
    """``send`` itself raises a broker error (no metadata within ``max_block_ms``) on the update
    thread: the checkpoint is retried later, the updates and folds go on."""
    from kafka.errors import KafkaTimeoutError

    class NoMetadataOnce(FakeProducer):
        def send(self, topic, key=None, value=None, headers=None):
            if topic == "state" and not troubles:
                raise KafkaTimeoutError("no metadata for 'state'")
            return super().send(topic, key, value, headers)

    troubles = []
    consumer = FakeConsumer(polls(records, [2] * 6))
    w = make_worker(runtime, overlap=True, checkpoint_reports=14, producer=NoMetadataOnce(),
                    consumer=consumer)
    w.broker_trouble = lambda what, exc: troubles.append((what, type(exc).__name__))
    assert run_on(w, max_reports=12 * 7) == 12 * 7
    assert troubles == [("checkpoint", "KafkaTimeoutError")] and w.threads.failure is None
    assert consumer.commits and consumer.commits[-1][next(iter(consumer.commits[-1]))].offset == 12
    assert Checkpoint.from_bytes(w.producer.sent[-1][2]).states == \
        inline_checkpoint(runtime, records, [2] * 6).states


def test_a_checkpoint_begun_before_a_partition_is_lost_is_not_sent_after_the_loss(runtime, records):
    """kafka-python reports a loss without a drain: a snapshot still queued behind an update must
    not publish the lost partition (its next owner may already have published a later one)."""
    import threading

    from kafka import TopicPartition

    w = with_update_thread(make_worker(runtime, overlap=True))
    gate = threading.Event()
    st = next(iter(w.owned[0].states.values()))
    inner = st.update
    st.update = lambda batch, x2: (gate.wait(10), inner(batch, x2))
    w.process(0, [rec(i, records[i]) for i in range(2)])  # its update waits for the gate
    w.checkpoints.in_flight = w.checkpoints.begin()  # queued behind that update
    w.on_lost([TopicPartition("reports", 0)])
    gate.set()
    w.checkpoints.check(block=True)
    assert state_offsets(w.producer) == [] and w.consumer.commits == []
    w.threads.shutdown()


def test_a_loss_warns_only_when_records_after_the_last_checkpoint_must_be_folded_again(runtime, records,
                                                                                      caplog):
    """At shutdown another member's leave can take a partition whose checkpoint is current: that
    is logged at info level; a partition with records folded after its durable checkpoint warns
    and names how many its next owner folds again."""
    import logging

    from kafka import TopicPartition

    w = make_worker(runtime)
    w.process(0, [rec(i, records[i]) for i in range(3)])
    w.checkpoints.publish([w.owned[0]])  # durable: published_offset == next_offset
    with caplog.at_level(logging.INFO, logger="aggregator.worker"):
        w.on_lost([TopicPartition("reports", 0)])
    assert [r.levelno for r in caplog.records if "lost [0]" in r.getMessage()] == [logging.INFO]
    assert 0 not in w.owned

    caplog.clear()
    w2 = make_worker(runtime)
    w2.process(0, [rec(i, records[i]) for i in range(3)])  # never checkpointed
    with caplog.at_level(logging.INFO, logger="aggregator.worker"):
        w2.on_lost([TopicPartition("reports", 0)])
    msgs = [(r.levelno, r.getMessage()) for r in caplog.records if "lost [0]" in r.getMessage()]
    assert len(msgs) == 1 and msgs[0][0] == logging.WARNING and "partition 0: 3" in msgs[0][1]

    caplog.clear()  # a partition whose earliest offset is 5 (older records deleted), never checkpointed
    w3 = make_worker(runtime)
    for _ in range(2):  # the gap [0, 5) is fetched again once before it is believed
        w3.process(0, [rec(5 + i, records[i]) for i in range(3)])
        w3.refetch_gaps()
    with caplog.at_level(logging.INFO, logger="aggregator.worker"):
        w3.on_lost([TopicPartition("reports", 0)])
    msgs = [r.getMessage() for r in caplog.records if "lost [0]" in r.getMessage()]
    assert len(msgs) == 1 and "partition 0: 3" in msgs[0]  # its 3 records, not offset 8


def test_offsets_of_a_partition_revoked_while_its_checkpoint_was_on_its_way_are_not_committed(runtime,
                                                                                              records):
    """The revoke publishes the partition itself; committing the older checkpoint's offsets
    afterwards could move the group's offset back behind the next owner's."""
    from kafka import TopicPartition

    w = with_update_thread(make_worker(runtime, overlap=True, producer=UnackedProducer()))
    w.process(0, [rec(i, records[i]) for i in range(2)])
    cp = w.checkpoints
    cp.in_flight = cp.begin()
    cp.in_flight.snapshot.result(timeout=10)
    assert not cp.in_flight.acknowledged()
    w.on_revoked([TopicPartition("reports", 0)])  # drains, publishes and flushes partition 0
    assert cp.in_flight.acknowledged()
    cp.check(block=False)
    assert state_offsets(w.producer) == [2, 2] and w.consumer.commits == []
    # with the partition still owned, the same sequence commits
    w2 = with_update_thread(make_worker(runtime, overlap=True, producer=UnackedProducer()))
    w2.process(0, [rec(i, records[i]) for i in range(2)])
    cp2 = w2.checkpoints
    cp2.in_flight = cp2.begin()
    cp2.in_flight.snapshot.result(timeout=10)
    w2.producer.flush()
    cp2.check(block=False)
    assert [om.offset for c in w2.consumer.commits for om in c.values()] == [2]
    w.threads.shutdown()
    w2.threads.shutdown()


def test_a_snapshot_error_stops_the_worker_from_the_main_thread_not_the_next_fold(runtime, records):
    """A non-broker error while sending a checkpoint is a bug: it is raised where the main thread
    finishes the checkpoint; the fold that waits for the update thread behind it goes on."""

    class Broken(FakeProducer):
        def send(self, topic, key=None, value=None, headers=None):
            if topic == "state":
                raise ValueError("partitioner bug")
            return super().send(topic, key, value, headers)

    w = with_update_thread(make_worker(runtime, overlap=True, producer=Broken()))
    w.process(0, [rec(i, records[i]) for i in range(2)])
    w.checkpoints.in_flight = w.checkpoints.begin()
    for i in range(2, 6):  # folds after it wait for the snapshot (one update in flight)
        w.process(0, [rec(i, records[i])])
    assert w.threads.failure is None and w.owned[0].next_offset == 6
    with pytest.raises(ValueError, match="partitioner bug"):
        w.checkpoints.check(block=True)
    assert w.consumer.commits == []
    w.threads.shutdown()


def test_a_poll_capped_at_max_poll_records_is_folded_in_the_main_thread(runtime, records):
    """kafka-python still holds records after a capped poll, so the worker folds it inline; a
    poll below the cap goes to the fold thread."""
    import threading

    w = make_worker(runtime, overlap=True, max_poll_records=4,
                    consumer=FakeConsumer(polls(records, [4, 3, 4, 1])))
    inner, threads = w.process, []

    def process(partition, recs):
        threads.append((len(recs), threading.current_thread().name))
        return inner(partition, recs)

    w.process = process
    assert run_on(w, max_reports=12 * 7) == 12 * 7
    assert [n for n, _ in threads] == [4, 3, 4, 1]
    assert [name == "MainThread" for _, name in threads] == [True, False, True, False]
    assert all(name.startswith("ldp-fold") for n, name in threads if n < 4)


def test_a_failed_fold_is_recorded_before_the_lock_is_released(runtime, records):
    """A rebalance callback waits for the lock the fold holds; when it gets it, the failure must
    already be recorded, or its checkpoint would skip records that are in no state."""
    import threading

    w = make_worker(runtime, overlap=True)
    failure_at_release = []

    class Lock:
        def __init__(self):
            self.inner = threading.RLock()

        def __enter__(self):
            return self.inner.__enter__()

        def __exit__(self, *exc):
            failure_at_release.append(w.threads.failure is not None)
            return self.inner.__exit__(*exc)

    w.lock = Lock()

    def boom(partition, recs):
        w.owned[0].next_offset += len(recs)  # offsets moved, then the fold fails
        raise RuntimeError("fold failed")

    w.process = boom
    with pytest.raises(RuntimeError, match="fold failed"):
        w.fold_poll(polls(records, [2])[0])
    assert failure_at_release == [True]
    w.on_revoked([next(iter(polls(records, [1])[0]))])  # the callback that got the lock next
    assert w.producer.sent == []


def test_an_idle_worker_commits_a_checkpoint_published_in_the_background(runtime, records):
    """The offsets of a checkpoint published on the fold thread are committed although no further
    record arrives (the main loop collects finished fold-thread tasks on every turn)."""
    import threading

    consumer = FakeConsumer(polls(records, [2, 2]))
    w = make_worker(runtime, overlap=True, checkpoint_reports=28,  # due once 4 records are in
                    consumer=consumer)
    t = threading.Thread(target=run_on, args=(w, None))
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not consumer.commits and time.monotonic() < deadline:
            time.sleep(0.01)
        committed_while_running = bool(consumer.commits)
    finally:
        w.stop()
        t.join(timeout=30)
    assert committed_while_running
    assert consumer.commits[0][next(iter(consumer.commits[0]))].offset == 4


def test_a_failed_fold_stops_the_worker_without_a_checkpoint(runtime, records, caplog):
    w = make_worker(runtime, overlap=True, consumer=FakeConsumer(polls(records, [2, 2, 2])))

    def boom(partition, recs):
        raise RuntimeError("fold failed")

    w.process = boom
    with pytest.raises(RuntimeError, match="fold failed"):
        run_on(w, max_reports=12 * 7)
    assert w.producer.sent == []  # offsets moved past records that are in no state
    assert "no final checkpoint" in caplog.text


@pytest.mark.parametrize("events, leaves", [
    ((), False),  # stopped during the first join
    (("revoked", "assigned"), True),  # an assignment in force
    (("revoked", "assigned", "revoked"), False),  # stopped during a rejoin
    (("revoked", "assigned", "lost"), False),
])
def test_a_worker_stopped_during_a_join_closes_without_leave_group(runtime, events, leaves):
    """Stopped between a rebalance's start (revoke/lost callback, or before the first join) and
    its assignment, the worker clears the consumer's generation so that ``close`` sends no
    LeaveGroup (docs/kafka.md); with an assignment in force it closes normally."""
    from kafka import TopicPartition

    consumer = GroupConsumer()
    w = make_worker(runtime, consumer=consumer)
    w.owned.clear()
    consumer.pause = lambda *tps: None
    tp = TopicPartition("reports", 0)
    for ev in events:
        {"assigned": w.on_assigned, "revoked": w.on_revoked, "lost": w.on_lost}[ev]([tp])
        if ev == "assigned":
            w.pending.clear()
    w.shutdown()
    assert consumer._coordinator.resets == (0 if leaves else 1)
    assert consumer.closed == ([True] if leaves else [False])


@pytest.mark.parametrize("fail", [False, True])
def test_shutdown_closes_the_clients_within_a_limit_and_flags_a_failed_final_checkpoint(runtime, records,
                                                                                         fail):
    """The producer and the consumer are closed with CLOSE_TIMEOUT_S (kafka-python's producer
    waits without limit by default: a hung broker kept a stopped worker alive); a final
    checkpoint that fails sets ``final_checkpoint_failed`` (the CLI exits 1 on it)."""
    from kafka import TopicPartition

    from ingest.kafka.settings import CLOSE_TIMEOUT_S

    consumer = GroupConsumer()
    consumer.close = lambda autocommit=True, timeout_ms=None: consumer.closed.append(timeout_ms)
    consumer.pause = lambda *tps: None
    w = make_worker(runtime, consumer=consumer,
                    producer=ClosingProducer(error=RuntimeError("broker hung") if fail else None))
    w.process(0, [rec(0, records[0])])
    w.on_assigned([TopicPartition("reports", 0)])
    w.pending.clear()
    w.shutdown()
    assert w.producer.closed == [CLOSE_TIMEOUT_S]
    assert consumer.closed == [int(CLOSE_TIMEOUT_S * 1000)]
    assert w.final_checkpoint_failed is fail


def test_shutdown_remembers_the_partitions_owned_before_leaving(runtime, records):
    """Closing the consumer revokes the partitions (LeaveGroup), so ``owned`` is empty after the
    stop; ``owned_at_stop`` keeps what the worker owned when its loop ended (the CLI prints it)."""
    from kafka import TopicPartition

    consumer = GroupConsumer()
    consumer.pause = lambda *tps: None
    tps = [TopicPartition("reports", p) for p in (0, 2)]
    w = make_worker(runtime, consumer=consumer, producer=ClosingProducer())

    def close(autocommit=True, timeout_ms=None):
        w.on_revoked(tps)  # what kafka-python's close() does before LeaveGroup
        consumer.closed.append(timeout_ms)

    consumer.close = close
    w.on_assigned(tps)  # the assignment is in force (LeaveGroup on close) …
    w.pending.clear()
    w.owned[2] = PartitionState(2, 0, runtime.new_states())  # … and both partitions restored
    w.shutdown()
    assert w.owned == {} and w.owned_at_stop == [0, 2]
