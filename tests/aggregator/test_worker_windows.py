"""The worker with windowed queries (aggregator/worker/fold.py, checkpointing.py) over the fake
clients of worker_support: record timestamps as event times, event_time_skew dead letters, the
late counter, and pane records sent before their partition's checkpoint and dropped from the
partition state only once durable."""

from __future__ import annotations

import tomllib
import types

import numpy as np
import pytest
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError

from aggregator.checkpoint import Checkpoint, pane_key, parse_state_key
from aggregator.config import PipelineConfig
from aggregator.state import STATE_CLASSES, State, build_state
from aggregator.worker import PartitionState, PipelineRuntime
from ingest.client.batch import with_event_time
from tests.aggregator._state_support import make_schema
from tests.aggregator.worker_support import (
    FakeFuture,
    FakeProducer,
    UnackedProducer,
    build_records,
    make_worker,
)
from tests.integration import pipeline_support as ps

T0 = 1_356_998_400  # 2013-01-01T00:00:00Z
HOUR = 3600
Y2099 = 4_070_908_800  # 2099-01-01T00:00:00Z

QUERIES = """
[[queries]]
kind = "mean"
name = "m"
field = "a"
window = { size = "1h" }

[[queries]]
kind = "frequency"
name = "c"
field = "c"
window = { size = "2h", hop = "1h", grace = "5m" }

[[queries]]
kind = "mean"
name = "tot"
field = "a"
"""
PLAIN_M = {"kind": "mean", "name": "m", "field": "a"}


def config_runtime(schema_path, queries=QUERIES) -> PipelineRuntime:
    text = (f'[pipeline]\nname = "flights"\nschema = "{schema_path}"\n'
            '[kafka]\nbootstrap_servers = "127.0.0.1:9"\n')
    return PipelineRuntime.from_config(PipelineConfig.from_dict(tomllib.loads(text + queries)))


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """A pipeline over a schema without a time column: the Kafka timestamps are the event times."""
    path = tmp_path_factory.mktemp("schema") / "s.schema.toml"
    path.write_text(make_schema().dumps_toml())
    rt = config_runtime(path)
    assert rt.windowed == ("m", "c") and rt.schema.event_time is None
    return rt


@pytest.fixture(scope="module")
def records(runtime):
    return build_records(runtime)  # 12 records of 7 reports


def trec(offset, value, ts_s, partition=0):
    """A ConsumerRecord with a Kafka timestamp of ``ts_s`` seconds (+ 999 ms: floored)."""
    ts = None if ts_s is None else int(ts_s) * 1000 + 999
    return types.SimpleNamespace(topic="reports", partition=partition, offset=offset, key=None, value=value,
                                 timestamp=ts)


def stamped(records, times, start=0):
    return [trec(start + i, r, t) for i, (r, t) in enumerate(zip(records, times, strict=True))]


def plain_of(runtime, values):
    """The unwindowed mean of arr_delay fed ``values`` record by record."""
    st = build_state(PLAIN_M, runtime.schema)
    for v in values:
        b = runtime.decode(v)
        st.update(b, runtime.double(b, v))
    return st


def metric(w, name, labels=""):
    return ps.metric_value(w.metrics.exposition().decode(), name, labels)


# ------------------------------------------------------------------ event times
@pytest.mark.parametrize("coalesce", [True, False])
def test_record_timestamps_become_event_times(runtime, records, coalesce):
    times = [T0 + 600 * i for i in range(12)]  # 2 h: records 0–5 in pane T0, 6–11 in T0 + 1h
    w = make_worker(runtime, coalesce=coalesce)
    assert w.process(0, stamped(records, times)) == 84
    st = w.owned[0].states["m"]
    assert st.max_event_time == T0 + 6600 and st.late == 0 and st.n == 84
    assert sorted(st.pane_states()) == [T0, T0 + HOUR]
    assert list(st.closed) == [T0]  # its end T0 + 1h ≤ the watermark T0 + 6600
    for start, vals in ((T0, records[:6]), (T0 + HOUR, records[6:])):
        pane, want = st.pane_states()[start], plain_of(runtime, vals)
        assert pane.n == want.n == 42
        np.testing.assert_allclose(pane.estimate().value, want.estimate().value, rtol=1e-12)
    c = w.owned[0].states["c"]
    assert c.n == 84 and sorted(c.pane_states()) == [T0, T0 + HOUR]
    assert w.owned[0].states["tot"].n == 84


def test_polls_and_paths_give_the_same_states(runtime, records):
    """One contiguous poll, polls of a few records, and record by record: identical states."""
    times = [T0 + 600 * i for i in range(12)]
    recs = stamped(records, times)
    a, b, c = make_worker(runtime), make_worker(runtime), make_worker(runtime, coalesce=False)
    a.process(0, recs)
    for lo, hi in ((0, 5), (5, 6), (6, 12)):
        b.process(0, recs[lo:hi])
    c.process(0, recs)
    for name in ("m", "c"):
        sa, sb, sc = (w.owned[0].states[name] for w in (a, b, c))
        assert set(sa.panes) == set(sb.panes) == set(sc.panes)
        assert set(sa.closed) == set(sb.closed) == set(sc.closed)
        for start, pane in sa.pane_states().items():
            for other in (sb, sc):
                np.testing.assert_allclose(other.pane_states()[start].estimate().value, pane.estimate().value,
                                           rtol=1e-12)
    assert c.owned[0].states["c"].to_bytes() == b.owned[0].states["c"].to_bytes() == \
        a.owned[0].states["c"].to_bytes()  # counts: bit-identical


def test_a_record_without_timestamp_counts_as_time_zero(runtime, records):
    w = make_worker(runtime)
    w.process(0, [trec(0, records[0], None), trec(1, records[1], T0)])
    st = w.owned[0].states["m"]
    assert sorted(st.pane_states()) == [0, T0] and st.late == 0
    w.process(0, [trec(2, records[2], None)])  # now pane 0 has closed: late
    assert st.late == 7 and st.n == 14


# ------------------------------------------------------------------ event_time_skew
def timed_runtime(base, times_of):
    """``base`` whose decoder attaches the event times ``times_of[record bytes]`` (as a schema with
    a time column would: the record's own times, not its Kafka timestamp)."""
    def decode(value):
        return with_event_time(base.decode(value), times_of[bytes(value)])

    def decode_many(values):
        batch, results = base.decode_many(values)
        if batch is None:
            return batch, results
        t = [times_of[bytes(v)] for v, r in zip(values, results, strict=True) if isinstance(r, int)]
        return with_event_time(batch, np.concatenate(t)), results

    return PipelineRuntime(base.name, base.fingerprint, decode, base.new_states, base.restore_state,
                           base.double, queries=base.queries, schema=base.schema, decode_many=decode_many,
                           double_many=base.double_many, losses=base.losses)


@pytest.mark.parametrize("coalesce", [True, False])
def test_a_record_from_2099_is_dead_lettered_and_the_others_folded(runtime, records, coalesce):
    ts = [T0 + 600 * i + 10 for i in range(12)]
    times_of = {r: np.arange(7, dtype=np.int64) + t - 10 for r, t in zip(records, ts, strict=True)}
    times_of[records[5]] = times_of[records[5]].copy()
    times_of[records[5]][3] = Y2099  # one device with its clock in 2099
    times_of[records[7]] = times_of[records[7]] + 1000  # ahead, but within max_event_time_skew_s
    rt = timed_runtime(runtime, times_of)
    w = make_worker(rt, coalesce=coalesce)
    assert w.process(0, stamped(records, ts)) == 77
    dlq = [(k, v, h) for topic, k, v, h in w.producer.sent if topic == "dlq"]
    assert len(dlq) == 1
    _, value, headers = dlq[0]
    assert value == records[5]
    assert headers["reason"] == b"event_time_skew" and headers["source_offset"] == b"5"
    assert metric(w, "ldp_records_dead_lettered_total", 'reason="event_time_skew"') == 1
    part = w.owned[0]
    assert (part.next_offset, part.records, part.reports) == (12, 11, 77)  # nothing lost
    good = records[:5] + records[6:]
    w.threads.drain()
    tot = part.states["tot"]
    assert tot.n == 77
    np.testing.assert_allclose(tot.estimate().value, plain_of(runtime, good).estimate().value, rtol=1e-12)
    m = part.states["m"]
    assert m.n == 77 and m.late == 0
    assert m.max_event_time == T0 + 6606  # the 2099 report did not move the watermark
    assert sum(p.n for p in m.pane_states().values()) == 77
    for start, pane in m.pane_states().items():
        vals = [r for r in good if (int(times_of[r][0]) // HOUR) * HOUR == start]
        assert pane.n == 7 * len(vals)
        want = plain_of(runtime, vals).estimate().value
        np.testing.assert_allclose(pane.estimate().value, want, rtol=1e-12)


def test_the_skew_bound_is_inclusive(runtime, records):
    ts = [T0 + 100 * i for i in range(3)]
    times_of = {r: np.full(7, t, dtype=np.int64) for r, t in zip(records[:3], ts, strict=True)}
    times_of[records[1]] = np.full(7, ts[1] + 600, dtype=np.int64)  # exactly the bound: kept
    times_of[records[2]] = np.full(7, ts[2] + 601, dtype=np.int64)  # one second past: refused
    w = make_worker(timed_runtime(runtime, times_of), max_event_time_skew_s=600)
    assert w.process(0, stamped(records[:3], ts)) == 14
    assert [h["source_offset"] for t, _, _, h in w.producer.sent if t == "dlq"] == [b"2"]


def test_without_windowed_queries_event_times_are_not_needed():
    """A pipeline with no windowed query never looks at timestamps (records without one fold)."""
    from tests.aggregator.worker_support import build_runtime, rec

    rt = build_runtime()
    assert rt.windowed == ()
    w = make_worker(rt)
    assert w.process(0, [rec(i, r) for i, r in enumerate(build_records(rt)[:3])]) == 21


def test_event_times_of_a_time_column_and_a_device_in_2099(records):
    """The flights schema sends its time column (time_hour, 1 h) with the reports: those are the
    event times, not the Kafka timestamps; a record holding a report dated 2099 is dead-lettered."""
    from ingest.client.codec import encode
    from ingest.client.privatizer import Privatizer

    rt = config_runtime(ps.SCHEMA, QUERIES.replace('"a"', '"arr_delay"').replace('"c"\n', '"carrier"\n'))
    schema = rt.schema
    assert schema.event_time is not None and schema.time_resolution_s == HOUR
    rng = np.random.default_rng(70)
    priv = Privatizer(schema, rng=rng)
    zil = schema.zil_mechanism()
    values, times = [], []
    for i in range(6):
        cols = {name: zil.low[j] + (zil.high[j] - zil.low[j]) * rng.beta(2.0, 5.0, 5)
                for j, name in enumerate(schema.numeric_names)}
        for c in schema.categorical:
            cols[c.name] = np.asarray(list(c.categories), dtype=object)[rng.integers(0, c.k, 5)]
        t = T0 + i * HOUR + rng.integers(0, HOUR, 5)
        if i == 3:
            t[2] = Y2099
        cols[schema.event_time.field] = t.astype(np.int64)
        values.append(encode(priv.privatize_batch(cols), time_resolution=schema.time_resolution_s))
        times.append(t)
    w = make_worker(rt)
    ts = [T0 + 6 * HOUR] * 6  # the producer's clock: after every event
    assert w.process(0, stamped(values, ts)) == 25
    assert [h["reason"] for t, _, _, h in w.producer.sent if t == "dlq"] == [b"event_time_skew"]
    m = w.owned[0].states["m"]
    assert sorted(m.pane_states()) == [T0 + i * HOUR for i in (0, 1, 2, 4, 5)]  # hour 3 dead-lettered
    assert m.max_event_time == max(int(t.max()) // HOUR * HOUR for i, t in enumerate(times) if i != 3)


# ------------------------------------------------------------------ late reports
def test_late_reports_are_counted_per_query(runtime, records):
    w = make_worker(runtime)
    w.process(0, [trec(0, records[0], T0 + 2 * HOUR), trec(1, records[1], T0 + 100),
                  trec(2, records[2], T0 + 2 * HOUR + 10)])
    m, c = w.owned[0].states["m"], w.owned[0].states["c"]
    # m: pane [T0, T0+1h) ended before T0+2h; c (grace 5 min): also ended before T0+2h − 5 min
    assert (m.late, m.n, c.late, c.n) == (7, 14, 7, 14)
    assert w.owned[0].states["tot"].n == 21
    assert metric(w, "ldp_reports_late_total", 'query="m"') == 7
    assert metric(w, "ldp_reports_late_total", 'query="c"') == 7
    # pane [T0+1h, T0+2h) ended before T0+2h+10: late for m; not for c, whose grace of 5 min
    # puts its watermark at T0+2h+10−300
    w.process(0, [trec(3, records[3], T0 + HOUR + 3000)])
    assert (m.late, m.n, c.late, c.n) == (14, 14, 7, 21)
    assert metric(w, "ldp_reports_late_total", 'query="m"') == 14
    assert metric(w, "ldp_reports_late_total", 'query="c"') == 7


def test_late_counter_after_a_restore(runtime, records):
    w = make_worker(runtime)
    w.process(0, [trec(0, records[0], T0 + 2 * HOUR), trec(1, records[1], T0 + 10)])
    assert metric(w, "ldp_reports_late_total", 'query="m"') == 7
    ck = w.owned[0].to_checkpoint(runtime)
    restored = {n: runtime.restore_state(n, b) for n, b in ck.states.items()}
    assert restored["m"].late == 7 and restored["m"].late_listener is None
    w.owned[0] = PartitionState(0, ck.next_offset, restored, ck.reports, ck.records, ck.next_offset)
    w.process(0, [trec(2, records[2], T0 + 20)])
    assert restored["m"].late == 14
    assert metric(w, "ldp_reports_late_total", 'query="m"') == 14


# ------------------------------------------------------------------ pane records
def _state_records(producer):
    """``[(key, value)]`` sent to the state topic, in order."""
    return [(k, v) for topic, k, v, _ in producer.sent if topic == "state"]


def _ck_states(runtime, value):
    ck = Checkpoint.from_bytes(value)
    return ck, {n: runtime.restore_state(n, b) for n, b in ck.states.items()}


TIMES = [T0 + 600 * i + 10 for i in range(12)]  # poll 1: records 0–6 (pane T0 closes at record 6)


def test_pane_records_go_before_the_checkpoint_and_leave_the_state_after_the_next(runtime, records):
    w = make_worker(runtime)
    recs = stamped(records, TIMES)
    w.process(0, recs[:7])
    closed = w.owned[0].states["m"].closed
    assert list(closed) == [T0]
    blob = closed[T0].to_bytes()
    assert w.checkpoint() == 1
    sent = _state_records(w.producer)
    keys = [k for k, _ in sent]
    ck_at = keys.index(b"flights/0")
    pane_m = pane_key("flights", 0, "m", T0)
    assert keys.index(pane_m) < ck_at and ck_at == len(keys) - 1
    assert all(parse_state_key(k)[2] in ("m", "c") for k in keys[:ck_at])
    assert dict(sent)[pane_m] == blob
    pane = State.from_bytes(blob, runtime.queries["m"], runtime.schema)
    assert type(pane) is STATE_CLASSES["mean"] and pane.n == 42
    # the checkpoint still holds the pane: its record was not known durable before it
    ck, states = _ck_states(runtime, sent[ck_at][1])
    assert ck.next_offset == 7 and list(states["m"].closed) == [T0]
    assert w.owned[0].published_offset == 7 and list(w.owned[0].states["m"].closed) == [T0]
    n_panes = len(keys) - 1
    assert metric(w, "ldp_window_pane_records_total") == n_panes
    # the next checkpoint: the pane was durable with the acknowledged one, so it leaves the state
    w.process(0, recs[7:])
    assert w.checkpoint() == 1
    sent2 = _state_records(w.producer)[len(sent):]
    assert pane_m not in dict(sent2)  # not sent again
    ck2, states2 = _ck_states(runtime, sent2[-1][1])
    assert ck2.next_offset == 12 and T0 not in states2["m"].closed and T0 in states2["m"].retained
    assert states2["m"].n == 84  # n counts the published panes' reports too
    assert T0 in w.owned[0].states["m"].retained
    (tp, om), = w.consumer.commits[-1].items()
    assert tp == TopicPartition("reports", 0) and om.offset == 12


def test_a_pane_stays_until_a_checkpoint_sent_with_it_is_acknowledged(runtime, records):
    w = make_worker(runtime, producer=UnackedProducer())
    recs = stamped(records, TIMES)
    w.process(0, recs[:7])
    part = w.owned[0]
    first = w.checkpoints.send([(part, part.mark())])  # on its way, not acknowledged
    w.process(0, recs[7:9])
    second = w.checkpoints.send([(part, part.mark())])  # sent before the first was acknowledged
    pane_m = pane_key("flights", 0, "m", T0)
    assert [k for k, _ in _state_records(w.producer)].count(pane_m) == 2  # sent again
    assert T0 in part.states["m"].closed and part.published_offset is None
    w.producer.flush()
    w.checkpoints.settle(first + second, flush=False)
    assert part.published_offset == 9
    assert T0 in part.states["m"].closed  # dropped by the next checkpoint only
    w.process(0, recs[9:])
    w.checkpoints.publish([part])
    assert T0 not in part.states["m"].closed and T0 in part.states["m"].retained


class PaneRefusingProducer(FakeProducer):
    """The broker refuses pane records (e.g. the state topic's max message size), accepts the rest."""

    def __init__(self):
        super().__init__()
        self.refuse = True

    def send(self, topic, key=None, value=None, headers=None):
        self.sent.append((topic, key, value, dict(headers or [])))
        pane = topic == "state" and parse_state_key(key)[2] is not None
        return FakeFuture(KafkaTimeoutError("pane refused") if pane and self.refuse else None)


def test_a_failed_pane_send_keeps_the_pane_and_it_is_sent_again(runtime, records):
    commits = []
    w = make_worker(runtime, producer=PaneRefusingProducer(),
                    consumer=types.SimpleNamespace(commit=lambda offsets: commits.append(offsets)))
    recs = stamped(records, TIMES)
    w.process(0, recs[:7])
    part = w.owned[0]
    blob = part.states["m"].closed[T0].to_bytes()
    with pytest.raises(KafkaTimeoutError, match="pane refused"):
        w.checkpoint()
    assert commits == [] and part.dirty and part.published_offset is None
    assert T0 in part.states["m"].closed
    w.producer.refuse = False  # the broker takes them again
    before = len(w.producer.sent)
    assert w.checkpoint() == 1
    again = dict(_state_records(types.SimpleNamespace(sent=w.producer.sent[before:])))
    assert again[pane_key("flights", 0, "m", T0)] == blob  # the same pane, sent again
    assert len(commits) == 1
    (tp, om), = commits[0].items()
    assert tp == TopicPartition("reports", 0) and om.offset == 7
    assert part.published_offset == 7 and T0 in part.states["m"].closed
    w.process(0, recs[7:])
    assert w.checkpoint() == 1
    assert T0 not in part.states["m"].closed and T0 in part.states["m"].retained


def test_closed_panes_make_a_checkpoint_due(runtime, records):
    """Closed panes leave the state only with a checkpoint: once the owned partitions hold
    MAX_CLOSED_PANES of them, one falls due (docs/windows.md §3), and not before."""
    from aggregator.worker.loop import MAX_CLOSED_PANES

    w = make_worker(runtime)
    assert not w.panes_due()
    # one record per hour: every record closes the pane of the one before ("m", 1 h tumbling)
    n = MAX_CLOSED_PANES // 2  # "c" (2 h hopping 1 h, grace 5 min) closes one pane per record too
    w.process(0, stamped(records[:1] * n, [T0 + HOUR * i for i in range(n)]))
    held = sum(len(w.owned[0].states[q].closed) for q in runtime.windowed)
    assert held < MAX_CLOSED_PANES and not w.panes_due()
    w.process(0, stamped(records[:1] * n, [T0 + HOUR * (n + i) for i in range(n)], start=n))
    held = sum(len(w.owned[0].states[q].closed) for q in runtime.windowed)
    assert held >= MAX_CLOSED_PANES and w.panes_due()
