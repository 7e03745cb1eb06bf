"""Chaos tests against the real Tansu broker (exactly-once: docs/reliability.md §1, §3).

Each test streams 10⁵ privatized reports (1000 records of 100, 40 days of event time) over 4
partitions while faults are injected, and ends with the final merged checkpoint state
**bit-identical** to a clean single pass over the same logs (``--no-coalesce`` workers:
record-by-record updates), with equal report counts; the windowed queries' panes (held by the
checkpoints or published under their own keys), late counts and window estimates too:

* ``test_sigkill_at_five_seeded_moments`` — the worker process is SIGKILLed at 5 seeded random
  moments (after a seeded number of processed reports plus a seeded delay) and restarted;
* ``test_scale_1_3_1_while_streaming`` — the group grows from 1 to 3 workers and shrinks back to
  1 (graceful SIGTERM) while the producer streams;
* ``test_broker_frozen_10s`` — the broker (its own EmbeddedBroker) is SIGSTOPped for 10 s
  mid-stream and resumed;
* ``test_restored_offset_below_log_start`` — retention deleted reports below a checkpoint's
  ``next_offset``: the gap is counted and logged and processing resumes at the earliest offset.
"""

from __future__ import annotations

import logging
import signal
import time

import numpy as np
import pytest

from aggregator.config import PipelineConfig
from aggregator.worker import PipelineRuntime
from ingest.local.broker import EmbeddedBroker
from ingest.local.processes import free_port
from tests.integration import chaos_support as cs
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stream():
    """The 10⁵-report stream (schema and 1000 encoded records), built once per module."""
    from ingest.client.schema import TelemetrySchema

    schema = TelemetrySchema.load(ps.SCHEMA)
    return schema, cs.make_stream(schema)


def _setup(tmp_path, bootstrap, topic_name, **kw):
    cfg_path = ps.write_config(tmp_path, bootstrap, topic_name, partitions=cs.PARTITIONS,
                               checkpoint_interval_s=kw.pop("checkpoint_interval_s", 0.3),
                               extra_queries=kw.pop("extra_queries", cs.WINDOWED_QUERIES), **kw)
    cfg = PipelineConfig.load(cfg_path)
    ps.create_topics(bootstrap, cfg)
    return cfg_path, cfg, PipelineRuntime.from_config(cfg)


def _record(request, **figures):
    """Attach figures to the test report (collected for docs/reliability.md)."""
    request.node.user_properties.extend(figures.items())
    print("CHAOS", request.node.name, figures)


def test_sigkill_at_five_seeded_moments(request, tmp_path, bootstrap_servers, topic_name, stream):
    _schema, records = stream
    cfg_path, cfg, runtime = _setup(tmp_path, bootstrap_servers, topic_name)
    rng = np.random.default_rng(9001)
    log = tmp_path / "worker.log"
    prod = cs.Producer(bootstrap_servers, cfg.topics.reports, records, delay_s=0.07)
    prod.start()
    kills = []
    procs = []
    try:
        for _i in range(5):
            port = free_port()
            w = ps.start_worker(cfg_path, "--no-coalesce", "--metrics-port", str(port),
                                "--max-poll-records", "20", log_path=log)
            procs.append(w)
            threshold = int(rng.integers(5, 40)) * cs.PER_RECORD  # reports folded in by this process
            cs.wait_metric(port, "ldp_reports_processed_total", threshold, 120, w)
            time.sleep(float(rng.uniform(0.0, 0.4)))
            done = ps.metric_value(ps.scrape(port), "ldp_reports_processed_total")
            assert ps.kill(w, signal.SIGKILL) == -signal.SIGKILL
            kills.append((threshold, int(done), round(time.monotonic() - prod.started_at, 2)))
        streaming_during_kills = prod.is_alive()
        where = prod.result()
        w = ps.start_worker(cfg_path, "--no-coalesce", "--exit-when-idle", "3", log_path=log)
        procs.append(w)
        assert w.wait(timeout=180) == 0, cs.tail(log)
    finally:
        for w in procs:
            ps.kill(w)
    by_part = cs.logs_by_partition(records, where)
    summary = cs.assert_exact(bootstrap_servers, cfg, runtime, by_part, cs.PER_RECORD)
    # at least the first kills hit while data was still flowing
    assert kills[0][2] < prod.finished_at - prod.started_at
    _record(request, kills=kills, streaming_during_all_kills=streaming_during_kills,
            stream_s=round(prod.finished_at - prod.started_at, 1), **summary)


def test_scale_1_3_1_while_streaming(request, tmp_path, bootstrap_servers, topic_name, stream):
    _schema, records = stream
    cfg_path, cfg, runtime = _setup(tmp_path, bootstrap_servers, topic_name)
    ports = [free_port() for _ in range(3)]
    logs = [tmp_path / f"worker-{c}.log" for c in "abc"]
    prod = cs.Producer(bootstrap_servers, cfg.topics.reports, records, delay_s=0.03)
    a = ps.start_worker(cfg_path, "--no-coalesce", "--metrics-port", str(ports[0]),
                        "--max-poll-records", "20", log_path=logs[0])
    procs = [a]
    try:
        cs.wait_metric(ports[0], "ldp_owned_partitions", cs.PARTITIONS, 120, a)
        prod.start()
        cs.wait_metric(ports[0], "ldp_reports_processed_total", 50 * cs.PER_RECORD, 120, a)
        # 1 → 3
        for port, lg in zip(ports[1:], logs[1:], strict=True):
            procs.append(ps.start_worker(cfg_path, "--no-coalesce", "--metrics-port", str(port),
                                         "--max-poll-records", "20", log_path=lg))
        for port, w in zip(ports[1:], procs[1:], strict=True):
            cs.wait_metric(port, "ldp_owned_partitions", 1, 120, w)
        b_reports = [cs.wait_metric(port, "ldp_reports_processed_total", 3 * cs.PER_RECORD, 120, w)
                     for port, w in zip(ports[1:], procs[1:], strict=True)]
        grown_at = time.monotonic() - prod.started_at
        assert prod.is_alive(), "the stream ended before the group had grown; slow the producer"
        # 3 → 1: graceful leave (SIGTERM → final checkpoint → close)
        for w, lg in zip(procs[1:], logs[1:], strict=True):
            assert ps.kill(w, signal.SIGTERM, timeout=60) == 0, cs.tail(lg)
        shrunk_at = time.monotonic() - prod.started_at
        streaming_when_shrunk = prod.is_alive()
        cs.wait_metric(ports[0], "ldp_owned_partitions", cs.PARTITIONS, 120, a)
        where = prod.result()
        by_part = cs.logs_by_partition(records, where)
        cs.wait_until_complete(bootstrap_servers, cfg.topics.state, runtime.name,
                               {p: len(v) for p, v in by_part.items()}, 180, procs=[a])
        assert ps.kill(a, signal.SIGTERM, timeout=60) == 0, cs.tail(logs[0])
    finally:
        for w in procs:
            ps.kill(w)
    summary = cs.assert_exact(bootstrap_servers, cfg, runtime, by_part, cs.PER_RECORD)
    _record(request, grown_at_s=round(grown_at, 1), shrunk_at_s=round(shrunk_at, 1),
            streaming_when_shrunk=streaming_when_shrunk, joiners_reports=b_reports,
            stream_s=round(prod.finished_at - prod.started_at, 1), **summary)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_broker_frozen_10s(request, tmp_path, topic_name, stream):
    _schema, records = stream
    with EmbeddedBroker(startup_timeout=30.0) as broker:
        bootstrap = broker.bootstrap_servers
        cfg_path, cfg, runtime = _setup(tmp_path, bootstrap, topic_name)
        port = free_port()
        log = tmp_path / "worker.log"
        w = ps.start_worker(cfg_path, "--no-coalesce", "--metrics-port", str(port),
                            "--max-poll-records", "20", log_path=log)
        try:
            cs.wait_metric(port, "ldp_owned_partitions", cs.PARTITIONS, 120, w)
            prod = cs.Producer(bootstrap, cfg.topics.reports, records, delay_s=0.02,
                               request_timeout_ms=60_000, max_in_flight_requests_per_connection=1)
            prod.start()
            before = cs.wait_metric(port, "ldp_reports_processed_total", 200 * cs.PER_RECORD, 120, w)
            broker.freeze()
            t0 = time.monotonic()
            time.sleep(10.0)
            broker.thaw()
            frozen_s = time.monotonic() - t0
            assert w.poll() is None, "worker died while the broker was frozen:\n" + cs.tail(log)
            where = prod.result()
            by_part = cs.logs_by_partition(records, where)
            cs.wait_until_complete(bootstrap, cfg.topics.state, runtime.name,
                                   {p: len(v) for p, v in by_part.items()}, 180, procs=[w])
            assert ps.kill(w, signal.SIGTERM, timeout=60) == 0, cs.tail(log)
        finally:
            ps.kill(w)
        summary = cs.assert_exact(bootstrap, cfg, runtime, by_part, cs.PER_RECORD)
    _record(request, frozen_s=round(frozen_s, 1), processed_before_freeze=int(before), **summary)


def test_restored_offset_below_log_start(request, tmp_path, bootstrap_servers, topic_name, stream,
                                         monkeypatch, caplog):
    """Retention deleted offsets [10, 15) of partition 0 after the worker checkpointed at 10.

    Tansu does not implement DeleteRecords (its memory engine panics "not yet implemented") and
    has no time/size retention, so the deletion is simulated on the consumer side: the worker's
    ``KafkaConsumer.beginning_offsets`` reports a log start offset of 15 for partition 0 (what a
    broker returns after retention) while everything else runs against the real broker.
    """
    from kafka import KafkaConsumer

    from aggregator.metrics import WorkerMetrics
    from aggregator.worker import worker_from_config

    _schema, records = stream
    _cfg_path, cfg, runtime = _setup(tmp_path, bootstrap_servers, topic_name)
    first, second = records[:40], records[40:80]  # 10 + 10 records per partition
    where1 = cs.Producer(bootstrap_servers, cfg.topics.reports, first, 0.0)
    where1.start()
    where1 = where1.result()
    m1 = WorkerMetrics()
    worker_from_config(cfg, metrics=m1, coalesce=False).run(exit_when_idle=1.5)
    cks = ps.read_checkpoints(bootstrap_servers, cfg.topics.state, runtime.name)
    assert {c.partition: c.next_offset for c in cks.values()} == {p: 10 for p in range(4)}

    p2 = cs.Producer(bootstrap_servers, cfg.topics.reports, second, 0.0)
    p2.start()
    where2 = p2.result()
    log_start = {0: 15}
    real = KafkaConsumer.beginning_offsets

    def retained(self, partitions):
        out = real(self, partitions)
        return {tp: max(off, log_start.get(tp.partition, 0)) if tp.topic == cfg.topics.reports else off
                for tp, off in out.items()}

    monkeypatch.setattr(KafkaConsumer, "beginning_offsets", retained)
    m2 = WorkerMetrics()
    with caplog.at_level(logging.WARNING, logger="aggregator.worker"):
        worker_from_config(cfg, metrics=m2, coalesce=False).run(exit_when_idle=1.5)
    gap = m2.offset_gap.labels(partition="0")._value.get()
    assert gap == 5
    assert all(m2.offset_gap.labels(partition=str(p))._value.get() == 0 for p in (1, 2, 3))
    assert any("gone from the log" in r.getMessage() and "partition 0" in r.getMessage()
               for r in caplog.records)
    expo = m2.exposition().decode()
    assert ps.metric_value(expo, "ldp_offset_gap_records_total", 'partition="0"') == 5
    # the state holds partition 0's offsets [0, 10) ∪ [15, 20) and every record of the others
    by_part = cs.logs_by_partition(first + second, where1 + where2)
    by_part_kept = {p: (v[:10] + v[15:] if p == 0 else v) for p, v in by_part.items()}
    cks = ps.read_checkpoints(bootstrap_servers, cfg.topics.state, runtime.name)
    assert {c.partition: c.next_offset for c in cks.values()} == {p: 20 for p in range(4)}
    from aggregator.serve import merge_checkpoints

    merged, info = merge_checkpoints(cks.values(), runtime)
    assert info["reports"] == cs.PER_RECORD * (80 - 5)
    want = ps.reference_pass(runtime, by_part_kept)
    for name, st in want.items():
        assert merged[name].to_bytes() == st.to_bytes(), name
    _record(request, gap_records=int(gap), reports=info["reports"])
