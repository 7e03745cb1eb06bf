"""Throughput of one worker vs a raw kafka-python consume loop over the same records.

Usage::

    .venv/bin/python benchmarks/worker.py [--reports 200000] [--sizes 1,100,1000] [--json OUT]

For each batch size m (reports per Kafka record) the script starts an embedded Tansu broker topic,
produces the same privatized flights records (synthetic values, the ``examples/flights.schema.toml``
schema: 5 ZIL fields, uRAP carrier/dest, uRR origin), then measures

* raw: a group-less ``KafkaConsumer`` reading every record (no decoding);
* worker: :class:`aggregator.worker.Worker` (decode, doubling, 6 query states, checkpoints every
  5 s), timed from its first processed record to the last (the group join is excluded).

Numbers depend on the machine (2 shared cores here); see the report for what was measured.

Superseded for published numbers by ``python -m benchmarks.pipeline`` (its ``consume`` section runs
the worker and the raw consumer in separate processes and records CPU-time rates);
``benchmarks/results/worker.json`` predates the ``crc32c`` dependency (pure-Python CRC-32C).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _raw_consume(bootstrap: str, topic: str, n_records: int) -> float:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                      max_poll_records=500)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    got, t0 = 0, None
    while got < n_records:
        for recs in c.poll(timeout_ms=500).values():
            if t0 is None:
                t0 = time.perf_counter()
            got += len(recs)
    dt = time.perf_counter() - t0
    c.close()
    return dt


def _worker_consume(cfg, n_reports: int) -> tuple[float, int]:
    from aggregator.metrics import WorkerMetrics
    from aggregator.worker import worker_from_config

    w = worker_from_config(cfg, metrics=WorkerMetrics())
    w.checkpoint_interval_s = 5.0
    marks: list[float] = []
    inner = w._process

    def timed(partition, records):
        if not marks:
            marks.append(time.perf_counter())
        out = inner(partition, records)
        marks.append(time.perf_counter())
        return out

    w._process = timed
    t = threading.Thread(target=w.run, kwargs={"max_reports": n_reports}, daemon=True)
    t.start()
    t.join(600)
    return marks[-1] - marks[0], w.processed_reports


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reports", type=int, default=200_000, help="reports per size (default 200000)")
    ap.add_argument("--max-records", type=int, default=20_000, help="cap on records per size (default 20000)")
    ap.add_argument("--sizes", default="1,100,1000", help="reports per record (default 1,100,1000)")
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args(argv)

    import tomllib

    from aggregator.config import PipelineConfig
    from aggregator.worker import ensure_topics
    from ingest.broker import EmbeddedBroker
    from tests.integration import pipeline_support as ps

    results = []
    with EmbeddedBroker() as broker:
        boot = broker.bootstrap_servers
        for m in (int(s) for s in args.sizes.split(",")):
            n_records = max(1, min(args.max_records, args.reports // m))
            tag = f"bench{m}-{int(time.time())}"
            with tempfile.TemporaryDirectory() as tmp:
                path = ps.write_config(Path(tmp), boot, lambda p, tag=tag: f"{p}-{tag}", partitions=1)
                text = path.read_text()
            cfg = PipelineConfig.from_dict(tomllib.loads(text))
            ensure_topics(cfg)
            uniq = min(n_records, 200)
            recs = ps.make_records(cfg.telemetry_schema, uniq, m, seed=m)
            values = [recs[i % uniq] for i in range(n_records)]
            ps.produce(boot, cfg.topics.reports, values, partitions=1)
            raw_s = _raw_consume(boot, cfg.topics.reports, n_records)
            work_s, done = _worker_consume(cfg, n_records * m)
            raw_rate, work_rate = n_records * m / raw_s, done / work_s
            row = {"reports_per_record": m, "records": n_records, "reports": n_records * m,
                   "record_bytes": len(values[0]), "raw_records_per_s": n_records / raw_s,
                   "raw_reports_per_s": raw_rate, "worker_reports_per_s": work_rate,
                   "worker_records_per_s": work_rate / m, "worker_vs_raw": work_rate / raw_rate}
            results.append(row)
            print(f"m={m:>5}: {n_records} records of {row['record_bytes']} B | raw "
                  f"{row['raw_records_per_s']:,.0f} records/s = {raw_rate:,.0f} reports/s | worker "
                  f"{work_rate:,.0f} reports/s ({row['worker_vs_raw']:.0%} of raw)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
