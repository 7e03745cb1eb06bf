"""Collector benchmark: devices → ``ldp-stream collect`` → broker, next to the Kafka producer path
(docs/collector.md §6, docs/benchmarks.md §3.8).

Loopback only, bounded in count and time. Three sections, one run:

* **throughput**: one collector process; N concurrent senders (threads of this process, one
  keep-alive connection and one token each) POST pre-encoded flight reports, 1 and 100 reports
  per batch; reports/s and p50/p99 latency of a POST (send → 202, which the collector answers
  only after the broker acknowledged the record).
* **producer**: ``ReportProducer`` and a raw kafka-python send loop at 1, 100 and 1000 reports per
  record, alternating passes (best of each and the median of the paired ratios), in the same run.
* **kill**: device senders (``ingest.device.sender.CollectorSender``, each with its own file outbox)
  stream batches while the broker is SIGKILLed and restarted; every batch is retried until
  accepted, and the reports topic must hold every body exactly once (count and SHA-256 of each
  record), and the collector's read-backs of unconfirmed batches are counted. Needs a broker whose
  storage survives its process (``--s3``: Tansu on S3 storage of a local moto server,
  ``benchmarks/_s3.py``); without it the section reports that it did not run.

    .venv/bin/python -m benchmarks.collector [--quick] [--senders 1,10,50] [--s3 [--kill-trials 5]]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks._common import ROOT, machine_info, table, write_json

SCHEMA_PATH = ROOT / "examples" / "flights.schema.toml"


# ---------------------------------------------------------------------- the collector process
def write_config(tmp: Path, bootstrap: str, topic: str, *, partitions: int = 4) -> Path:
    """A pipeline TOML for ``ldp-stream collect``: the flights schema, the topic, a token file
    and limits that do not throttle the benchmark."""
    cfg = tmp / "collector.pipeline.toml"
    cfg.write_text(
        f'[pipeline]\nname = "bench"\nschema = "{SCHEMA_PATH}"\n'
        f'[kafka]\nbootstrap_servers = "{bootstrap}"\n'
        f'[topics]\nreports = "{topic}"\nstate = "{topic}.state"\ndead_letter = "{topic}.dlq"\n'
        f"partitions = {partitions}\n"
        '[collector]\nport = 0\ntoken_file = "tokens"\nrate_limit_reports_per_s = 1e9\n'
        "rate_limit_burst = 1000000000\nack_timeout_s = 5.0\ndelivery_timeout_s = 60.0\n")
    return cfg


class CollectorProcess:
    """``ldp-stream collect --config CFG`` in a child process; ``url`` once it is ready."""

    def __init__(self, cfg: Path, log: Path) -> None:
        self.cfg, self.log_path = cfg, log
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> CollectorProcess:
        self._log = open(self.log_path, "w")  # closed in __exit__
        self.proc = subprocess.Popen([sys.executable, "-m", "aggregator.cli", "collect", "--config",
                                      str(self.cfg)], stderr=subprocess.PIPE, stdout=self._log,
                                     text=True, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = self.proc.stderr.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+)/v1/reports", line)
        if not m:
            raise RuntimeError(f"collector did not start: {line}{self.proc.stderr.read()}")
        self.url = m.group(1)
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + 30
        while _get(self.url + "/readyz") != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("collector did not become ready")
            time.sleep(0.05)
        return self

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self._log.write(line)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the collector process so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _get(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


# ---------------------------------------------------------------------- throughput
def _post_loop(url: str, token: str, bodies: list[bytes], out: dict, stop_at: float) -> None:
    """POST ``bodies`` in order over one keep-alive connection; record latencies and statuses."""
    from ingest.device.http_protocol import CONTENT_TYPE, IDEMPOTENCY_HEADER, REPORTS_PATH

    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    lat, statuses = [], Counter()
    for b in bodies:
        if time.monotonic() > stop_at:
            break
        t0 = time.perf_counter()
        conn.request("POST", REPORTS_PATH, body=b, headers={
            "Authorization": f"Bearer {token}", "Content-Type": CONTENT_TYPE,
            IDEMPOTENCY_HEADER: uuid.uuid4().hex})
        r = conn.getresponse()
        r.read()
        lat.append(time.perf_counter() - t0)
        statuses[r.status] += 1
    conn.close()
    out["lat"], out["statuses"] = lat, statuses


def section_throughput(tmp: Path, bootstrap: str, pool, senders: list[int], per_sender: dict[int, int],
                       max_s: float) -> list[dict]:
    from aggregator.collector.tokens import mint_token
    from ingest.client.encode import encode_records
    from ingest.kafka.topics import ensure_topic

    rows = []
    res = _schema().time_resolution_s
    for rpb in (1, 100):
        bodies = encode_records(pool, rpb, time_resolution=res)
        for n_send in senders:
            topic = f"bench-col-{rpb}-{n_send}-{time.monotonic_ns()}"
            ensure_topic(bootstrap, topic, 4)
            run = tmp / f"t{rpb}-{n_send}"
            run.mkdir()
            cfg = write_config(run, bootstrap, topic)
            tokens = [mint_token(run / "tokens", f"dev{i}") for i in range(n_send)]
            count = per_sender[rpb]
            with CollectorProcess(cfg, run / "collector.log") as col:
                outs = [{} for _ in range(n_send)]
                stop_at = time.monotonic() + max_s
                threads = [threading.Thread(target=_post_loop, args=(
                    col.url, tokens[i], [bodies[(i * count + j) % len(bodies)] for j in range(count)],
                    outs[i], stop_at)) for i in range(n_send)]
                cpu0, t0 = col.cpu_s(), time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - t0
                cpu = col.cpu_s() - cpu0
            lat = np.concatenate([np.asarray(o["lat"]) for o in outs])
            statuses = sum((o["statuses"] for o in outs), Counter())
            ok = statuses.get(202, 0)
            row = {"reports_per_batch": rpb, "senders": n_send, "batches": int(lat.size),
                   "accepted": ok, "statuses": dict(statuses), "wall_s": wall,
                   "batches_per_s": ok / wall, "reports_per_s": ok * rpb / wall,
                   "p50_ms": float(np.percentile(lat, 50) * 1e3),
                   "p99_ms": float(np.percentile(lat, 99) * 1e3),
                   "collector_cpu_s": cpu, "reports_per_collector_cpu_s": ok * rpb / max(cpu, 1e-9)}
            rows.append(row)
            print(f"  collector rpb={rpb} senders={n_send}: {row['reports_per_s']:,.0f} reports/s, "
                  f"p50 {row['p50_ms']:.1f} ms p99 {row['p99_ms']:.1f} ms, statuses {dict(statuses)}",
                  flush=True)
    return rows


# ---------------------------------------------------------------------- producer path
def section_producer(bootstrap: str, pool, plan: list[tuple[int, int]], repeats: int) -> list[dict]:
    from benchmarks.produce import bench_producer, bench_raw

    rows = []
    schema = _schema()
    for rpr, n in plan:
        prod, raw = [], []
        for _ in range(repeats):  # alternating: the machine's slow and fast phases hit both
            prod.append(bench_producer(bootstrap, schema, pool, rpr, n)[0])
            raw.append(bench_raw(bootstrap, schema, pool, rpr, n)[0])
        paired = [p / r for p, r in zip(prod, raw)]
        rows.append({"reports_per_record": rpr, "reports": n, "producer_reports_per_s": max(prod),
                     "raw_reports_per_s": max(raw), "producer_vs_raw_best": max(prod) / max(raw),
                     "producer_vs_raw_paired_median": float(np.median(paired)),
                     "producer_all": prod, "raw_all": raw})
        print(f"  producer rpr={rpr}: {max(prod):,.0f} vs raw {max(raw):,.0f} reports/s "
              f"(best/best {max(prod) / max(raw):.0%}, paired median {np.median(paired):.0%})", flush=True)
    return rows


# ---------------------------------------------------------------------- broker kill
def section_kill(tmp: Path, broker, pool, *, devices: int, batches: int, rpb: int, kill_after: float,
                 down_s: float) -> dict:
    """Devices stream through the collector; the broker is SIGKILLed once ``kill_after`` of the
    batches are accepted and restarted ``down_s`` later; then every body must be in the topic once."""
    from aggregator.collector.tokens import mint_token
    from ingest.client.batch import slice_batch
    from ingest.client.encode import encode_records
    from ingest.device.sender import CollectorSender
    from ingest.kafka.clients import topic_values
    from ingest.kafka.topics import ensure_topic

    schema = _schema()
    topic = f"bench-kill-{time.monotonic_ns()}"
    ensure_topic(broker.bootstrap_servers, topic, 4)
    run = tmp / "kill"
    run.mkdir(parents=True)
    cfg = write_config(run, broker.bootstrap_servers, topic)
    tokens = [mint_token(run / "tokens", f"dev{i}") for i in range(devices)]
    # every device sends its own reports: batch j of device i is a distinct slice of the pool
    per_dev = batches * rpb
    firsts = [(i * per_dev) % (pool.n - per_dev) for i in range(devices)]
    parts = [slice_batch(pool, a, a + per_dev) for a in firsts]
    expected = Counter(hashlib.sha256(b).hexdigest() for p in parts
                       for b in encode_records(p, rpb, time_resolution=schema.time_resolution_s))
    result: dict = {"devices": devices, "batches_per_device": batches, "reports_per_batch": rpb,
                    "down_s": down_s}
    with CollectorProcess(cfg, run / "collector.log") as col:
        senders = [CollectorSender(col.url, tokens[i], schema, outbox=run / f"dev{i}.outbox.db",
                                   reports_per_batch=rpb, backoff_initial_s=0.2, backoff_max_s=2.0,
                                   timeout_s=10.0) for i in range(devices)]
        feeders = [threading.Thread(target=_feed, args=(s, p, rpb)) for s, p in zip(senders, parts)]
        t0 = time.perf_counter()
        for f in feeders:
            f.start()
        total = devices * batches
        while sum(s.stats.batches_accepted for s in senders) < kill_after * total:
            time.sleep(0.01)
        before = sum(s.stats.batches_accepted for s in senders)
        t_kill = time.perf_counter() - t0
        broker.kill()
        time.sleep(down_s)
        broker.restart()
        t_back = time.perf_counter() - t0
        for f in feeders:
            f.join()
        for s in senders:
            s.flush(180)
        wall = time.perf_counter() - t0
        stats = [s.stats for s in senders]
        for s in senders:
            s.close()
        readbacks = _readbacks(col.url)
    values = topic_values(broker.bootstrap_servers, topic)
    got = Counter(hashlib.sha256(v).hexdigest() for v in values)
    result.update({
        "accepted_before_kill": before, "kill_at_s": t_kill, "broker_back_at_s": t_back, "wall_s": wall,
        "batches_accepted": sum(s.batches_accepted for s in stats),
        "duplicates_answered": sum(s.duplicates for s in stats),
        "retries": sum(s.retries for s in stats), "rejected": sum(s.rejected for s in stats),
        "records_in_topic": len(values), "distinct_in_topic": len(got),
        "missing": sum((expected - got).values()), "extra": sum((got - expected).values()),
        "duplicated": sum(c - 1 for c in got.values() if c > 1),
        "reports_in_topic": _count_reports(values, schema), "reports_sent": devices * per_dev,
        "readbacks": readbacks,
    })
    result["exactly_once"] = (result["missing"] == 0 and result["extra"] == 0 and result["duplicated"] == 0
                              and result["reports_in_topic"] == result["reports_sent"])
    print(f"  kill: {result}", flush=True)
    return result


def _readbacks(url: str) -> dict[str, int]:
    """The collector's ``ldp_collector_readbacks_total`` by outcome."""
    from aggregator.metrics import metric_value, read_metrics

    text = read_metrics(url + "/metrics", timeout=5)
    return {o: int(metric_value(text, "ldp_collector_readbacks_total", f'outcome="{o}"'))
            for o in ("found", "absent", "failed")}


def _feed(sender, part, rpb: int) -> None:
    """Hand a device's reports to its sender a batch at a time, as a device would."""
    from ingest.client.batch import slice_batch

    for j in range(0, part.n, rpb):
        sender.send(slice_batch(part, j, j + rpb))
        time.sleep(0.002)


def _count_reports(values: list[bytes], schema) -> int:
    from ingest.client.codec import decode

    return sum(decode(v, {schema.fingerprint: schema}).n for v in values)


def _schema():
    from ingest.client.schema import TelemetrySchema

    return TelemetrySchema.load(SCHEMA_PATH)


# ---------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    ap.add_argument("--senders", default="1,10,50", help="concurrent senders, comma-separated")
    ap.add_argument("--max-s", type=float, default=20.0, help="time bound of one throughput case")
    ap.add_argument("--repeats", type=int, default=5, help="alternating producer/raw passes")
    ap.add_argument("--kill-trials", type=int, default=5, help="broker kills (one fresh broker each)")
    ap.add_argument("--s3", action="store_true",
                    help="run the broker-kill section on a broker with S3 storage (a local moto server)")
    args = ap.parse_args(argv)
    import tempfile

    from benchmarks.produce import report_pool
    from ingest.local.broker import EmbeddedBroker

    senders = [int(s) for s in args.senders.split(",")]
    schema = _schema()
    pool = report_pool(schema, 100_000)
    per_sender = {1: 200 if args.quick else 2000, 100: 50 if args.quick else 400}
    plan = ([(1, 5000), (100, 100_000), (1000, 300_000)] if args.quick
            else [(1, 20_000), (100, 1_000_000), (1000, 1_000_000)])
    out: dict = {"machine": machine_info(), "command": "python -m benchmarks.collector "
                 + " ".join(argv if argv is not None else sys.argv[1:])}
    with tempfile.TemporaryDirectory(prefix="ldp-bench-col-") as d:
        tmp = Path(d)
        with EmbeddedBroker() as b:
            print("throughput (one collector process)", flush=True)
            out["throughput"] = section_throughput(tmp, b.bootstrap_servers, pool, senders, per_sender,
                                                   args.max_s)
            print("producer path", flush=True)
            repeats = 2 if args.quick else args.repeats
            out["producer"] = section_producer(b.bootstrap_servers, pool, plan, repeats)
        if args.s3:
            from benchmarks._s3 import MotoS3Server

            print("broker kill (Tansu on S3 storage of a local moto server)", flush=True)
            out["kill"] = []
            for trial in range(1 if args.quick else args.kill_trials):
                with MotoS3Server() as s3, EmbeddedBroker(storage_url=s3.storage_url,
                                                          env=s3.broker_env()) as broker:
                    # down longer than ack_timeout_s (5 s): the devices get 503s and retry
                    row = section_kill(tmp / f"trial{trial}", broker, pool, devices=4,
                                       batches=40 if args.quick else 150, rpb=100, kill_after=0.3,
                                       down_s=8.0)
                out["kill"].append({"trial": trial, **row})
        else:
            out["kill"] = [{"ran": False, "why": "needs --s3 (a broker whose storage survives SIGKILL)"}]
    path = write_json("collector", out)
    print(table(["reports/batch", "senders", "reports/s", "p50 ms", "p99 ms", "collector CPU-s"],
                [[r["reports_per_batch"], r["senders"], round(r["reports_per_s"]), round(r["p50_ms"], 1),
                  round(r["p99_ms"], 1), round(r["collector_cpu_s"], 1)] for r in out["throughput"]]))
    print(table(["reports/record", "ReportProducer", "raw send loop", "best / best", "paired median"],
                [[r["reports_per_record"], round(r["producer_reports_per_s"]), round(r["raw_reports_per_s"]),
                  f"{r['producer_vs_raw_best']:.0%}", f"{r['producer_vs_raw_paired_median']:.0%}"]
                 for r in out["producer"]]))
    if out["kill"][0].get("ran", True):
        print(table(["trial", "batches accepted", "503s retried", "answered duplicate", "read back: found",
                     "absent", "in topic", "missing", "duplicated", "reports in topic / sent"],
                    [[r["trial"], r["batches_accepted"], r["retries"], r["duplicates_answered"],
                      r["readbacks"].get("found", 0), r["readbacks"].get("absent", 0), r["records_in_topic"],
                      r["missing"], r["duplicated"], f"{r['reports_in_topic']} / {r['reports_sent']}"]
                     for r in out["kill"]]))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
