"""Exactly-once under failures (docs/reliability.md §1): a worker killed with SIGKILL mid-stream
and restarted, and a second worker joining and leaving mid-stream, end with the same report count
and sufficient statistics as the clean single pass over the same records."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

from aggregator.config import PipelineConfig
from aggregator.metrics import WORKER_METRIC_NAMES
from aggregator.serve import merge_checkpoints
from aggregator.worker import PipelineRuntime
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

N_RECORDS, PER_RECORD, PARTITIONS = 400, 20, 4


def _setup(tmp_path, bootstrap, topic_name, seed):
    cfg_path = ps.write_config(tmp_path, bootstrap, topic_name, partitions=PARTITIONS,
                               checkpoint_interval_s=0.3)
    cfg = PipelineConfig.load(cfg_path)
    ps.create_topics(bootstrap, cfg)
    runtime = PipelineRuntime.from_config(cfg)
    records = ps.make_records(cfg.telemetry_schema, N_RECORDS, PER_RECORD, seed=seed)
    return cfg_path, cfg, runtime, records


def _producer_thread(bootstrap, topic, records, delay_s, start=0):
    out: dict = {}

    def run():
        out["where"] = ps.produce(bootstrap, topic, records, PARTITIONS, delay_s=delay_s, start=start)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _wait_metric(port, name, at_least, timeout, proc):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "worker exited early"
        try:
            text = ps.scrape(port)
            if ps.metric_value(text, name) >= at_least:
                return text
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{name} did not reach {at_least} in {timeout}s")


def _final_states(bootstrap, cfg, runtime, records, where):
    by_part: dict[int, list[bytes]] = {}
    for rec, (p, _) in zip(records, where):
        by_part.setdefault(p, []).append(rec)
    cks = ps.read_checkpoints(bootstrap, cfg.topics.state, runtime.name)
    assert sorted(c.partition for c in cks.values()) == list(range(PARTITIONS))
    for c in cks.values():  # every record folded in exactly once
        assert c.next_offset == len(by_part[c.partition])
        assert c.reports == PER_RECORD * len(by_part[c.partition])
    merged, info = merge_checkpoints(cks.values(), runtime)
    assert info["reports"] == N_RECORDS * PER_RECORD
    return merged, by_part


def test_sigkill_mid_stream_then_restart(tmp_path, bootstrap_servers, topic_name):
    cfg_path, cfg, runtime, records = _setup(tmp_path, bootstrap_servers, topic_name, seed=21)
    from ingest.local.processes import free_port

    port = free_port()
    log = tmp_path / "worker.log"
    a = ps.start_worker(cfg_path, "--no-coalesce", "--metrics-port", str(port), "--max-poll-records", "10",
                        log_path=log)
    b = None
    try:
        text = _wait_metric(port, "ldp_owned_partitions", PARTITIONS, 90, a)
        for name in WORKER_METRIC_NAMES:
            assert ps.has_family(text, name), name
        prod, out = _producer_thread(bootstrap_servers, cfg.topics.reports, records, delay_s=0.01)
        _wait_metric(port, "ldp_checkpoints_total", 2 * PARTITIONS, 60, a)
        text = _wait_metric(port, "ldp_reports_processed_total", 60 * PER_RECORD, 60, a)
        done = ps.metric_value(text, "ldp_reports_processed_total")
        assert ps.kill(a, signal.SIGKILL) == -signal.SIGKILL
        assert done < N_RECORDS * PER_RECORD, "the worker finished before the kill; slow the producer"
        prod.join(60)
        assert "where" in out
        b = ps.start_worker(cfg_path, "--no-coalesce", "--exit-when-idle", "3", log_path=log)
        assert b.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        ps.kill(a)
        if b is not None:
            ps.kill(b)
    merged, by_part = _final_states(bootstrap_servers, cfg, runtime, records, out["where"])
    want = ps.reference_pass(runtime, by_part)
    for name, st in want.items():  # record-by-record updates: bit-identical
        assert merged[name].n == st.n
        assert merged[name].to_bytes() == st.to_bytes(), name


def test_second_worker_joins_and_leaves_mid_stream(tmp_path, bootstrap_servers, topic_name):
    cfg_path, cfg, runtime, records = _setup(tmp_path, bootstrap_servers, topic_name, seed=22)
    from ingest.local.processes import free_port

    port = free_port()
    log = tmp_path / "worker.log"
    port_b = free_port()
    half = N_RECORDS // 2
    a = ps.start_worker(cfg_path, "--metrics-port", str(port), "--exit-when-idle", "8", "--max-poll-records",
                        "10", log_path=log)
    b = None
    try:
        _wait_metric(port, "ldp_owned_partitions", PARTITIONS, 90, a)
        # a slow trickle keeps A busy while B starts and joins
        prod1, out1 = _producer_thread(bootstrap_servers, cfg.topics.reports, records[:half], delay_s=0.06)
        b = ps.start_worker(cfg_path, "--metrics-port", str(port_b), "--max-poll-records", "10",
                            log_path=tmp_path / "worker-b.log")
        _wait_metric(port_b, "ldp_owned_partitions", 1, 90, b)  # B joined: the group is split
        prod1.join(60)
        prod2, out2 = _producer_thread(bootstrap_servers, cfg.topics.reports, records[half:], delay_s=0.01,
                                       start=half)
        _wait_metric(port_b, "ldp_reports_processed_total", 5 * PER_RECORD, 60, b)
        assert a.poll() is None, "A stopped before B left; raise its --exit-when-idle"
        # graceful leave: SIGTERM → final checkpoint → consumer.close() → A takes the partitions back
        assert ps.kill(b, signal.SIGTERM, timeout=30) == 0, (tmp_path / "worker-b.log").read_text()[-3000:]
        prod2.join(60)
        assert a.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        ps.kill(a)
        if b is not None:
            ps.kill(b)
    out = {"where": out1["where"] + out2["where"]}
    merged, by_part = _final_states(bootstrap_servers, cfg, runtime, records, out["where"])
    want = ps.reference_pass(runtime, by_part, coalesce=True)
    for name, st in want.items():  # coalesced updates: equal up to float summation order
        assert merged[name].n == st.n
        got, ref = merged[name].estimate(), st.estimate()
        np.testing.assert_allclose(got.value, ref.value, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got.stderr, ref.stderr, rtol=1e-9, atol=1e-12)


def _wait_log(path, needle, count, proc, timeout=60.0):
    """Wait until ``needle`` occurs ``count`` times in the log at ``path``."""
    deadline = time.monotonic() + timeout
    while path.read_text().count(needle) < count:
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text()[-3000:]
        time.sleep(0.02)


@pytest.mark.parametrize("when", ["first join", "rejoin"])
def test_sigterm_during_a_join_leaves_the_group_usable(tmp_path, bootstrap_servers, topic_name, when):
    """A worker stopped while its JoinGroup is pending — its first join (SIGTERM right after the
    broker handed it a member id) or a rejoin (SIGTERM right after its partitions were revoked
    because a second worker joined) — leaves by disconnecting, so the other worker gets every
    partition. With a ``LeaveGroup`` at that moment, Tansu kept the group in rebalance for good
    (docs/kafka.md)."""
    from ingest.local.processes import free_port

    cfg_path = ps.write_config(tmp_path, bootstrap_servers, topic_name, partitions=2)
    cfg = PipelineConfig.load(cfg_path)
    ps.create_topics(bootstrap_servers, cfg)
    log = tmp_path / "a.log"
    a = ps.start_worker(cfg_path, log_path=log)
    b = None
    try:
        port = free_port()
        if when == "first join":
            _wait_log(log, "Received member id", 1, a)
        else:
            _wait_log(log, "Setting newly assigned partitions", 1, a)
            revokes = log.read_text().count("Revoking previously assigned")
            b = ps.start_worker(cfg_path, "--metrics-port", str(port), log_path=tmp_path / "b.log")
            _wait_log(log, "Revoking previously assigned", revokes + 1, a)
        assert ps.kill(a, signal.SIGTERM, timeout=30) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert "stopped during a group join: closing without LeaveGroup" in text, text[-3000:]
        assert "Leaving consumer group" not in text
        if b is None:
            b = ps.start_worker(cfg_path, "--metrics-port", str(port), log_path=tmp_path / "b.log")
        _wait_metric(port, "ldp_owned_partitions", 2, 60, b)
    finally:
        ps.kill(a)
        if b is not None:
            ps.kill(b)
