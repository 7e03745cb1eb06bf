"""The child processes of ``benchmarks/pipeline.py``: a timed worker (``_worker``) and a raw
kafka-python consumer (``_raw``)."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

from benchmarks._pipeline_common import (
    load_config,
)


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
    # the phases are timed by wrapping the worker's public parts (Worker's Notes): the loop calls
    # them through their instances
    w = worker_from_config(cfg, metrics=WorkerMetrics()).open()
    # the update thread's wall and CPU time per update, and how long the fold thread (or a
    # checkpoint) waits for it
    upd = {"updates": 0, "wall_s": 0.0, "cpu_s": 0.0, "main_wait_s": 0.0}
    inner_apply, inner_wait = w.threads.apply, w.threads.wait_one

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

    w.threads.apply, w.threads.wait_one = apply, wait_one
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
    w.folder.fold_contiguous = timed(fold_steps, "fold", w.folder.fold_contiguous)
    inner_new_states = w.runtime.new_states

    def new_states():
        states = inner_new_states()
        for name, st in states.items():
            st.update = timed(per_query, name, st.update)
        return states

    w.runtime.new_states = new_states
    # poll once fetching has started (info["first"], below): wall = waiting for fetches +
    # parsing kafka-python's records; CPU = the parsing
    plain_poll, timed_poll = w.consumer.poll, timed(main_steps, "poll", w.consumer.poll)
    w.consumer.poll = lambda *a, **k: (plain_poll if info["first"] is None else timed_poll)(*a, **k)
    # checkpoints: the time threads spend on them — in the main loop marking them (fold thread)
    # and serializing + sending them (update thread), not waiting for the broker's acks; the
    # final one's drain + send + flush (main thread) — and the offset commits on the main thread
    # (one key per thread: the fold and update threads run theirs at the same time)
    ckpt = {"checkpoints": 0, "wall_s": 0.0, "commit_wall_s": 0.0}
    walls = {"mark": 0.0, "snapshot": 0.0, "final": 0.0}
    cp = w.checkpoints
    inner_publish, inner_commit = cp.publish_due, cp.commit
    inner_begin, inner_snapshot = cp.begin, cp.snapshot

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
    cp.begin, cp.snapshot = wall(inner_begin, "mark"), wall(inner_snapshot, "snapshot")

    def commit(*a, **k):
        t0 = time.perf_counter()
        inner_commit(*a, **k)
        ckpt["commit_wall_s"] += time.perf_counter() - t0

    cp.publish_due, cp.commit = publish, commit
    go, ready = Path(ns.go) if ns.go else None, Path(ns.ready) if ns.ready else None
    info = {"first": None, "last": None, "rss_kb": {}, "partitions": set()}
    marks = sorted(int(x) for x in ns.rss_marks.split(",")) if ns.rss_marks else []
    inner_process, inner_restore = w.process, w.restore_pending

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
            # its rate, which the raw loop never paid
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
        elif ready is not None and len(w.pending) == ns.expect and not ready.exists():
            ready.write_text("1")  # holds its share of the partitions, paused until "go"

    w.process = process
    w.restore_pending = restore
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
    from kafka import TopicPartition

    from aggregator.worker import DEFAULT_MAX_POLL_RECORDS
    from ingest.kafka.allocator import keep_freed_memory
    from ingest.kafka.clients import consumer_client

    # the worker's allocator settings ([worker] malloc_trim_threshold_mib), or glibc's defaults
    from ingest.kafka.settings import KafkaSettings
    keep_freed_memory(ns.malloc_trim_mib << 20)
    c = consumer_client(
        KafkaSettings(bootstrap_servers=ns.bootstrap),
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
