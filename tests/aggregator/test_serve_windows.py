"""serve with windowed queries: an EstimateStore fed the state topic that the worker's real
checkpoint protocol (Checkpointer: pane records, then the checkpoint) wrote for two partitions;
GET /windows/{query}, /estimates/{query} of a windowed query, the ldp_window_* gauges, and pane
records deleted by tombstones."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest

from aggregator.checkpoint import StateTopicReader, parse_state_key
from aggregator.metrics import WorkerMetrics
from aggregator.serve import EstimateStore, build_app
from aggregator.worker import PartitionState
from aggregator.worker.checkpointing import Checkpointer
from aggregator.worker.threads import OverlapThreads
from ingest.client.event_time import iso_utc
from tests.aggregator.window_support import HOUR, T0, plain_state, take, timed, windowed_runtime
from tests.aggregator.worker_support import FakeProducer
from tests.http_server import ServedApp
from tests.integration import pipeline_support as ps

M = {"kind": "mean", "name": "m", "field": "a", "window": {"size": "1h", "grace": "10m"}}
C = {"kind": "frequency", "name": "c", "field": "c", "window": {"size": "3h", "hop": "1h", "grace": "10m"}}
TOT = {"kind": "mean", "name": "tot", "field": "a"}


class StateTopicConsumer:
    """The state topic as a consumer sees it: every record the producer sent, in order."""

    def __init__(self, sent):
        from kafka import TopicPartition

        self.tp = TopicPartition("state", 0)
        self.records = [types.SimpleNamespace(key=k, value=v, offset=i)
                        for i, (topic, k, v, _) in enumerate(sent) if topic == "state"]

    def partitions_for_topic(self, topic):
        return {0}

    def assign(self, tps):
        pass

    def seek_to_beginning(self, tp):
        pass

    def poll(self, timeout_ms=0):
        out, self.records = self.records, []
        return {self.tp: out} if out else {}


def read_topic(producer, pipeline="p"):
    """``(latest, offsets)`` of serve's reader (pane keys kept, tombstones delete) over what
    ``producer`` sent."""
    reader = StateTopicReader(StateTopicConsumer(producer.sent), "state", pipeline, panes=True)
    reader.poll()
    return dict(reader.latest), dict(reader.offsets)


class Partitions:
    """Partitions of a worker folding batches and checkpointing through the real Checkpointer
    (a FakeProducer acknowledges every record at once)."""

    def __init__(self, runtime, producer=None):
        self.runtime = runtime
        self.producer = producer or FakeProducer()
        self.owned = {}
        self.fed = []  # (batch, x2) folded, all partitions
        self.late_fed = []  # (batch, x2) of late reports (in the cumulative queries only)
        self.ck = Checkpointer(runtime, self.producer, None, owned=self.owned, threads=OverlapThreads(False),
                               lock=threading.RLock(), metrics=WorkerMetrics(), reports_topic="reports",
                               state_topic="state")

    def fold(self, p, batch, x2, late=False):
        st = self.owned.setdefault(p, PartitionState(p, 0, self.runtime.new_states()))
        for s in st.states.values():
            s.update(batch, x2)
        st.next_offset += 1
        st.reports += batch.n
        st.records += 1
        (self.late_fed if late else self.fed).append((batch, x2))

    def checkpoint(self, p):
        return self.ck.publish([self.owned[p]])


def _stream(runtime, seed):
    """Partition 0: 600 reports over [T0, T0+8h) in 3 polls, partition 1: 400 over [T0, T0+6h)
    in 2, each poll checkpointed."""
    rng = np.random.default_rng(seed)
    parts = Partitions(runtime)
    for p, n, hours, polls in ((0, 600, 8, 3), (1, 400, 6, 2)):
        t = np.sort(rng.integers(T0, T0 + hours * HOUR, n)).astype(np.int64)
        batch, x2 = timed(runtime.schema, t, seed + p)
        for idx in np.array_split(np.arange(n), polls):
            parts.fold(p, take(batch, idx), x2[idx])
            parts.checkpoint(p)
    parts.fold(1, *timed(runtime.schema, [T0 + 5] * 4, seed + 7), late=True)  # pane T0 has closed
    parts.checkpoint(1)
    assert parts.owned[1].states["m"].late == parts.owned[1].states["c"].late == 4
    return parts


@pytest.fixture(scope="module")
def runtime():
    return windowed_runtime([M, C, TOT])


@pytest.fixture(scope="module")
def stream(runtime):
    return _stream(runtime, 30)


@pytest.fixture(scope="module")
def served(runtime, stream):
    raw, offsets = read_topic(stream.producer)
    store = EstimateStore(runtime)
    store.set_checkpoints(raw, offsets)
    srv = ServedApp(build_app(store))
    yield srv.port, store, stream
    srv.close()


def _horizon(stream, grace=600):
    return min(int(st.states["m"].max_event_time) for st in stream.owned.values()) - grace


def test_the_state_topic_holds_pane_records_and_checkpoints(runtime, stream):
    raw, _ = read_topic(stream.producer)
    keys = [parse_state_key(k) for k in raw]
    assert {(pipe, part) for pipe, part, q, _ in keys if q is None} == {("p", 0), ("p", 1)}
    for name in ("m", "c"):
        assert {part for _, part, q, _ in keys if q == name} == {0, 1}
        for p, st in stream.owned.items():
            w = st.states[name]
            published = {s for _, part, q, s in keys if q == name and part == p}
            # dropped from the partition state only once their records were durable
            assert w.retained and w.retained <= published
            assert all(s % HOUR == 0 for s in published)


def test_windows_are_the_plain_states_of_both_partitions(served, runtime):
    port, _, stream = served
    horizon = _horizon(stream)
    for name, size in (("m", HOUR), ("c", 3 * HOUR)):
        status, body = ps.get_json(port, f"/windows/{name}")
        assert status == 200 and body["query"] == name
        assert body["window"]["size_s"] == size and body["window"]["hop_s"] == HOUR
        assert body["horizon"] == iso_utc(horizon) and body["late"] == 4
        rows = body["windows"]
        starts = [r["start_s"] for r in rows]
        assert starts == sorted(starts) and len(set(starts)) == len(starts)
        first = T0 - size + HOUR
        assert starts == list(range(first, T0 + 8 * HOUR, HOUR))
        for r in rows:
            assert r["end_s"] == r["start_s"] + size and r["start"] == iso_utc(r["start_s"])
            assert r["final"] == (r["end_s"] <= horizon)
            want = plain_state(runtime, name, stream.fed, r["start_s"], r["end_s"])
            est = want.estimate()
            assert r["n"] == want.n
            np.testing.assert_allclose(r["value"], est.value, rtol=1e-10)
            np.testing.assert_allclose(r["ci_high"], est.ci_high, rtol=1e-10)
            assert r["params"] == list(est.params)
    assert sum(r["n"] for r in ps.get_json(port, "/windows/m")[1]["windows"]) == 1000


def test_windows_from_to_and_limit(served):
    port, _, _ = served
    _, full = ps.get_json(port, "/windows/m")
    rows = full["windows"]
    lo, hi = T0 + 2 * HOUR, T0 + 5 * HOUR
    want = [r for r in rows if lo <= r["start_s"] < hi]
    assert [r["start_s"] for r in want] == [lo, lo + HOUR, lo + 2 * HOUR]
    for q in (f"from={lo}&to={hi}", "from=2013-01-01T02:00:00Z&to=2013-01-01T05:00:00Z",
              f"from=2013-01-01T02:00:00Z&to={hi}"):
        status, body = ps.get_json(port, f"/windows/m?{q}")
        assert status == 200 and body["windows"] == want, q
    assert ps.get_json(port, f"/windows/m?from={lo}&to={hi}&limit=2")[1]["windows"] == want[-2:]
    assert ps.get_json(port, "/windows/m?limit=3")[1]["windows"] == rows[-3:]
    assert ps.get_json(port, "/windows/m?limit=0")[1]["windows"] == []
    assert ps.get_json(port, f"/windows/m?limit={10**6}")[1]["windows"] == rows
    assert ps.get_json(port, f"/windows/m?from={hi}")[1]["windows"] == [r for r in rows if r["start_s"] >= hi]
    since_t0 = [r for r in rows if r["start_s"] >= T0]
    assert ps.get_json(port, "/windows/m?from=2013-01-01")[1]["windows"] == since_t0
    assert ps.get_json(port, f"/windows/m?to={T0}")[1]["windows"] == []  # the first window starts at T0
    assert ps.get_json(port, f"/windows/m?from={hi}&to={lo}")[1]["windows"] == []


@pytest.mark.parametrize(("query", "param"), [
    ("limit=x", "limit"), ("limit=-1", "limit"), ("limit=1000001", "limit"), ("limit=2.5", "limit"),
    ("from=yesterday", "from"), ("to=2013-02-30", "to"), ("from=2013-01-01T25:00:00Z", "from"),
])
def test_bad_window_parameters_are_400_with_a_reason(served, query, param):
    port, _, _ = served
    status, body = ps.get_json(port, f"/windows/m?{query}")
    assert status == 400
    assert body["error"] == "invalid query parameter" and body["reason"].startswith(f"{param} must be")


@pytest.mark.parametrize("param", ["limit", "from", "to"])
def test_a_superscript_digit_is_refused_naming_the_parameter(served, param):
    port, _, _ = served
    status, body = ps.get_json(port, f"/windows/m?{param}=%C2%B2")  # "²"
    assert status == 400
    assert body["reason"].startswith(f"{param} must be")


def test_unknown_and_unwindowed_queries_are_404(served):
    port, _, _ = served
    status, body = ps.get_json(port, "/windows/nope")
    assert status == 404 and "nope" in body["error"] and "m" in body["queries"]
    status, body = ps.get_json(port, "/windows/tot")
    assert status == 404 and "has no window" in body["error"] and "/estimates/tot" in body["reason"]


def test_estimates_of_a_windowed_query_are_its_latest_final_window(served, runtime):
    port, _, stream = served
    horizon = _horizon(stream)
    for name in ("m", "c"):
        _, rows = ps.get_json(port, f"/windows/{name}")
        final = [r for r in rows["windows"] if r["final"]]
        assert final and not rows["windows"][-1]["final"]
        status, est = ps.get_json(port, f"/estimates/{name}")
        assert status == 200 and est["query"] == name
        last = final[-1]
        assert est["end_s"] <= horizon < est["end_s"] + HOUR
        assert (est["start"], est["end"], est["start_s"], est["end_s"]) == (
            last["start"], last["end"], last["start_s"], last["end_s"])
        assert est["value"] == last["value"] and est["n"] == last["n"] and est["window"] == rows["window"]
    _, everything = ps.get_json(port, "/estimates")
    assert everything["estimates"]["m"]["start_s"] == ps.get_json(port, "/estimates/m")[1]["start_s"]
    status, tot = ps.get_json(port, "/estimates/tot")  # an unwindowed query: every report
    assert status == 200 and tot["n"] == 1004 and "start" not in tot  # the late reports too
    want = plain_state(runtime, "tot", stream.fed + stream.late_fed, -(1 << 62), 1 << 62).estimate()
    np.testing.assert_allclose(tot["value"], want.value, rtol=1e-10)


def test_metrics_carry_the_latest_final_window(served):
    port, _, _ = served
    text = ps.scrape(port)
    for fam in ("ldp_window_estimate", "ldp_window_estimate_stderr", "ldp_window_estimate_ci_lower",
                "ldp_window_estimate_ci_upper", "ldp_window_reports", "ldp_window_end_timestamp_seconds"):
        assert f"# TYPE {fam} gauge" in text
    _, est = ps.get_json(port, "/estimates/m")
    lab = 'param="mean",query="m"'  # the exposition sorts the labels
    for fam, key in (("ldp_window_estimate", "value"), ("ldp_window_estimate_stderr", "stderr"),
                     ("ldp_window_estimate_ci_lower", "ci_low"), ("ldp_window_estimate_ci_upper", "ci_high")):
        assert ps.metric_value(text, fam, lab) == pytest.approx(est[key][0], rel=1e-12), fam
    assert ps.metric_value(text, "ldp_window_reports", 'query="m"') == est["n"] > 0
    assert ps.metric_value(text, "ldp_window_end_timestamp_seconds", 'query="m"') == est["end_s"]
    _, c = ps.get_json(port, "/estimates/c")
    for p, v in zip(c["params"], c["value"], strict=True):
        got = ps.metric_value(text, "ldp_window_estimate", f'param="{p}",query="c"')
        assert got == pytest.approx(v, rel=1e-12)
    # the windowed queries are not in the cumulative gauges, the unwindowed one is
    cumulative = [line for line in text.splitlines() if line.startswith("ldp_estimate{")]
    assert cumulative and all('query="tot"' in line for line in cumulative)


def test_no_final_window_while_a_partition_holds_windows_open(runtime, stream):
    raw, offsets = read_topic(stream.producer)
    store = EstimateStore(runtime, reports_topic="reports")
    store.partition_ends = {0: 3, 1: 2, 2: 7}  # partition 2 has reports and no checkpoint yet
    store.set_checkpoints(raw, offsets)
    est = store.estimates()["m"]
    assert est["n"] == 0 and "no final window yet" in est["error"]
    assert store.windows("m")["horizon"] is None
    assert not any(r["final"] for r in store.windows("m")["windows"])
    with ServedApp(build_app(store)) as srv:
        status, body = ps.get_json(srv.port, "/estimates/m")
        assert status == 200 and "no final window yet" in body["error"]
        assert ps.metric_value(ps.scrape(srv.port), "ldp_window_reports", 'query="m"') == 0
    # partition 2 turns out empty: it is idle, the two others decide
    store.partition_ends = {0: 3, 1: 2, 2: 0}
    store.set_checkpoints(raw, {k: v + 1 for k, v in offsets.items()})
    assert store.windows("m")["horizon"] == iso_utc(_horizon(stream))
    assert "error" not in store.estimates()["m"]


def test_tombstoned_pane_records_disappear_from_the_windows():
    rt = windowed_runtime([{**M, "window": {"size": "1h", "retention": "2h"}}])
    parts = Partitions(rt)
    rng = np.random.default_rng(40)
    for k in range(6):  # hour k of both partitions, then a checkpoint each
        for p in (0, 1):
            t = np.sort(rng.integers(T0 + k * HOUR, T0 + (k + 1) * HOUR, 50)).astype(np.int64)
            parts.fold(p, *timed(rt.schema, t, 100 * p + k))
            parts.checkpoint(p)
    tomb = [k for _, k, v, _ in parts.producer.sent if v is None]
    assert tomb  # the worker sent tombstones
    raw, offsets = read_topic(parts.producer)
    assert not set(tomb) & set(raw)  # the reader deleted their keys
    store = EstimateStore(rt)
    store.set_checkpoints(raw, offsets)
    starts = [r["start_s"] for r in store.windows("m")["windows"]]
    gone = sorted({parse_state_key(k)[3] for k in tomb})
    assert gone and not set(gone) & set(starts)
    for st in parts.owned.values():  # what the partitions still hold or published is there
        w = st.states["m"]
        assert set(w.pane_states()) | w.retained <= set(starts)
        assert not (set(w.pane_states()) | w.retained) & set(gone)
    assert starts == list(range(starts[0], T0 + 6 * HOUR, HOUR)) and starts[0] > T0
    # and before the tombstones were read, those windows were served
    early = {}
    for i, (_, k, v, _) in enumerate(parts.producer.sent):
        if v is None:
            break
        early[k] = (v, i)
    store2 = EstimateStore(rt)
    store2.set_checkpoints({k: v for k, (v, _) in early.items()}, {k: i for k, (_, i) in early.items()})
    assert gone[0] in [r["start_s"] for r in store2.windows("m")["windows"]]


def test_window_gauges_are_removed_when_no_window_is_final():
    """A windowed query that loses its last final window (a partition busy again) shows no
    ldp_window_* value rather than the stale one."""
    from aggregator.metrics import ServeMetrics

    m = ServeMetrics()
    m.set_window("w", {"params": ["mean"], "value": [1.0], "stderr": [0.1], "ci_low": [0.8],
                       "ci_high": [1.2], "n": 5, "end_s": 100})
    m.set_window("other", {"params": ["mean"], "value": [2.0], "stderr": [0.1], "ci_low": [1.8],
                           "ci_high": [2.2], "n": 5, "end_s": 100})
    text = m.exposition().decode()
    assert 'ldp_window_estimate{param="mean",query="w"} 1.0' in text
    m.clear_window("w")
    text = m.exposition().decode()
    assert 'query="w"' not in text
    assert 'ldp_window_estimate{param="mean",query="other"} 2.0' in text
    assert 'ldp_window_end_timestamp_seconds{query="other"} 100.0' in text
