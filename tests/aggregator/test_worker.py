"""Unit tests of the worker's record handling, checkpoints and metrics (no broker)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from aggregator.checkpoint import Checkpoint, CheckpointError, checkpoint_key, parse_checkpoint_key
from aggregator.errors import ConfigError
from aggregator.metrics import METRIC_NAMES, ServeMetrics, WorkerMetrics
from aggregator.worker import KafkaClients, PipelineRuntime, Worker, concat_batches
from tests.aggregator.worker_support import (
    FakeConsumer,
    FakeProducer,
    build_records,
    build_runtime,
    make_worker,
    rec,
    with_update_thread,
)
from tests.integration import pipeline_support as ps


@pytest.fixture(scope="module")
def runtime():
    return build_runtime()


@pytest.fixture(scope="module")
def records(runtime):
    return build_records(runtime)


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


def _gap_count(w) -> float:
    return ps.metric_value(w.metrics.exposition().decode(), "ldp_offset_gap_records_total", 'partition="0"')


def test_offset_gap_counted_once_fetched_again(runtime, records):
    """A gap is fetched once more from its first offset before it is believed and counted;
    records of the partition fetched before that seek are not folded."""
    w = make_worker(runtime)
    w.process(0, [rec(0, records[0]), rec(5, records[1])])
    assert w.owned[0].next_offset == 1 and w.owned[0].records == 1  # offset 5 waits for the refetch
    w.process(0, [rec(6, records[2])])  # fetched before the seek: dropped, fetched again after it
    assert w.owned[0].next_offset == 1 and _gap_count(w) == 0
    w.refetch_gaps()
    assert w.consumer.seeks == [(0, 1)]
    w.refetch_gaps()  # once per gap
    assert w.consumer.seeks == [(0, 1)]
    w.process(0, [rec(5, records[1]), rec(6, records[2])])  # the same gap after the refetch: believed
    assert w.owned[0].next_offset == 7 and w.owned[0].records == 3
    assert _gap_count(w) == 4


def test_a_record_left_out_of_a_fetch_is_folded_when_fetched_again(runtime, records):
    w = make_worker(runtime)
    w.process(0, [rec(0, records[0]), rec(2, records[2])])
    w.refetch_gaps()
    w.process(0, [rec(1, records[1]), rec(2, records[2]), rec(3, records[3])])
    assert w.owned[0].next_offset == 4 and w.owned[0].records == 4 and _gap_count(w) == 0
    assert not w.folder.refetch


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


def test_updates_on_the_update_thread_equal_inline_updates(runtime, records):
    inline, bg = make_worker(runtime), with_update_thread(make_worker(runtime, overlap=True))
    recs = [rec(i, r) for i, r in enumerate(records)]
    for w in (inline, bg):
        w.process(0, recs[:5])
        w.process(0, recs[5:])
        assert w.checkpoint(force=True) == 1
    (_, _, a, _), (_, _, b, _) = inline.producer.sent[-1], bg.producer.sent[-1]
    ca, cb = Checkpoint.from_bytes(a), Checkpoint.from_bytes(b)
    assert ca.states == cb.states and ca.next_offset == cb.next_offset == len(records)
    bg.threads.shutdown()


class Fatal(BaseException):
    """Not an ``Exception``: what no partition's recovery may swallow (as KeyboardInterrupt)."""


@pytest.mark.parametrize("overlap", [False, True])
def test_a_fatal_update_stops_checkpoints(runtime, records, overlap, caplog):
    """Offsets move past a batch before its update completes: after an update that raised a
    ``BaseException`` that is no ``Exception`` no checkpoint may be published (it would skip the
    batch); the worker stops and replays from the last one."""
    w = make_worker(runtime, overlap=overlap)
    if overlap:
        with_update_thread(w)
    w.process(0, [rec(0, records[0])])
    assert w.checkpoint(force=True) == 1
    sent = len(w.producer.sent)
    st = next(iter(w.owned[0].states.values()))

    def boom(batch, x2):
        raise Fatal("state update failed")

    st.update = boom
    if overlap:
        w.process(0, [rec(1, records[1])])  # submitted; the failure surfaces at the next wait
        with pytest.raises(Fatal, match="state update failed"):
            w.checkpoint(force=True)
    else:
        with pytest.raises(Fatal, match="state update failed"):
            w.process(0, [rec(1, records[1])])
    with pytest.raises(BaseException, match="state update failed"):
        w.checkpoint(force=True)
    with pytest.raises(Fatal):
        w.process(0, [rec(2, records[2])])
    w.shutdown()
    assert len(w.producer.sent) == sent  # nothing published after the failure
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


def _refusing(st, refuse):
    """Make ``st.update`` raise ``ValueError`` for a batch ``refuse(batch)`` is true of."""
    inner = st.update

    def update(batch, x2):
        if refuse(batch):
            raise ValueError("this state cannot take it")
        inner(batch, x2)

    st.update = update


@pytest.mark.parametrize("overlap", [False, True])
def test_a_refused_update_drops_only_its_partition(runtime, records, overlap):
    """A state's ``Exception`` on a batch of partition 0 marks that partition rejected (the batch's
    end and the error), never raises out of the worker, publishes no further checkpoint of it
    while partition 1 goes on, and :meth:`Worker.recover_rejected` drops, pauses and queues it
    for a restore whose records up to that end are folded carefully."""
    from kafka import TopicPartition

    from aggregator.worker import PartitionState

    w = make_worker(runtime, overlap=overlap)
    if overlap:
        with_update_thread(w)
    w.owned[1] = PartitionState(1, 0, runtime.new_states())
    w.process(0, [rec(0, records[0])])
    w.process(1, [rec(0, records[1], partition=1)])
    assert w.checkpoint(force=True) == 2
    _refusing(list(w.owned[0].states.values())[-1], lambda b: True)
    w.process(0, [rec(1, records[2]), rec(2, records[3])])
    w.process(0, [rec(3, records[4])])  # after the refusal: skipped
    w.process(1, [rec(1, records[5], partition=1)])
    sent = len(w.producer.sent)
    assert w.checkpoint(force=True) == 1  # partition 1 only
    (_, key, value, _), = w.producer.sent[sent:]
    assert key == checkpoint_key(runtime.name, 1) and Checkpoint.from_bytes(value).next_offset == 2
    assert w.owned[0].rejected == (3, "ValueError: this state cannot take it")
    assert w.threads.failure is None
    assert w.recover_rejected() == 1
    assert set(w.owned) == {1} and w.folder.careful == {0: 3}
    assert w.pending == {TopicPartition("reports", 0)} == w.consumer.paused
    assert 'partition="0"' in w.metrics.exposition().decode().split("ldp_partition_recoveries_total")[-1][:40]
    assert w.recover_rejected() == 0
    w.shutdown()
    assert all(k != checkpoint_key(runtime.name, 0) for _, k, _, _ in w.producer.sent[sent + 1:])


def test_a_fold_that_raises_marks_its_partition_rejected(runtime, records, monkeypatch):
    w = make_worker(runtime)
    monkeypatch.setattr(w.runtime, "double_many", lambda *a: (_ for _ in ()).throw(RuntimeError("no")))
    assert w.process(0, [rec(0, records[0]), rec(1, records[1])]) == 0
    assert w.owned[0].rejected == (2, "RuntimeError: no")


@pytest.mark.parametrize("overlap", [False, True])
def test_careful_folding_dead_letters_the_refused_record_and_rolls_back(runtime, records, overlap):
    """Below ``careful[p]`` records are folded one at a time: the one a state refuses goes to the
    dead-letter topic (``state_rejected``, the error in a header), the states that took it before
    the refusing one are rolled back, and the result equals a record-by-record pass over the other
    records; from ``careful[p]`` on the worker folds as usual."""
    poison = ps.make_records(runtime.schema, n_records=1, per_record=3, seed=9)[0]
    stream = [*records[:5], poison, *records[5:]]  # offsets 0..12, the poison at 5
    w = make_worker(runtime, overlap=overlap)
    if overlap:
        with_update_thread(w)
    w.folder.careful[0] = 12
    _refusing(list(w.owned[0].states.values())[-1], lambda b: b.n == 3)  # the last: others roll back
    recs = [rec(i, v) for i, v in enumerate(stream)]
    assert w.process(0, recs[:4]) == 4 * 7
    assert w.process(0, recs[4:12]) == 7 * 7 and w.folder.careful == {0: 12}
    assert w.process(0, recs[12:]) == 7 and w.folder.careful == {}  # at 12: as usual again
    w.checkpoint(force=True)
    dl = [(v, h) for t, _, v, h in w.producer.sent if t == "dlq"]
    assert len(dl) == 1 and dl[0][0] == poison
    h = {k: v.decode() for k, v in dl[0][1].items()}
    assert h["reason"] == "state_rejected" and h["source_offset"] == "5"
    assert h["error"] == "ValueError: this state cannot take it"
    assert 'reason="state_rejected"' in w.metrics.exposition().decode()
    got = Checkpoint.from_bytes(w.producer.sent[-1][2])
    ref = make_worker(runtime, coalesce=False)
    for i, v in enumerate(records):
        ref.process(0, [rec(i, v)])
    ref.checkpoint(force=True)
    want = Checkpoint.from_bytes(ref.producer.sent[-1][2])
    assert (got.next_offset, got.reports, got.records) == (13, 12 * 7, 12) == (13, want.reports, 12)
    assert got.states == want.states  # one update per record in both: bit-identical
    w.shutdown()
