"""Unit tests of the worker's record handling, checkpoints and metrics (no broker)."""

from __future__ import annotations

import time
import types

import numpy as np
import pytest

from aggregator.checkpoint import Checkpoint, CheckpointError, checkpoint_key, parse_checkpoint_key
from aggregator.config import PipelineConfig
from aggregator.errors import ConfigError
from aggregator.metrics import METRIC_NAMES, ServeMetrics, WorkerMetrics
from aggregator.worker import KafkaClients, PartitionState, PipelineRuntime, Worker, concat_batches
from tests.integration import pipeline_support as ps


@pytest.fixture(scope="module")
def runtime():
    text = (f'[pipeline]\nname = "flights"\nschema = "{ps.SCHEMA}"\n'
            '[kafka]\nbootstrap_servers = "127.0.0.1:9"\n')
    import tomllib

    cfg = PipelineConfig.from_dict(tomllib.loads(text + ps.available_queries()))
    return PipelineRuntime.from_config(cfg)


@pytest.fixture(scope="module")
def records(runtime):
    return ps.make_records(runtime.schema, n_records=12, per_record=7, seed=3)


class FakeFuture:
    """A send future as kafka-python's: ``is_done`` once the broker answered (here at once)."""

    def __init__(self, error=None, done=True):
        self.error = error
        self.is_done = done

    def get(self, timeout=None):
        assert self.is_done, "get() of an unacknowledged record would block"
        if self.error is not None:
            raise self.error
        return None


class FakeProducer:
    def __init__(self, error=None):
        self.sent = []
        self.error = error

    def send(self, topic, key=None, value=None, headers=None):
        self.sent.append((topic, key, value, dict(headers or [])))
        return FakeFuture(self.error)

    def flush(self, timeout=None):
        pass


def rec(offset, value, partition=0):
    return types.SimpleNamespace(topic="reports", partition=partition, offset=offset, key=None, value=value)


def make_worker(runtime, producer=None, consumer=None, **kw):
    """A worker over fake clients (``FakeProducer``, ``FakeConsumer`` without records) that owns
    partition 0, restored empty."""
    clients = KafkaClients(FakeConsumer([]) if consumer is None else consumer,
                           FakeProducer() if producer is None else producer)
    w = Worker(runtime, lambda: clients, reports_topic="reports", state_topic="state",
               dead_letter_topic="dlq", group_id="g", **kw).open()
    w.owned[0] = PartitionState(0, 0, runtime.new_states())
    return w


def test_checkpoint_roundtrip_and_errors():
    ck = Checkpoint("flights", 3, 17, 120, b"\x01" * 16, {"a": b"xyz", "b": b""}, records=5)
    back = Checkpoint.from_bytes(ck.to_bytes())
    assert (back.pipeline, back.partition, back.next_offset, back.reports, back.records) == ("flights", 3, 17,
                                                                                              120, 5)
    assert back.states == {"a": b"xyz", "b": b""} and back.fingerprint == b"\x01" * 16
    assert back.key == b"flights/3" == checkpoint_key("flights", 3)
    assert parse_checkpoint_key(b"flights/3") == ("flights", 3)
    blob = ck.to_bytes()
    for bad in (b"", b"XXXX" + blob[4:], blob[:-1], blob + b"\x00", blob[:4] + b"\x00\x09" + blob[6:]):
        with pytest.raises(CheckpointError):
            Checkpoint.from_bytes(bad)
    with pytest.raises(CheckpointError):
        parse_checkpoint_key(b"nopartition")
    with pytest.raises(CheckpointError, match="pipeline"):
        checkpoint_key("a/b", 1)


def test_process_skips_duplicates_and_dead_letters(runtime, records):
    w = make_worker(runtime)
    good = [rec(i, r) for i, r in enumerate(records[:5])]
    assert w.process(0, good) == 5 * 7
    # replayed records are duplicates; a malformed and an oversized one go to the dead-letter topic
    w.folder.max_record_bytes = max(len(r) for r in records) + 10
    batch = [rec(3, records[3]), rec(4, records[4]), rec(5, b"garbage"), rec(6, records[6][:-3]),
             rec(7, b"\x00" * (w.folder.max_record_bytes + 1)), rec(8, records[8])]
    assert w.process(0, batch) == 7
    reasons = [h["reason"].decode() for _, _, _, h in w.producer.sent]
    assert reasons[2] == "oversized" and len(reasons) == 3
    assert all(r for r in reasons[:2])
    topic, _, value, headers = w.producer.sent[0]
    assert topic == "dlq" and value == b"garbage" and headers["source_offset"] == b"5"
    ps_ = w.owned[0]
    assert ps_.next_offset == 9 and ps_.reports == 6 * 7 and ps_.records == 6
    text = w.metrics.exposition().decode()
    assert ps.metric_value(text, "ldp_duplicates_skipped_total") == 2
    assert ps.metric_value(text, "ldp_reports_processed_total") == 42
    dlq = [ps.metric_value(text, "ldp_records_dead_lettered_total", f'reason="{r}"') for r in set(reasons)]
    assert sum(dlq) == 3


def test_contiguous_poll_takes_the_batched_path_and_falls_back_on_a_bad_record(runtime, records, monkeypatch):
    """A poll that continues at next_offset is folded without the per-record loop; a poll with an
    empty, oversized or undecodable record among good ones falls back to it: each bad record is
    dead-lettered with its reason and the good ones are folded as if the bad ones were absent."""
    w = make_worker(runtime)
    w.folder.max_record_bytes = max(len(r) for r in records) + 10
    slow = []
    real_fold = w.folder.fold_records
    monkeypatch.setattr(w.folder, "fold_records",
                        lambda ps_, todo: slow.append(len(todo)) or real_fold(ps_, todo))
    assert w.process(0, [rec(i, r) for i, r in enumerate(records[:4])]) == 4 * 7
    assert slow == []
    big = b"\x00" * (w.folder.max_record_bytes + 1)
    bad = [rec(4, records[4]), rec(5, None), rec(6, records[5]), rec(7, big), rec(8, records[6][:-1]),
           rec(9, records[7])]
    assert w.process(0, bad) == 3 * 7
    assert slow == [6]
    assert [h["reason"].decode() for *_, h in w.producer.sent] == ["empty", "oversized", "truncated"]
    assert [h["source_offset"] for *_, h in w.producer.sent] == [b"5", b"7", b"8"]
    assert w.owned[0].next_offset == 10 and w.owned[0].records == 7
    w.threads.drain()
    want = ps.reference_pass(runtime, {0: [*records[:6], records[7]]})
    for name, st in want.items():  # same reports (batched differently: equal to rounding)
        got = w.owned[0].states[name]
        assert got.n == st.n, name
        np.testing.assert_allclose(got.estimate().value, st.estimate().value, rtol=1e-9, atol=1e-12)


def test_offset_gap_counted(runtime, records):
    w = make_worker(runtime)
    w.process(0, [rec(0, records[0]), rec(5, records[1])])
    assert w.owned[0].next_offset == 6
    text = w.metrics.exposition().decode()
    assert ps.metric_value(text, "ldp_offset_gap_records_total", 'partition="0"') == 4


def test_coalesced_updates_match_record_by_record(runtime, records):
    a, b = make_worker(runtime, coalesce=True), make_worker(runtime, coalesce=False)
    recs = [rec(i, r) for i, r in enumerate(records)]
    a.process(0, recs[:4])
    a.process(0, recs[4:])
    b.process(0, recs)
    want = ps.reference_pass(runtime, {0: records})
    for name, st in want.items():
        for w in (a, b):
            got = w.owned[0].states[name]
            assert got.n == st.n
            np.testing.assert_allclose(got.estimate().value, st.estimate().value, rtol=1e-9, atol=1e-12)
        # record by record is bit-identical to the reference pass
        assert b.owned[0].states[name].to_bytes() == st.to_bytes()


def test_checkpoint_restore_is_lossless(runtime, records):
    w = make_worker(runtime)
    w.process(0, [rec(i, r) for i, r in enumerate(records)])
    ck = Checkpoint.from_bytes(w.owned[0].to_checkpoint(runtime).to_bytes())
    assert ck.next_offset == len(records) and ck.reports == len(records) * 7
    for name, blob in ck.states.items():
        assert runtime.restore_state(name, blob).to_bytes() == w.owned[0].states[name].to_bytes()


def test_failed_checkpoint_send_keeps_state_dirty_and_commits_nothing(runtime, records):
    """flush() does not raise for a record the broker refused; the worker must check the
    futures, keep the partition dirty and not move the group offsets."""
    from kafka.errors import KafkaTimeoutError

    commits = []
    w = make_worker(runtime, producer=FakeProducer(error=KafkaTimeoutError("broker gone")),
                    consumer=types.SimpleNamespace(commit=lambda offsets: commits.append(offsets)))
    w.process(0, [rec(i, r) for i, r in enumerate(records)])
    with pytest.raises(KafkaTimeoutError):
        w.checkpoint()
    assert w.owned[0].dirty and commits == []
    w.producer.error = None  # the broker is back
    assert w.checkpoint() == 1
    assert not w.owned[0].dirty and len(commits) == 1


def test_concat_batches(runtime, records):
    bs = [runtime.decode(r) for r in records[:3]]
    c = concat_batches(bs)
    assert c.n == 21
    np.testing.assert_array_equal(c.numeric, np.vstack([b.numeric for b in bs]))
    for name, col in c.categorical.items():
        if hasattr(col, "offsets"):
            assert col.n == 21 and col.offsets[-1] == sum(b.categorical[name].indices.size for b in bs)
        else:
            np.testing.assert_array_equal(col, np.concatenate([b.categorical[name] for b in bs]))


@pytest.mark.parametrize(("kw", "match"), [
    ({"checkpoint_interval_s": 0}, "checkpoint_interval_s"),
    ({"checkpoint_reports": 0}, "checkpoint_reports"),
    ({"max_record_bytes": 0}, "max_record_bytes"),
    ({"max_poll_records": 0}, "max_poll_records"),
    ({"group_id": ""}, "group_id"),
    ({"state_topic": "reports"}, "different"),
])
def test_worker_parameter_validation(runtime, kw, match):
    args = {"reports_topic": "reports", "state_topic": "state", "dead_letter_topic": "dlq", "group_id": "g"}
    args.update(kw)
    with pytest.raises(ConfigError, match=match):
        Worker(runtime, lambda: KafkaClients(FakeConsumer([]), FakeProducer()), **args)


def test_metric_names_registered():
    text = WorkerMetrics().exposition().decode() + ServeMetrics().exposition().decode()
    for name in METRIC_NAMES:
        assert ps.has_family(text, name), name
    assert "ldp_consumer_lag_records" in METRIC_NAMES and "ldp_estimate_ci_upper" in METRIC_NAMES


def test_doubling_is_zil_double_with_the_records_draws(runtime, records):
    """X̃₂ = X̃₁ + sqrt(δ·noise_variance)·(draws of the record), record by record or batched."""
    from aggregator.state import doubling_draws

    mech = runtime.schema.zil_mechanism()
    sd = np.sqrt(mech.zero_prob * mech.noise_variance)
    batches = [runtime.decode(r) for r in records[:4]]
    for r, b in zip(records, batches, strict=False):
        want = b.numeric + sd * doubling_draws([r], [b.n], mech.dim)
        np.testing.assert_allclose(runtime.double(b, r), want, rtol=1e-15, atol=0)
    joined, _ = runtime.decode_many(records[:4])
    one_by_one = [runtime.double(b, r) for r, b in zip(records, batches, strict=False)]
    assert np.array_equal(runtime.double_many(joined, records[:4], [b.n for b in batches]),
                          np.concatenate(one_by_one))


def _with_update_thread(w):
    w.threads.start()
    return w


def test_updates_on_the_update_thread_equal_inline_updates(runtime, records):
    inline, bg = make_worker(runtime), _with_update_thread(make_worker(runtime, overlap=True))
    recs = [rec(i, r) for i, r in enumerate(records)]
    for w in (inline, bg):
        w.process(0, recs[:5])
        w.process(0, recs[5:])
        assert w.checkpoint(force=True) == 1
    (_, _, a, _), (_, _, b, _) = inline.producer.sent[-1], bg.producer.sent[-1]
    ca, cb = Checkpoint.from_bytes(a), Checkpoint.from_bytes(b)
    assert ca.states == cb.states and ca.next_offset == cb.next_offset == len(records)
    bg.threads.shutdown()


@pytest.mark.parametrize("overlap", [False, True])
def test_a_failed_update_stops_checkpoints(runtime, records, overlap, caplog):
    """Offsets move past a batch before its update completes: after a failed update no checkpoint
    may be published (it would skip the batch); the worker stops and replays from the last one."""
    w = make_worker(runtime, overlap=overlap)
    if overlap:
        _with_update_thread(w)
    w.process(0, [rec(0, records[0])])
    assert w.checkpoint(force=True) == 1
    sent = len(w.producer.sent)
    st = next(iter(w.owned[0].states.values()))

    def boom(batch, x2):
        raise RuntimeError("state update failed")

    st.update = boom
    if overlap:
        w.process(0, [rec(1, records[1])])  # submitted; the failure surfaces at the next wait
        with pytest.raises(RuntimeError, match="state update failed"):
            w.checkpoint(force=True)
    else:
        with pytest.raises(RuntimeError, match="state update failed"):
            w.process(0, [rec(1, records[1])])
    with pytest.raises(Exception, match="state update failed"):
        w.checkpoint(force=True)
    with pytest.raises(RuntimeError):
        w.process(0, [rec(2, records[2])])
    w.shutdown()
    assert len(w.producer.sent) == sent  # nothing published after the failure
    assert "no final checkpoint" in caplog.text


class FakeConsumer:
    """``poll`` hands out the given poll results, then nothing (after a short wait)."""

    def __init__(self, polls, on_poll=None):
        self.polls = list(polls)
        self.calls = 0
        self.on_poll = on_poll
        self.commits = []

    def poll(self, timeout_ms=0, max_records=None):
        self.calls += 1
        if self.on_poll is not None:
            self.on_poll(self.calls)
        if self.polls:
            return self.polls.pop(0)
        time.sleep(0.005)
        return {}

    def subscribe(self, topics, listener=None):
        self.subscribed = (list(topics), listener)

    def highwater(self, tp):
        return None

    def commit(self, offsets):
        self.commits.append(offsets)

    def close(self, autocommit=True, timeout_ms=None):
        pass


def _run_on(w, max_reports):
    """``w.run`` over the worker's fake consumer."""
    return w.run(max_reports=max_reports)


def _polls(records, sizes):
    from kafka import TopicPartition

    tp, out, start = TopicPartition("reports", 0), [], 0
    for n in sizes:
        out.append({tp: [rec(start + i, records[start + i]) for i in range(n)]})
        start += n
    return out


def _inline_checkpoint(runtime, records, sizes):
    """The checkpoint of a worker without threads that folds the polls of ``_polls(records,
    sizes)`` one by one in the calling thread (the reference for the threaded runs)."""
    ref = make_worker(runtime)
    for got in _polls(records, sizes):
        (recs,) = got.values()
        ref.process(0, recs)
    ref.checkpoint(force=True)
    return Checkpoint.from_bytes(ref.producer.sent[-1][2])


@pytest.mark.parametrize("overlap", [False, True])
def test_run_folds_every_poll_and_the_final_checkpoint_holds_them(runtime, records, overlap):
    """run() with the fold and update threads (overlap) ends with the same states, offsets and
    counts as everything inline in the main thread."""
    w = make_worker(runtime, overlap=overlap, consumer=FakeConsumer(_polls(records, [3, 4, 5])))
    n = _run_on(w, max_reports=12 * 7)
    assert n == w.processed_reports == 12 * 7 and w.processed_records == 12
    ck = Checkpoint.from_bytes(w.producer.sent[-1][2])
    want = _inline_checkpoint(runtime, records, [3, 4, 5])
    assert ck.next_offset == want.next_offset == 12 and ck.reports == want.reports
    assert ck.states == want.states
    assert w.threads.folder is None and w.threads.updater is None  # both threads shut down


def test_the_main_thread_polls_again_while_the_previous_poll_is_folded(runtime, records):
    """The fold of poll 1 cannot finish until poll 2 has been called: with the fold in the main
    thread this would never happen (the wait times out and the test fails)."""
    import threading

    second_poll = threading.Event()
    consumer = FakeConsumer(_polls(records, [6, 6]), on_poll=lambda k: k == 2 and second_poll.set())
    w = make_worker(runtime, overlap=True, consumer=consumer)
    inner = w.process
    seen = []

    def process(partition, recs):
        if not seen:
            seen.append(second_poll.wait(timeout=10))
        return inner(partition, recs)

    w.process = process
    assert _run_on(w, max_reports=12 * 7) == 12 * 7
    assert seen == [True]


class _UnackedProducer(FakeProducer):
    """Records stay unacknowledged until ``flush`` (or a test sets ``is_done``)."""

    def __init__(self):
        super().__init__()
        self.futures = []

    def send(self, topic, key=None, value=None, headers=None):
        self.sent.append((topic, key, value, dict(headers or [])))
        self.futures.append(FakeFuture(done=False))
        return self.futures[-1]

    def flush(self, timeout=None):
        for f in self.futures:
            f.is_done = True


def test_checkpoints_due_in_run_are_sent_by_the_update_thread_and_committed_once_acknowledged(
        runtime, records):
    """With overlap, a due checkpoint is marked on the fold thread and sent by the update thread;
    neither waits for the broker: the main thread polls twice more before the records are
    acknowledged. Offsets are committed on the main thread (kafka-python's consumer is not
    thread-safe), and only for acknowledged checkpoints."""
    import threading

    class AckLaterProducer(_UnackedProducer):
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
    consumer = Consumer(_polls(records, [2] * 6), on_poll=lambda calls: w.producer.ack(calls))
    w = make_worker(runtime, overlap=True, checkpoint_reports=14,  # due after every 2 records
                    producer=AckLaterProducer(), consumer=consumer)
    inner_shutdown = w.shutdown
    w.shutdown = lambda: (shutting.append(1), inner_shutdown())
    assert _run_on(w, max_reports=12 * 7) == 12 * 7
    background = w.producer.threads[:-1]  # the last one is the final checkpoint's (main thread)
    assert background and all(name.startswith("ldp-update") for name in background)
    assert len(commits) >= 2 and all(name == "MainThread" and acked for name, _, acked in commits)
    # only the final checkpoint (and the one on its way then) waits for the broker
    assert w.producer.flushes and set(w.producer.flushes) == {("MainThread", True)}
    assert [o for _, _, o in commits] == sorted(o for _, _, o in commits) and commits[-1][1] == 12
    # the states sent in the background are those of an inline fold of the same polls
    first = next(v for t, _, v, _ in w.producer.sent if t == "state")
    ck = Checkpoint.from_bytes(first)
    assert ck.states == _inline_checkpoint(runtime, records, [2] * (ck.next_offset // 2)).states
    assert ck.reports == ck.next_offset * 7 and ck.records == ck.next_offset


def test_a_broker_error_while_publishing_in_the_background_is_retried(runtime, records, caplog):
    from kafka.errors import KafkaTimeoutError

    consumer = FakeConsumer(_polls(records, [2] * 6))
    w = make_worker(runtime, overlap=True, checkpoint_reports=14, consumer=consumer,
                    producer=FakeProducer(error=KafkaTimeoutError("broker away")))
    w.broker_trouble = lambda what, exc: w.producer.__setattr__("error", None)  # broker back
    assert _run_on(w, max_reports=12 * 7) == 12 * 7
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
    consumer = FakeConsumer(_polls(records, [2] * 6))
    w = make_worker(runtime, overlap=True, checkpoint_reports=14, producer=NoMetadataOnce(),
                    consumer=consumer)
    w.broker_trouble = lambda what, exc: troubles.append((what, type(exc).__name__))
    assert _run_on(w, max_reports=12 * 7) == 12 * 7
    assert troubles == [("checkpoint", "KafkaTimeoutError")] and w.threads.failure is None
    assert consumer.commits and consumer.commits[-1][next(iter(consumer.commits[-1]))].offset == 12
    assert Checkpoint.from_bytes(w.producer.sent[-1][2]).states == \
        _inline_checkpoint(runtime, records, [2] * 6).states


def _state_offsets(producer):
    return [Checkpoint.from_bytes(v).next_offset for t, _, v, _ in producer.sent if t == "state"]


def test_a_checkpoint_begun_before_a_partition_is_lost_is_not_sent_after_the_loss(runtime, records):
    """kafka-python reports a loss without a drain: a snapshot still queued behind an update must
    not publish the lost partition (its next owner may already have published a later one)."""
    import threading

    from kafka import TopicPartition

    w = _with_update_thread(make_worker(runtime, overlap=True))
    gate = threading.Event()
    st = next(iter(w.owned[0].states.values()))
    inner = st.update
    st.update = lambda batch, x2: (gate.wait(10), inner(batch, x2))
    w.process(0, [rec(i, records[i]) for i in range(2)])  # its update waits for the gate
    w.checkpoints.in_flight = w.checkpoints.begin()  # queued behind that update
    w.on_lost([TopicPartition("reports", 0)])
    gate.set()
    w.checkpoints.check(block=True)
    assert _state_offsets(w.producer) == [] and w.consumer.commits == []
    w.threads.shutdown()


def test_offsets_of_a_partition_revoked_while_its_checkpoint_was_on_its_way_are_not_committed(runtime,
                                                                                              records):
    """The revoke publishes the partition itself; committing the older checkpoint's offsets
    afterwards could move the group's offset back behind the next owner's."""
    from kafka import TopicPartition

    w = _with_update_thread(make_worker(runtime, overlap=True, producer=_UnackedProducer()))
    w.process(0, [rec(i, records[i]) for i in range(2)])
    cp = w.checkpoints
    cp.in_flight = cp.begin()
    cp.in_flight.snapshot.result(timeout=10)
    assert not cp.in_flight.acknowledged()
    w.on_revoked([TopicPartition("reports", 0)])  # drains, publishes and flushes partition 0
    assert cp.in_flight.acknowledged()
    cp.check(block=False)
    assert _state_offsets(w.producer) == [2, 2] and w.consumer.commits == []
    # with the partition still owned, the same sequence commits
    w2 = _with_update_thread(make_worker(runtime, overlap=True, producer=_UnackedProducer()))
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

    w = _with_update_thread(make_worker(runtime, overlap=True, producer=Broken()))
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
                    consumer=FakeConsumer(_polls(records, [4, 3, 4, 1])))
    inner, threads = w.process, []

    def process(partition, recs):
        threads.append((len(recs), threading.current_thread().name))
        return inner(partition, recs)

    w.process = process
    assert _run_on(w, max_reports=12 * 7) == 12 * 7
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
        w.fold_poll(_polls(records, [2])[0])
    assert failure_at_release == [True]
    w.on_revoked([next(iter(_polls(records, [1])[0]))])  # the callback that got the lock next
    assert w.producer.sent == []


def test_an_idle_worker_commits_a_checkpoint_published_in_the_background(runtime, records):
    """The offsets of a checkpoint published on the fold thread are committed although no further
    record arrives (the main loop collects finished fold-thread tasks on every turn)."""
    import threading

    consumer = FakeConsumer(_polls(records, [2, 2]))
    w = make_worker(runtime, overlap=True, checkpoint_reports=28,  # due once 4 records are in
                    consumer=consumer)
    t = threading.Thread(target=_run_on, args=(w, None))
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
    w = make_worker(runtime, overlap=True, consumer=FakeConsumer(_polls(records, [2, 2, 2])))

    def boom(partition, recs):
        raise RuntimeError("fold failed")

    w.process = boom
    with pytest.raises(RuntimeError, match="fold failed"):
        _run_on(w, max_reports=12 * 7)
    assert w.producer.sent == []  # offsets moved past records that are in no state
    assert "no final checkpoint" in caplog.text


def test_runtime_without_batched_hooks_decodes_and_doubles_record_by_record(runtime, records):
    """A hand-built PipelineRuntime (only decode/double) gives decode_many/double_many results equal
    to the batched ones of PipelineRuntime.from_config."""
    plain = PipelineRuntime(runtime.name, runtime.fingerprint, runtime.decode, runtime.new_states,
                            runtime.restore_state, runtime.double, schema=runtime.schema)
    values = [records[0], b"garbage", records[1], records[2]]
    (b1, r1), (b2, r2) = runtime.decode_many(values), plain.decode_many(values)
    assert [type(r) for r in r1] == [type(r) for r in r2] and r1[0] == r2[0] == 7
    np.testing.assert_array_equal(b1.numeric, b2.numeric)
    good = [v for v, r in zip(values, r1, strict=True) if isinstance(r, int)]
    counts = [r for r in r1 if isinstance(r, int)]
    x_fast, x_plain = runtime.double_many(b1, good, counts), plain.double_many(b2, good, counts)
    np.testing.assert_array_equal(x_fast, x_plain)
    assert not np.array_equal(x_fast[:7], x_fast[7:14])  # each record has its own seed


class _Coordinator:
    def __init__(self):
        self.resets = 0

    def reset_generation(self):
        self.resets += 1


class _GroupConsumer(FakeConsumer):
    def __init__(self):
        super().__init__([])
        self._coordinator = _Coordinator()
        self.closed = []

    def close(self, autocommit=True, timeout_ms=None):
        self.closed.append(autocommit)


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

    consumer = _GroupConsumer()
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


class _ClosingProducer(FakeProducer):
    def __init__(self, error=None):
        super().__init__(error)
        self.closed = []

    def close(self, timeout=None):
        self.closed.append(timeout)


@pytest.mark.parametrize("fail", [False, True])
def test_shutdown_closes_the_clients_within_a_limit_and_flags_a_failed_final_checkpoint(runtime, records,
                                                                                         fail):
    """The producer and the consumer are closed with CLOSE_TIMEOUT_S (kafka-python's producer
    waits without limit by default: a hung broker kept a stopped worker alive); a final
    checkpoint that fails sets ``final_checkpoint_failed`` (the CLI exits 1 on it)."""
    from kafka import TopicPartition

    from ingest.kafka import CLOSE_TIMEOUT_S

    consumer = _GroupConsumer()
    consumer.close = lambda autocommit=True, timeout_ms=None: consumer.closed.append(timeout_ms)
    consumer.pause = lambda *tps: None
    w = make_worker(runtime, consumer=consumer,
                    producer=_ClosingProducer(error=RuntimeError("broker hung") if fail else None))
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

    consumer = _GroupConsumer()
    consumer.pause = lambda *tps: None
    tps = [TopicPartition("reports", p) for p in (0, 2)]
    w = make_worker(runtime, consumer=consumer, producer=_ClosingProducer())

    def close(autocommit=True, timeout_ms=None):
        w.on_revoked(tps)  # what kafka-python's close() does before LeaveGroup
        consumer.closed.append(timeout_ms)

    consumer.close = close
    w.on_assigned(tps)  # the assignment is in force (LeaveGroup on close) …
    w.pending.clear()
    w.owned[2] = PartitionState(2, 0, runtime.new_states())  # … and both partitions restored
    w.shutdown()
    assert w.owned == {} and w.owned_at_stop == [0, 2]
