"""Event-time windows end to end on a real broker (docs/windows.md): bad input is never silently
lost, and serve and analyze agree on the windows of the same reports topic.

One pipeline (module fixture): a daily mean of ``arr_delay`` (grace 6 h) next to the cumulative
``arr_delay_mean``; 42 records of 100 reports over five days of January 2013 on two partitions,
every record with the Kafka timestamp 2013-03-01T00:05:00Z. Among them:

* one record with one report of 2099 (more than ``max_event_time_skew_s`` = 3600 s ahead of its
  timestamp): dead-lettered whole (``event_time_skew``); it must not move the watermark;
* three records sent after the watermark moved on, holding reports up to two days old: some of
  their reports are late (pane end ≤ the partition's max event time so far − grace), some not;
* two records around the grace: reports of the previous day 5 h after midnight (folded) and
  6 h after midnight (late: pane end = watermark).

The expected late reports, window counts and watermarks are computed here from the rule of
docs/windows.md §3, independently of the worker.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from types import SimpleNamespace

import numpy as np
import pytest

from aggregator.config import PipelineConfig
from aggregator.metrics import WorkerMetrics
from aggregator.worker import PipelineRuntime, ensure_topics, worker_from_config
from ingest.kafka.clients import producer_client
from ingest.kafka.settings import KafkaSettings
from ingest.local.processes import free_port, spawn_process, stop_process
from tests.integration import pipeline_support as ps

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(180)]

DAILY, CUMULATIVE = "arr_delay_mean_daily", "arr_delay_mean"
DAILY_QUERY = f"""
[[queries]]
kind = "mean"
name = "{DAILY}"
field = "arr_delay"
window = {{ size = "1d", grace = "6h" }}
"""
H, D = 3600, 86400
GRACE = 6 * H
T0 = ps.T0  # 2013-01-01T00:00:00Z
DAYS = 5
PER_RECORD = 100
IN_ORDER = 18  # in-order records per partition
#: the Kafka timestamp of every record: "now" for the producers, two months after the events
NOW_S = calendar.timegm((2013, 3, 1, 0, 5, 0))
ROGUE_T = calendar.timegm((2099, 6, 1, 12, 0, 0))
SKEW_S = 3600
ALL_IDLE = "2013-01-06T00:00:00Z"  # every partition idle: the end of the latest pane (docs/windows.md §4)


def _iso(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hours(rng, lo: float, hi: float, m: int) -> np.ndarray:
    """``m`` event times in ``[lo, hi)`` rounded down to the hour (the schema's resolution), sorted."""
    return np.sort((np.floor(rng.uniform(lo, hi, m) / H) * H).astype(np.int64))


def _streams(rng) -> dict[int, list[tuple[str, np.ndarray]]]:
    """Per partition, ``(kind, event times)`` of its records in offset order."""
    out = {}
    for p, days in ((0, DAYS), (1, DAYS - 0.5)):
        span = days * D / IN_ORDER
        recs = [("ok", _hours(rng, T0 + k * span, T0 + (k + 1) * span, PER_RECORD)) for k in range(IN_ORDER)]
        out[p] = recs
    # partition 0, around the grace of Jan 3 (record 7 ends ≤ Jan 3 05:00): 50 reports at 05:00,
    # then 50 of Jan 2 23:00 — pane end Jan 3 00:00 > 05:00 − 6 h: folded; then 50 at 06:00 and 50
    # more of Jan 2 23:00 — pane end = 06:00 − 6 h: late (the boundary is late)
    d = T0 + 2 * D
    assert out[0][7][1].max() <= d + 5 * H
    out[0].insert(8, ("grace", np.array([d + 5 * H] * 50 + [d - H] * 50, dtype=np.int64)))
    out[0].insert(9, ("boundary", np.array([d + 6 * H] * 50 + [d - H] * 50, dtype=np.int64)))
    # partition 0, after 15 in-order records (max ≈ Jan 5 04:00): 60 reports about two days old
    # (late) and 40 current ones (folded)
    top0 = int(out[0][16][1].max())
    mixed = np.concatenate([_hours(rng, top0 - 2 * D - 6 * H, top0 - 2 * D + 6 * H, 60),
                            _hours(rng, top0 - 3 * H, top0 + 1, 40)])
    rng.shuffle(mixed)
    out[0].insert(17, ("late", mixed))
    # partition 1: the rogue record (99 current reports, one of 2099) after 6 records; a record of
    # reports all two days old after 11; one of reports 0–30 h old (around the grace) after 14
    top1 = int(out[1][5][1].max())
    rogue = np.concatenate([_hours(rng, top1 - 2 * H, top1 + 1, PER_RECORD - 1), [ROGUE_T]])
    out[1].insert(6, ("rogue", rogue))
    top1 = int(max(t.max() for k, t in out[1][:12] if k == "ok"))
    out[1].insert(12, ("late", _hours(rng, top1 - 2 * D - 3 * H, top1 - 2 * D + 3 * H, PER_RECORD)))
    top1 = int(max(t.max() for k, t in out[1][:16] if k == "ok"))
    around = _hours(rng, top1 - 30 * H, top1 + 1, PER_RECORD)
    rng.shuffle(around)
    out[1].insert(16, ("late", around))
    assert sum(len(v) for v in out.values()) == 42
    return out


def _truth(streams) -> SimpleNamespace:
    """Late reports, window counts and max event times by the rule of docs/windows.md §3: per
    partition in offset order, a report is late when its pane's end ≤ (the largest event time of
    the earlier reports of its partition) − grace; the dead-lettered record is not in the stream."""
    late_by_day, kept_by_day, all_by_day, late_by_record = Counter(), Counter(), Counter(), Counter()
    max_t, late_total = {}, 0
    for p, recs in streams.items():
        top = None
        for i, (kind, times) in enumerate(recs):
            if kind == "rogue":
                continue
            for t in times.tolist():
                day = t - t % D
                all_by_day[day] += 1
                if top is not None and day + D <= top - GRACE:
                    late_by_day[day] += 1
                    late_by_record[(p, i)] += 1
                    late_total += 1
                else:
                    kept_by_day[day] += 1
                top = t if top is None else max(top, t)
        max_t[p] = top
    return SimpleNamespace(late_by_day=late_by_day, kept_by_day=kept_by_day, all_by_day=all_by_day,
                           late_by_record=late_by_record, late=late_total, max_t=max_t,
                           days=sorted(all_by_day), counted=sum(all_by_day.values()))


def _encode(schema, times: np.ndarray, rng) -> bytes:
    from ingest.client.codec import encode
    from ingest.client.privatizer import Privatizer

    priv = Privatizer(schema, rng=rng)
    m = len(times)
    zil = schema.zil_mechanism()
    cols = {}
    for j, name in enumerate(schema.numeric_names):
        lo, hi = zil.low[j], zil.high[j]
        cols[name] = lo + (hi - lo) * rng.beta(2.0, 5.0, m)
    for c in schema.categorical:
        values = list(c.categories)
        cols[c.name] = np.asarray(values, dtype=object)[rng.integers(0, len(values), m)]
    cols[schema.event_time.field] = times
    return encode(priv.privatize_batch(cols), time_resolution=schema.time_resolution_s)



def _samples(text: str, name: str) -> list[tuple[dict, float]]:
    """``(labels, value)`` of every sample ``name`` of an exposition (labels in any order)."""
    out = []
    for line in text.splitlines():
        m = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
            out.append((labels, float(m.group(2))))
    return out


def _metric(text: str, name: str, **labels) -> float | None:
    hits = [v for lab, v in _samples(text, name) if lab == labels]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, bootstrap_servers):
    """The topics, the produced stream and one worker run to idle (in process, metrics readable)."""
    tmp = tmp_path_factory.mktemp("windows")
    tag = uuid.uuid4().hex[:8]
    cfg_path = ps.write_config(tmp, bootstrap_servers, lambda prefix="t": f"{prefix}-windows-{tag}",
                               partitions=2, extra_queries=DAILY_QUERY)
    text = cfg_path.read_text()
    assert "[worker]\n" in text and "[serve]\n" in text
    text = text.replace("[worker]\n", f"[worker]\nmax_event_time_skew_s = {SKEW_S}\n")
    text = text.replace("[serve]\n", "[serve]\nwindow_idle_timeout_s = 1.0\n")
    cfg_path.write_text(text)
    cfg = PipelineConfig.load(cfg_path)
    assert cfg.worker.max_event_time_skew_s == SKEW_S and cfg.serve.window_idle_timeout_s == 1.0
    ensure_topics(cfg)
    runtime = PipelineRuntime.from_config(cfg)
    schema = cfg.telemetry_schema
    rng = np.random.default_rng(2013)
    streams = _streams(rng)
    truth = _truth(streams)
    # every record decodes to the event times it was built from (the client rounds to the hour)
    encoded = {p: [(kind, times, _encode(schema, times, rng)) for kind, times in recs]
               for p, recs in streams.items()}
    for recs in encoded.values():
        for _, times, value in recs:
            assert runtime.decode(value).event_time.tolist() == times.tolist()

    prod = producer_client(KafkaSettings(bootstrap_servers=bootstrap_servers), acks="all")
    where = {}  # (partition, index) → offset
    try:
        for p, recs in encoded.items():
            for i, (_, _, value) in enumerate(recs):  # one at a time: offsets in this order
                md = prod.send(cfg.topics.reports, value=value, partition=p,
                               timestamp_ms=NOW_S * 1000).get(10)
                assert md.partition == p
                where[(p, i)] = md.offset
    finally:
        prod.close()
    for p, recs in encoded.items():
        assert [where[(p, i)] for i in range(len(recs))] == list(range(len(recs)))

    metrics = WorkerMetrics()
    w = worker_from_config(cfg, metrics=metrics)
    t = threading.Thread(target=w.run, kwargs={"exit_when_idle": 3.0}, daemon=True)
    t.start()
    t.join(90)
    assert not t.is_alive(), "worker did not stop within 90 s"
    (rogue_at,) = [(p, where[(p, i)], value) for p, recs in encoded.items()
                   for i, (kind, _, value) in enumerate(recs) if kind == "rogue"]
    return SimpleNamespace(cfg=cfg, cfg_path=cfg_path, runtime=runtime, streams=streams, truth=truth,
                           encoded=encoded, rogue=rogue_at, metrics=metrics.exposition().decode(),
                           bootstrap=bootstrap_servers, tmp=tmp)


def test_bad_event_times_are_dead_lettered_or_counted_late_never_lost(pipeline):
    cfg, runtime, truth = pipeline.cfg, pipeline.runtime, pipeline.truth
    total = PER_RECORD * sum(len(v) for v in pipeline.streams.values())
    assert total == 4200 and truth.counted == total - PER_RECORD
    # the stream exercises the rule: reports within the grace folded, the boundary late, reports
    # two days old late
    kinds = {(p, i): kind for p, recs in pipeline.streams.items() for i, (kind, _) in enumerate(recs)}
    assert [truth.late_by_record[k] for k, kind in sorted(kinds.items()) if kind == "grace"] == [0]
    assert [truth.late_by_record[k] for k, kind in sorted(kinds.items()) if kind == "boundary"] == [50]
    assert all(truth.late_by_record[k] > 0 for k, kind in kinds.items() if kind == "late")
    assert not any(truth.late_by_record[k] for k, kind in kinds.items() if kind == "ok")
    assert 0 < truth.late < 400 and len(truth.late_by_day) >= 2, truth.late_by_day

    # the 2099 record: in the dead-letter topic, whole, with its reason and provenance
    p_rogue, off_rogue, value_rogue = pipeline.rogue
    dl = ps.read_dead_letters(pipeline.bootstrap, cfg.topics.dead_letter, 1, timeout=20.0)
    assert len(dl) == 1, [dict(r.headers) for r in dl]
    h = {k: v.decode() for k, v in dl[0].headers}
    assert h["reason"] == "event_time_skew"
    assert h["source_topic"] == cfg.topics.reports
    assert (int(h["source_partition"]), int(h["source_offset"])) == (p_rogue, off_rogue)
    assert dl[0].value == value_rogue

    text = pipeline.metrics
    assert ps.metric_value(text, "ldp_records_dead_lettered_total", 'reason="event_time_skew"') == 1
    assert sum(v for _, v in _samples(text, "ldp_records_dead_lettered_total")) == 1
    assert _metric(text, "ldp_reports_late_total", query=DAILY) == truth.late
    assert ps.metric_value(text, "ldp_reports_processed_total") == truth.counted

    # checkpoints: every record consumed; the cumulative query holds every report but the rogue
    # record's; the daily query's watermark ignores 2099
    cks, pane_records = ps.read_state(pipeline.bootstrap, cfg.topics.state, runtime.name)
    assert {p: ck.next_offset for p, ck in cks.items()} == {p: len(r) for p, r in pipeline.streams.items()}
    assert sum(ck.reports for ck in cks.values()) == truth.counted
    cumulative = None
    for ck in cks.values():
        st = runtime.restore_state(CUMULATIVE, ck.states[CUMULATIVE])
        cumulative = st if cumulative is None else cumulative.merge(st)
    assert cumulative.n == truth.counted

    by_day, late = Counter(), 0
    for p, ck in cks.items():
        st = runtime.restore_state(DAILY, ck.states[DAILY])
        assert st.max_event_time == truth.max_t[p], (p, _iso(st.max_event_time))
        assert st.watermark == truth.max_t[p] - GRACE
        late += st.late
        panes = st.pane_states()  # open panes and closed ones not yet known durable
        for (rp, q, start), blob in pane_records.items():
            if rp == p and q == DAILY and start not in panes:
                panes[start] = st.new_pane().from_bytes(blob, st.query, st.schema)
        for start, pane in panes.items():
            by_day[start] += pane.n
        # the last day of the partition's data is still open (the 2099 report closed nothing)
        last_day = truth.max_t[p] - truth.max_t[p] % D
        assert last_day in st.panes and max(panes) == last_day, (p, sorted(map(_iso, panes)))
    assert late == truth.late
    assert max(by_day) == truth.days[-1] < T0 + DAYS * D, sorted(map(_iso, by_day))
    assert dict(by_day) == dict(truth.kept_by_day)
    # every report in exactly one daily window, or counted late
    assert sum(by_day.values()) + late == cumulative.n


def _get(port: int, path: str) -> tuple[int, dict]:
    return ps.get_json(port, path)


def test_serve_and_analyze_agree_on_the_windows(pipeline):
    truth = pipeline.truth
    boot = "import sys; from aggregator.cli import main; sys.exit(main(sys.argv[1:]))"
    port = free_port()
    log = pipeline.tmp / "serve.log"
    serve = spawn_process([sys.executable, "-c", boot, "serve", "--config", str(pipeline.cfg_path),
                           "--port", str(port)], log_path=log, cwd=ps.ROOT,
                          env={**os.environ, "PYTHONPATH": str(ps.ROOT)})
    try:
        deadline = time.monotonic() + 60
        body: dict = {}
        while time.monotonic() < deadline:  # every partition caught up and idle: all final
            assert serve.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                code, body = _get(port, f"/windows/{DAILY}")
            except OSError:
                code = None
            if code == 200 and body.get("windows") and all(w["final"] for w in body["windows"]):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"windows not all final within 60 s: {body}")
        assert body["query"] == DAILY and body["horizon"] == ALL_IDLE
        assert body["window"] == {"size_s": D, "hop_s": D, "grace_s": GRACE, "retention_s": 1000 * D}
        assert body["late"] == truth.late
        rows = body["windows"]
        starts = [r["start_s"] for r in rows]
        assert starts == sorted(starts) == truth.days  # ordered by start; nothing past the data
        for r in rows:
            assert r["start"] == _iso(r["start_s"]) and r["end"] == _iso(r["end_s"])
            assert r["end_s"] - r["start_s"] == D and r["start_s"] % D == 0
            assert r["n"] == truth.kept_by_day[r["start_s"]], r
            assert r["params"] == ["mean"] and "error" not in r
            assert r["ci_low"][0] < r["value"][0] < r["ci_high"][0]

        # from / to (ISO-8601 or Unix seconds) and limit on the real server
        d1, d3 = truth.days[1], truth.days[3]
        for q in (f"from={_iso(d1)}&to={_iso(d3)}", f"from={d1}&to={d3}"):
            code, got = _get(port, f"/windows/{DAILY}?{q}")
            assert code == 200 and [r["start_s"] for r in got["windows"]] == truth.days[1:3], (q, got)
        code, got = _get(port, f"/windows/{DAILY}?limit=2")
        assert code == 200 and got["windows"] == rows[-2:]
        code, got = _get(port, f"/windows/{DAILY}?from={d1}&limit=1")
        assert code == 200 and got["windows"] == rows[-1:]
        code, got = _get(port, f"/windows/{DAILY}?to={d1}")
        assert code == 200 and got["windows"] == rows[:1]
        code, got = _get(port, f"/windows/{DAILY}?limit=0")
        assert code == 200 and got["windows"] == []
        for bad in ("limit=x", "limit=-1", "from=yesterday"):
            code, got = _get(port, f"/windows/{DAILY}?{bad}")
            assert code == 400 and got["error"] and got["reason"], (bad, got)
        assert _get(port, f"/windows/{CUMULATIVE}")[0] == 404
        assert _get(port, "/windows/no_such_query")[0] == 404

        # /estimates/{daily}: the latest final window, with start and end
        last = rows[-1]
        code, est = _get(port, f"/estimates/{DAILY}")
        assert code == 200, est
        for k in ("start", "end", "start_s", "end_s", "n", "value", "stderr", "ci_low", "ci_high"):
            assert est[k] == last[k], k
        code, allest = _get(port, "/estimates")
        assert code == 200 and allest["estimates"][DAILY]["start"] == last["start"]
        assert allest["estimates"][CUMULATIVE]["n"] == truth.counted

        text = ps.scrape(port)
        assert _metric(text, "ldp_window_estimate", query=DAILY, param="mean") == last["value"][0]
        assert _metric(text, "ldp_window_end_timestamp_seconds", query=DAILY) == last["end_s"]
        assert _metric(text, "ldp_window_reports", query=DAILY) == last["n"]
    finally:
        stop_process(serve, 20)

    # analyze re-fits every window from every report: no report is late in batch, the rogue
    # record is skipped by the same skew rule
    def analyze(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "aggregator.cli", "analyze", "--config",
                               str(pipeline.cfg_path), *args], capture_output=True, text=True,
                              cwd=ps.ROOT, timeout=90)

    res = analyze("--query", DAILY, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["reports"] == truth.counted and out["skipped"] == {"event_time_skew": 1}
    (daily,) = out["analyses"]
    assert daily["query"] == DAILY and daily["window"]["size_s"] == D
    assert [w["start_s"] for w in daily["windows"]] == starts
    assert [w["start"] for w in daily["windows"]] == [r["start"] for r in rows]
    for w, r in zip(daily["windows"], rows, strict=True):
        assert "error" not in w, w
        assert w["n"] == r["n"] + truth.late_by_day[r["start_s"]], (w["start"], w["n"], r["n"])
        assert w["n"] == truth.all_by_day[r["start_s"]]
        if truth.late_by_day[r["start_s"]] == 0:  # the same reports: the same mean
            np.testing.assert_allclose(w["value"], r["value"], rtol=1e-9, err_msg=w["start"])

    res = analyze("--window", "1d", "--query", CUMULATIVE, "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    (cum,) = json.loads(res.stdout)["analyses"]
    assert cum["query"] == CUMULATIVE and cum["window"]["size_s"] == D and cum["window"]["hop_s"] == D
    assert [w["start_s"] for w in cum["windows"]] == starts
    for w, dw in zip(cum["windows"], daily["windows"], strict=True):
        assert w["n"] == dw["n"]
        np.testing.assert_allclose(w["value"], dw["value"], rtol=1e-12)

    res = analyze("--window", "1 day", "--query", CUMULATIVE, "--json")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("ldp-stream analyze: error: --window: ") and res.stderr.count("\n") == 1, \
        res.stderr
