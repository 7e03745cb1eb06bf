"""Malformed, truncated, foreign-fingerprint and oversized records go to the dead-letter topic with
a reason; the counter increases; the good records around them are all counted (docs/wire-format.md §4,
docs/reliability.md §2)."""

from __future__ import annotations

import threading

import pytest
from kafka import TopicPartition

from aggregator.config import PipelineConfig
from aggregator.metrics import WorkerMetrics
from aggregator.serve import merge_checkpoints
from aggregator.worker import PipelineRuntime, ensure_topics, worker_from_config
from ingest.client.schema import TelemetrySchema
from ingest.kafka.clients import producer_client, reader_client
from ingest.kafka.settings import KafkaSettings
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _read_all(bootstrap, topic, expect, timeout_s=30):
    c = reader_client(KafkaSettings(bootstrap_servers=bootstrap))
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        out = []
        import time

        deadline = time.monotonic() + timeout_s
        while len(out) < expect and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=200).values():
                out.extend(recs)
        return out
    finally:
        c.close()


def test_bad_records_are_dead_lettered(tmp_path, bootstrap_servers, topic_name):
    cfg_path = ps.write_config(tmp_path, bootstrap_servers, topic_name, partitions=2, max_record_bytes=20_000)
    cfg = PipelineConfig.load(cfg_path)
    ensure_topics(cfg)
    runtime = PipelineRuntime.from_config(cfg)
    good = ps.make_records(cfg.telemetry_schema, n_records=10, per_record=10, seed=7)
    weather = TelemetrySchema.load(ps.ROOT / "examples" / "weather.schema.toml")
    foreign = ps.make_records(weather, n_records=1, per_record=10, seed=8)[0]
    oversized = ps.make_records(cfg.telemetry_schema, n_records=1, per_record=600, seed=9)[0]
    assert len(oversized) > 20_000 and len(good[0]) < 20_000
    bad = {"garbage": b"\x00not a report at all" * 8, "truncated": good[0][:-7], "foreign": foreign,
           "oversized": oversized}
    # every bad record sits between good ones, on partition 0
    sequence = [good[0], bad["garbage"], good[1], bad["truncated"], good[2], bad["foreign"], good[3],
                bad["oversized"], good[4]]
    ps.produce(bootstrap_servers, cfg.topics.reports, sequence, partitions=1)
    later = ps.produce(bootstrap_servers, cfg.topics.reports, good[5:], partitions=2, start=1)
    metrics = WorkerMetrics()
    w = worker_from_config(cfg, metrics=metrics)
    t = threading.Thread(target=w.run, kwargs={"exit_when_idle": 2.0}, daemon=True)
    t.start()
    t.join(90)
    assert not t.is_alive()

    dlq = _read_all(bootstrap_servers, cfg.topics.dead_letter, expect=4)
    assert len(dlq) == 4
    by_value = {r.value: dict(r.headers) for r in dlq}
    # an oversized record is dead-lettered as its first max_record_bytes bytes (sending it whole
    # would exceed the producer's request size) with its original length in ``truncated_from``
    cut = bad["oversized"][:20_000]
    assert int(by_value[cut]["truncated_from"]) == len(bad["oversized"])
    by_value[bad["oversized"]] = by_value.pop(cut)
    for name, value in bad.items():
        h = by_value[value]
        assert h["reason"].decode(), name
        assert h["source_topic"].decode() == cfg.topics.reports and h["source_partition"] == b"0"
    assert by_value[bad["oversized"]]["reason"] == b"oversized"
    assert by_value[bad["foreign"]]["reason"] == b"unknown_fingerprint"
    assert by_value[bad["truncated"]]["reason"] == b"truncated"
    offsets = sorted(int(h["source_offset"]) for h in by_value.values())
    assert offsets == [1, 3, 5, 7]

    text = metrics.exposition().decode()
    reasons = {h["reason"].decode() for h in by_value.values()}
    total = sum(ps.metric_value(text, "ldp_records_dead_lettered_total", f'reason="{r}"') for r in reasons)
    assert total == 4
    assert ps.metric_value(text, "ldp_reports_processed_total") == 10 * 10

    cks = ps.read_checkpoints(bootstrap_servers, cfg.topics.state, runtime.name)
    merged, info = merge_checkpoints(cks.values(), runtime)
    assert info["reports"] == 100
    assert all(st.n == 100 for st in merged.values())
    ends = {0: len(sequence) + sum(p == 0 for p, _ in later), 1: sum(p == 1 for p, _ in later)}
    assert {c.partition: c.next_offset for c in cks.values()} == ends


def test_corrupt_state_record_rebuilds_partition_from_earliest(tmp_path, bootstrap_servers, topic_name):

    cfg_path = ps.write_config(tmp_path, bootstrap_servers, topic_name, partitions=2)
    cfg = PipelineConfig.load(cfg_path)
    ensure_topics(cfg)
    runtime = PipelineRuntime.from_config(cfg)
    records = ps.make_records(cfg.telemetry_schema, n_records=12, per_record=10, seed=17)
    where = ps.produce(bootstrap_servers, cfg.topics.reports, records, partitions=2)
    # a checkpoint for partition 0 that claims progress but cannot be decoded
    prod = producer_client(KafkaSettings(bootstrap_servers=bootstrap_servers))
    prod.send(cfg.topics.state, key=b"flights/0", value=b"LDPC\x00\x01 corrupt")
    prod.flush(10)
    prod.close()
    metrics = WorkerMetrics()
    w = worker_from_config(cfg, metrics=metrics)
    t = threading.Thread(target=w.run, kwargs={"exit_when_idle": 2.0}, daemon=True)
    t.start()
    t.join(90)
    assert not t.is_alive()
    assert ps.metric_value(metrics.exposition().decode(), "ldp_state_records_invalid_total") == 1
    by_part: dict[int, list[bytes]] = {}
    for rec, (p, _) in zip(records, where):
        by_part.setdefault(p, []).append(rec)
    cks = ps.read_checkpoints(bootstrap_servers, cfg.topics.state, runtime.name)
    merged, info = merge_checkpoints(cks.values(), runtime)
    assert info["reports"] == 120
    want = ps.reference_pass(runtime, by_part, coalesce=True)
    for name, st in want.items():
        assert merged[name].n == st.n == 120
