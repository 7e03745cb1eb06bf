"""Unit tests of serve: merge of checkpoints and the HTTP API (uvicorn on 127.0.0.1, no broker)."""

from __future__ import annotations

import threading
import time
import tomllib
import urllib.request

import numpy as np
import pytest

from aggregator.checkpoint import Checkpoint
from aggregator.config import PipelineConfig
from aggregator.serve import EstimateStore, build_app, merge_checkpoints
from aggregator.worker import PartitionState, PipelineRuntime
from tests.http_server import ServedApp
from tests.integration import pipeline_support as ps


@pytest.fixture(scope="module")
def runtime():
    text = (f'[pipeline]\nname = "flights"\nschema = "{ps.SCHEMA}"\n'
            '[kafka]\nbootstrap_servers = "127.0.0.1:9"\n')
    return PipelineRuntime.from_config(PipelineConfig.from_dict(tomllib.loads(text + ps.available_queries())))


def _partition_checkpoints(runtime, by_part: dict, per_record: int) -> dict:
    """``{state key: checkpoint bytes}`` of each partition's records folded into fresh states."""
    cks = {}
    for p, recs in by_part.items():
        st = PartitionState(p, len(recs), runtime.new_states(), reports=per_record * len(recs))
        for r in recs:
            b = runtime.decode(r)
            x2 = runtime.double(b, r)
            for s in st.states.values():
                s.update(b, x2)
        cks[Checkpoint(runtime.name, p, 0, 0, b"").key] = st.to_checkpoint(runtime).to_bytes()
    return cks


@pytest.fixture(scope="module")
def checkpoints(runtime):
    records = ps.make_records(runtime.schema, n_records=8, per_record=40, seed=5)
    by_part = {0: records[:3], 1: records[3:]}
    return _partition_checkpoints(runtime, by_part, 40), ps.reference_pass(runtime, by_part)


def test_merge_checkpoints_equals_single_pass(runtime, checkpoints):
    raw, want = checkpoints
    merged, info = merge_checkpoints([Checkpoint.from_bytes(v) for v in raw.values()], runtime)
    assert info["partitions"] == [0, 1] and info["reports"] == 320
    for name, st in want.items():
        assert merged[name].to_bytes() == st.to_bytes()


@pytest.fixture
def served(runtime, checkpoints):
    raw, want = checkpoints
    store = EstimateStore(runtime)
    store.set_checkpoints({**raw, b"flights/7": b"corrupt", b"other/0": b"ignored"})
    srv = ServedApp(build_app(store))
    yield srv.port, store, want
    srv.close()


def test_http_api(served):
    port, _store, want = served
    status, body = ps.get_json(port, "/estimates")
    assert status == 200 and body["reports"] == 320 and body["partitions"] == [0, 1]
    assert set(body["estimates"]) == set(want)
    for name, st in want.items():
        est = body["estimates"][name]
        assert est["n"] == st.n
        np.testing.assert_allclose(est["value"], st.estimate().value, rtol=1e-12)
        for key in ("stderr", "ci_low", "ci_high", "level", "params"):
            assert key in est
    status, one = ps.get_json(port, "/estimates/arr_delay_mean")
    assert status == 200 and one["n"] == 320 and one["ci_low"][0] < one["value"][0] < one["ci_high"][0]
    status, err = ps.get_json(port, "/estimates/nope")
    assert status == 404 and "nope" in err["error"]
    status, priv = ps.get_json(port, "/privacy")
    assert status == 200 and priv["schema"] == "flights"
    assert priv["unit"]["unit"] == "event" and priv["unit"]["holds"] == "per_report"
    status, health = ps.get_json(port, "/healthz")
    assert status == 200 and health["status"] == "ok"
    text = ps.scrape(port)
    for name in ("ldp_estimate", "ldp_estimate_stderr", "ldp_estimate_ci_lower", "ldp_estimate_ci_upper",
                 "ldp_estimate_reports"):
        assert f"# TYPE {name} gauge" in text
    assert ps.metric_value(text, "ldp_estimate_reports", 'query="arr_delay_mean"') == 320
    assert ps.metric_value(text, "ldp_state_records_invalid_total") == 1  # the corrupt checkpoint


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_read_only(served, method):
    port, _, _ = served
    status, body = ps.get_json(port, "/estimates", method=method)
    assert status == 405 and "error" in body


def test_errors_are_json_without_traceback(served, monkeypatch):
    port, store, _ = served

    def boom():
        raise RuntimeError("secret internals")

    monkeypatch.setattr(store, "estimates", boom)
    req = urllib.request.Request(f"http://127.0.0.1:{port}/estimates")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    body = info.value.read().decode()
    assert info.value.code == 500
    assert "Traceback" not in body and "secret" not in body and "error" in body


class _StubReader:
    """A state-topic reader whose broker answers or not (``self.up``); ``loads`` counts the
    full reads (``catch_up``) it was asked for."""

    def __init__(self, raw):
        self.latest, self.offsets = dict(raw), {k: i for i, k in enumerate(raw)}
        self.up = threading.Event()
        self.loads = 0

    def _answer(self):
        if not self.up.is_set():
            from kafka.errors import KafkaTimeoutError

            raise KafkaTimeoutError("no answer from 127.0.0.1:9")

    def catch_up(self, timeout_s):
        self._answer()
        self.loads += 1

    def poll(self, timeout_ms=200):
        time.sleep(timeout_ms / 1000)
        return 0

    def probe(self, timeout_s):
        self._answer()
        return {}

    def close(self):
        pass


def test_liveness_and_readiness_follow_the_broker(runtime, checkpoints):
    raw, _ = checkpoints
    reader = _StubReader(raw)
    store = EstimateStore(runtime, reader, refresh_interval_s=0.05, stale_after_s=0.5)
    srv = ServedApp(build_app(store))
    try:
        # broker down from the start: alive (degraded), not ready — nothing was read yet
        store.start()
        body = ps.until(lambda: ps.get_json(srv.port, "/readyz"), 503)
        assert body["status"] == "not_ready" and "not been read to its end" in body["reason"]
        ps.until(lambda: (store.health()[1]["status"], None), "degraded")
        status, health = ps.get_json(srv.port, "/healthz")
        assert status == 200 and health["status"] == "degraded"
        assert health["last_error"] == "KafkaTimeoutError: no answer from 127.0.0.1:9"  # type named once
        # the broker answers: the topic is read once, estimates appear, ready and ok
        reader.up.set()
        body = ps.until(lambda: ps.get_json(srv.port, "/readyz"), 200)
        assert body["status"] == "ready" and body["partitions"] == [0, 1]
        assert ps.until(lambda: ps.get_json(srv.port, "/healthz"), 200)["status"] in ("ok", "degraded")
        ps.until(lambda: (store.health()[1]["status"], None), "ok")
        assert ps.get_json(srv.port, "/estimates")[1]["reports"] == 320
        assert reader.loads == 1
        contact = ps.metric_value(ps.scrape(srv.port), "ldp_state_topic_last_contact_timestamp_seconds")
        assert abs(contact - store.last_contact) < 1e-3 and time.time() - contact < 5
        # the broker stops answering: still ready within stale_after_s, then not ready; the last
        # good estimates stay served and liveness stays 200 (a restart would not help)
        reader.up.clear()
        t_down = time.time()
        body = ps.until(lambda: ps.get_json(srv.port, "/readyz"), 503)
        assert time.time() - store.last_contact > store.stale_after_s
        assert time.time() - t_down >= store.stale_after_s - 0.1  # not before stale_after_s
        assert "no answer from the broker" in body["reason"] and body["last_error"]
        assert ps.get_json(srv.port, "/healthz")[0] == 200
        assert ps.get_json(srv.port, "/estimates")[1]["reports"] == 320
        # back: ready again without re-reading the whole topic
        reader.up.set()
        ps.until(lambda: ps.get_json(srv.port, "/readyz"), 200)
        assert reader.loads == 1
    finally:
        srv.close()
        store.stop()


def test_liveness_fails_when_the_refresh_thread_died(runtime):
    store = EstimateStore(runtime, _StubReader({}))
    assert store.health()[0] == 200 and store.readiness()[0] == 503  # not started: nothing read
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    store._thread = dead  # what a crashed refresh loop leaves behind
    code, body = store.health()
    assert code == 503 and body["status"] == "failed" and "thread stopped" in body["error"]
    code, body = store.readiness()
    assert code == 503 and body["reason"] == body["error"]


def test_stale_after_must_exceed_refresh_interval(runtime):
    from aggregator.errors import ConfigError

    with pytest.raises(ConfigError, match=r"stale_after_s must be > refresh_interval_s \(5\.0\), got 5"):
        EstimateStore(runtime, refresh_interval_s=5.0, stale_after_s=5)


def test_checkpoints_of_edited_queries_say_why_they_are_not_used(runtime, checkpoints):
    """The config's queries changed (one quantile list edited): the state topic's checkpoints
    cannot be restored; every estimate names the partitions and the reason instead of the bare
    "no checkpoint yet", which an operator read as an empty pipeline."""
    raw, _ = checkpoints
    text = (f'[pipeline]\nname = "flights"\nschema = "{ps.SCHEMA}"\n'
            '[kafka]\nbootstrap_servers = "127.0.0.1:9"\n')
    queries = ps.available_queries()
    assert "q = [0.5, 0.9]" in queries
    edited = PipelineRuntime.from_config(PipelineConfig.from_dict(
        tomllib.loads(text + queries.replace("q = [0.5, 0.9]", "q = [0.25, 0.75]"))))
    store = EstimateStore(edited)
    store.set_checkpoints(raw)
    ests = store.estimates()
    assert set(ests) == set(edited.queries)
    for est in ests.values():
        assert est["n"] == 0
        assert est["error"].startswith("no usable checkpoint yet: the checkpoints of partition(s) [0, 1] "
                                       "cannot be restored with this config (")
        assert "another spec" in est["error"] and "Changing the queries" in est["error"]
    fresh = EstimateStore(edited)  # nothing in the state topic: the plain message
    fresh.set_checkpoints({})
    assert all(e["error"] == "no checkpoint yet" for e in fresh.estimates().values())


@pytest.mark.parametrize("change", ["added", "removed"])
def test_checkpoints_of_another_query_set_are_not_used_as_the_workers_do(runtime, checkpoints, change):
    """A query added or removed: the workers rebuild every partition (the checkpoints' queries are
    not the config's); serve served the old checkpoints for the unchanged queries after an
    addition, and answered a bare KeyError after a removal."""
    raw, _ = checkpoints
    text = (f'[pipeline]\nname = "flights"\nschema = "{ps.SCHEMA}"\n'
            '[kafka]\nbootstrap_servers = "127.0.0.1:9"\n')
    queries = ps.available_queries()
    if change == "added":
        queries += '\n[[queries]]\nkind = "mean"\nname = "dep_delay_mean_s13"\nfield = "dep_delay"\n'
    else:
        queries = queries.rpartition("[[queries]]")[0]
    edited = PipelineRuntime.from_config(PipelineConfig.from_dict(tomllib.loads(text + queries)))
    assert set(edited.queries) != set(runtime.queries)
    store = EstimateStore(edited)
    store.set_checkpoints(raw)
    ests = store.estimates()
    assert set(ests) == set(edited.queries)
    for est in ests.values():
        assert est["n"] == 0, est
        assert "checkpoint of partition 0 holds queries" in est["error"]
        assert "the config has" in est["error"]


_WARM_UP = """
[[queries]]
kind = "logistic_regression"
name = "late_arrival_logit"
covariates = ["hour", "distance"]
label = "arr_delay"
threshold = 15.0
estimator = "dr"
"""


@pytest.fixture(scope="module")
def warming(runtime):
    """A runtime with a renewable query, and its two partition checkpoints of 4000 reports each
    (the query still in its warm-up), with the single-pass reference states."""
    text = (f'[pipeline]\nname = "flights"\nschema = "{ps.SCHEMA}"\n'
            '[kafka]\nbootstrap_servers = "127.0.0.1:9"\n')
    rt = PipelineRuntime.from_config(PipelineConfig.from_dict(tomllib.loads(text + ps.QUERIES + _WARM_UP)))
    records = ps.make_records(rt.schema, n_records=8, per_record=1000, seed=6)
    by_part = {0: records[:4], 1: records[4:]}
    return rt, _partition_checkpoints(rt, by_part, 1000), ps.reference_pass(rt, by_part)


def _costly(states) -> list[str]:
    return sorted(n for n, st in states.items() if getattr(st, "costly_estimate", False))


def _gated(monkeypatch, gate: threading.Event, calls: list):
    """estimate_payload with the costly estimates held until ``gate`` is set (``calls`` counts them)."""
    from aggregator import serve as serve_mod

    real = serve_mod.estimate_payload

    def payload(name, state):
        if getattr(state, "costly_estimate", False):
            calls.append((name, state.n))
            assert gate.wait(20), "the test's gate was never opened"
        return real(name, state)

    monkeypatch.setattr(serve_mod, "estimate_payload", payload)
    return real


def test_warm_up_fits_are_estimated_off_the_refresh_thread(warming, monkeypatch):
    runtime, raw, want = warming
    costly = _costly(want)
    assert costly, "the fixture's renewable queries should still be in their warm-up"
    gate, calls = threading.Event(), []
    real = _gated(monkeypatch, gate, calls)
    store = EstimateStore(runtime, background=True)
    store.set_checkpoints(raw)  # returns while the warm-up fits wait at the gate
    est = store.estimates()
    for name in want:
        if name in costly:
            assert est[name]["pending"] is True and "being computed" in est[name]["error"]
            assert est[name]["n"] == want[name].n
        else:
            assert "pending" not in est[name] and "error" not in est[name], est[name]
    assert not store.wait_estimates(0.05)
    gate.set()
    assert store.wait_estimates(20)
    est = store.estimates()
    for name in costly:
        expect = real(name, want[name])
        assert "pending" not in est[name] and est[name]["n"] == want[name].n
        np.testing.assert_allclose(est[name]["value"], expect["value"], rtol=1e-12)
        assert _reports_gauge(store, name) == want[name].n
    assert sorted(n for n, _ in calls) == costly


def test_a_late_estimate_serves_the_last_one_and_then_the_newest_state(warming, monkeypatch):
    runtime, raw, want = warming
    costly = _costly(want)
    first = {k: v for k, v in raw.items() if Checkpoint.from_bytes(v).partition == 0}
    gate, calls = threading.Event(), []
    _gated(monkeypatch, gate, calls)
    store = EstimateStore(runtime, background=True)
    gate.set()
    store.set_checkpoints(first)
    assert store.wait_estimates(20)
    n0 = {name: store.estimates()[name]["n"] for name in costly}
    assert all("error" not in store.estimates()[name] for name in costly)
    gate.clear()
    calls.clear()
    for _ in range(3):  # three refreshes while the first late estimate waits: the last state wins
        store.set_checkpoints(raw)
        for name in costly:
            e = store.estimates()[name]
            assert e["pending"] is True and e["n"] == n0[name] and "value" in e  # the last estimate
    gate.set()
    assert store.wait_estimates(20)
    for name in costly:
        e = store.estimates()[name]
        assert "pending" not in e and e["n"] == want[name].n
    # per query: the state queued first, then only the newest of the three refreshes
    assert sorted(calls) == sorted([(name, want[name].n) for name in costly] * 2)


def _reports_gauge(store, name: str) -> float:
    from prometheus_client import generate_latest

    from aggregator.metrics import metric_value

    return metric_value(generate_latest(store.metrics.registry).decode(), "ldp_estimate_reports",
                        f'query="{name}"')


def test_a_late_estimate_does_not_replace_a_newer_one_computed_at_once(warming, monkeypatch):
    """The warm-up ends between two refreshes: the second estimates the query at once, and the
    late fit of the first, landing after it, is not served over it (nor published)."""
    from aggregator.state.renewable import RenewableState

    runtime, raw, want = warming
    costly = _costly(want)
    first = {k: v for k, v in raw.items() if Checkpoint.from_bytes(v).partition == 0}
    n_first = sum(Checkpoint.from_bytes(v).reports for v in first.values())
    # "in its warm-up" up to the first partition's reports only
    monkeypatch.setattr(RenewableState, "costly_estimate", property(lambda self: self.n <= n_first))
    gate, calls = threading.Event(), []
    _gated(monkeypatch, gate, calls)
    store = EstimateStore(runtime, background=True)
    store.set_checkpoints(first)  # late, held at the gate
    store.set_checkpoints(raw)  # at once: n of both partitions
    for name in costly:
        e = store.estimates()[name]
        assert "pending" not in e and e["n"] == want[name].n
        assert _reports_gauge(store, name) == want[name].n
    gate.set()
    assert store.wait_estimates(20)
    assert sorted(calls) == sorted((name, n_first) for name in costly)
    for name in costly:
        e = store.estimates()[name]
        assert "pending" not in e and e["n"] == want[name].n
        assert _reports_gauge(store, name) == want[name].n


def test_a_store_fed_by_hand_estimates_everything_at_once(warming):
    runtime, raw, want = warming
    assert _costly(want)
    store = EstimateStore(runtime)
    assert not store.background
    store.set_checkpoints(raw)
    assert all("pending" not in e and "error" not in e for e in store.estimates().values())
    assert EstimateStore(runtime, _StubReader(raw)).background


def test_a_recomputation_without_a_new_checkpoint_does_not_start_the_fit_again(warming, monkeypatch):
    """With windowed queries serve recomputes every second without a new checkpoint (the windows'
    clock). The warm-up fit of the same checkpoints is not queued again: while it runs the entry
    stays pending (one fit, not one per second, the newest of which was never served while each
    took longer than a second), and once it landed it is served, not marked pending again."""
    runtime, raw, want = warming
    costly = _costly(want)
    offsets = {k: i for i, k in enumerate(raw)}
    gate, calls = threading.Event(), []
    _gated(monkeypatch, gate, calls)
    store = EstimateStore(runtime, background=True)
    store.set_checkpoints(raw, offsets)
    for _ in range(3):
        store._computed_for = None  # what a tick of the windows' clock does
        store.set_checkpoints(raw, offsets)
        assert all(store.estimates()[name]["pending"] is True for name in costly)
    gate.set()
    assert store.wait_estimates(20)
    for _ in range(2):
        store._computed_for = None
        store.set_checkpoints(raw, offsets)
        for name in costly:
            e = store.estimates()[name]
            assert "pending" not in e and "error" not in e and e["n"] == want[name].n
    assert sorted(calls) == sorted((name, want[name].n) for name in costly)  # one fit each
    store.set_checkpoints(raw, {k: i + 10 for i, k in enumerate(raw)})  # a new checkpoint: fit again
    assert store.wait_estimates(20)
    assert len(calls) == 2 * len(costly)
