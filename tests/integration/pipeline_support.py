"""Helpers shared by the worker / serve / exactly-once integration tests (not a test module).

Builds a pipeline config over ``examples/flights.schema.toml`` with unique topics, synthetic
privatized records, produces them to explicit partitions, and computes the reference single
in-process pass (same records, same doubling seeds) partition by partition.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from aggregator.metrics import metric_value, read_metrics  # noqa: F401  (tests call ps.metric_value)
from ingest.kafka.clients import admin_client, producer_client
from ingest.kafka.settings import KafkaSettings
from ingest.local.processes import spawn_process, stop_process

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "examples" / "flights.schema.toml"

QUERIES = """
[[queries]]
kind = "mean"
name = "arr_delay_mean"
field = "arr_delay"

[[queries]]
kind = "variance"
name = "dep_delay_var"
field = "dep_delay"

[[queries]]
kind = "frequency"
name = "carrier_freq"
field = "carrier"

[[queries]]
kind = "frequency"
name = "origin_freq"
field = "origin"
"""

OPTIONAL_QUERIES = {
    "HistogramState": """
[[queries]]
kind = "quantiles"
name = "arr_delay_quantiles"
field = "arr_delay"
q = [0.5, 0.9]
bins = 256
""",
    "GramState": """
[[queries]]
kind = "linear_regression"
name = "arr_on_dep"
response = "arr_delay"
covariates = ["dep_delay", "distance"]
""",
}


def available_queries() -> str:
    """The query tables for every state family registered right now (counts, moments always)."""
    from aggregator.state import STATE_CLASSES

    names = {getattr(c, "__name__", str(c)) for c in
             (STATE_CLASSES.values() if hasattr(STATE_CLASSES, "values") else STATE_CLASSES)}
    return QUERIES + "".join(q for cls, q in OPTIONAL_QUERIES.items() if cls in names)


def write_config(tmp_path: Path, bootstrap: str, topic_name, *, partitions: int = 4, group: str | None = None,
                 checkpoint_interval_s: float = 0.5, checkpoint_reports: int = 100_000,
                 max_record_bytes: int = 1 << 20, extra_queries: str = "",
                 malloc_trim_threshold_mib: int | None = None) -> Path:
    """Write ``pipeline.toml`` with unique topics; returns its path (``malloc_trim_threshold_mib``:
    ``[worker]``'s setting, the config's default when ``None``)."""
    name = "flights"
    text = f"""
[pipeline]
name = "{name}"
schema = "{SCHEMA}"

[kafka]
bootstrap_servers = "{bootstrap}"

[topics]
reports = "{topic_name('reports')}"
state = "{topic_name('state')}"
dead_letter = "{topic_name('dlq')}"
partitions = {partitions}

[worker]
group_id = "{group or topic_name('group')}"
checkpoint_interval_s = {checkpoint_interval_s}
checkpoint_reports = {checkpoint_reports}
max_record_bytes = {max_record_bytes}
{"" if malloc_trim_threshold_mib is None else f"malloc_trim_threshold_mib = {malloc_trim_threshold_mib}"}

[serve]
host = "127.0.0.1"
port = 0
refresh_interval_s = 0.2
""" + available_queries() + extra_queries
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    return path


def create_topics(bootstrap: str, cfg) -> None:
    """Create the reports (``partitions``), state (1) and dead-letter (1) topics."""
    from kafka.admin import NewTopic

    admin = admin_client(KafkaSettings(bootstrap_servers=bootstrap))
    try:
        admin.create_topics([NewTopic(cfg.topics.reports, cfg.topics.partitions, 1),
                             NewTopic(cfg.topics.state, 1, 1), NewTopic(cfg.topics.dead_letter, 1, 1)])
    finally:
        admin.close()


#: 2013-01-01T00:00:00Z, the start of the synthetic streams' event times.
T0 = 1356998400


def event_times(rng, m: int, *, days: float = 30.0, delayed: float = 0.02) -> np.ndarray:
    """Event times (Unix seconds) of ``m`` synthetic events in stream order: increasing over
    ``days`` from :data:`T0`, with a fraction ``delayed`` sent up to 3 days after they happened
    (late for a 6-hour grace)."""
    t = T0 + np.sort(rng.uniform(0.0, days * 86400.0, m))
    late = rng.random(m) < delayed
    t[late] -= rng.uniform(0.0, 3 * 86400.0, int(late.sum()))
    return np.maximum(t, T0).astype(np.int64)


def with_event_times(schema, cols: dict, rng, **kw) -> dict:
    """``cols`` plus the schema's time column (:func:`event_times`), if it has one."""
    if schema.event_time is not None:
        n = len(next(iter(cols.values())))
        cols = {**cols, schema.event_time.field: event_times(rng, n, **kw)}
    return cols


def make_records(schema, n_records: int, per_record: int, seed: int) -> list[bytes]:
    """``n_records`` encoded batches of ``per_record`` privatized synthetic flights."""
    from ingest.client.codec import encode
    from ingest.client.privatizer import Privatizer

    rng = np.random.default_rng(seed)
    priv = Privatizer(schema, rng=rng)
    cats = {c.name: list(c.categories) for c in schema.categorical}
    zil = schema.zil_mechanism() if schema.numeric_names else None
    out = []
    for _ in range(n_records):
        m = per_record
        cols = {}
        for j, name in enumerate(schema.numeric_names):
            lo, hi = zil.low[j], zil.high[j]
            cols[name] = lo + (hi - lo) * rng.beta(2.0, 5.0, m)
        for name, values in cats.items():
            cols[name] = np.asarray(values, dtype=object)[rng.integers(0, len(values), m)]
        cols = with_event_times(schema, cols, rng)
        out.append(encode(priv.privatize_batch(cols), time_resolution=schema.time_resolution_s))
    return out


def produce(bootstrap: str, topic: str, records: list[bytes], partitions: int, *, delay_s: float = 0.0,
            start: int = 0) -> list[tuple[int, int]]:
    """Send ``records`` round-robin over ``partitions`` (record i → partition (start+i) % P).

    Returns the (partition, offset) of every record.
    """
    prod = producer_client(KafkaSettings(bootstrap_servers=bootstrap), acks="all", max_request_size=8 << 20)
    futs = []
    try:
        for i, rec in enumerate(records):
            futs.append(prod.send(topic, value=rec, partition=(start + i) % partitions))
            if delay_s:
                time.sleep(delay_s)
        prod.flush(30)
        return [(f.get(10).partition, f.get(10).offset) for f in futs]
    finally:
        prod.close()


def reference_pass(runtime, records_by_partition: dict[int, list[bytes]], coalesce: bool = False) -> dict:
    """Single in-process pass: per partition, per record (or one coalesced update), then merge
    the partitions in ascending order — the same arithmetic the worker + serve perform."""
    merged: dict = {}
    for _p, states in sorted(reference_states(runtime, records_by_partition, coalesce).items()):
        for name, st in states.items():
            if name in merged:
                merged[name].merge(st)
            else:
                merged[name] = st
    return merged


def reference_states(runtime, records_by_partition: dict[int, list[bytes]], coalesce: bool = False) -> dict:
    """The states of each partition after a single in-process pass over its records (per record,
    or one coalesced update), with event times from the records (the synthetic records carry
    their own; Kafka timestamps are not known here): ``{partition: {query: state}}``."""
    from aggregator.worker import concat_batches

    out: dict = {}
    for p in sorted(records_by_partition):
        states = runtime.new_states()
        batches = []
        for rec in records_by_partition[p]:
            b = runtime.decode(rec)
            x2 = runtime.double(b, rec)
            if coalesce:
                batches.append((b, x2))
            else:
                for st in states.values():
                    st.update(b, x2)
        if coalesce and batches:
            b = concat_batches([x for x, _ in batches])
            x2 = np.concatenate([x for _, x in batches])
            for st in states.values():
                st.update(b, x2)
        out[p] = states
    return out


def read_state(bootstrap: str, state_topic: str, pipeline: str) -> tuple[dict, dict]:
    """The latest checkpoint per partition and the closed window panes of the state topic:
    ``({partition: Checkpoint}, {(partition, query, pane start): state bytes})``."""
    from aggregator.checkpoint import Checkpoint, StateTopicReader, parse_state_key

    reader = StateTopicReader.connect(KafkaSettings(bootstrap_servers=bootstrap), state_topic, pipeline,
                                      panes=True)
    try:
        reader.catch_up(30)
        cks, panes = {}, {}
        for key, value in reader.latest.items():
            _, part, query, start = parse_state_key(key)
            if query is None:
                cks[part] = Checkpoint.from_bytes(value)
            else:
                panes[(part, query, start)] = value
        return cks, panes
    finally:
        reader.close()


def read_checkpoints(bootstrap: str, state_topic: str, pipeline: str | None = None) -> dict:
    """Latest checkpoint per key of the state topic (decoded)."""
    from aggregator.checkpoint import Checkpoint, StateTopicReader

    reader = StateTopicReader.connect(KafkaSettings(bootstrap_servers=bootstrap), state_topic, pipeline)
    try:
        reader.catch_up(30)
        return {k: Checkpoint.from_bytes(v) for k, v in reader.latest.items()}
    finally:
        reader.close()


def worker_cmd(config: Path, *args: str) -> list[str]:
    """argv of an ``ldp-stream work`` subprocess."""
    boot = "import sys; from aggregator.cli import main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-c", boot, "-v", "work", "--config", str(config), *args]


def start_worker(config: Path, *args: str, log_path: Path | None = None) -> subprocess.Popen:
    """Start a worker process (its own session so it can be signalled alone; output appended to
    ``log_path``, discarded when ``None``)."""
    return spawn_process(worker_cmd(config, *args), log_path=log_path, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})


def has_family(text: str, name: str) -> bool:
    """Whether a Prometheus exposition declares the family ``name`` (with or without ``_total``)."""
    base = name.removesuffix("_total")
    return any(line.startswith((f"# TYPE {name} ", f"# TYPE {base} ")) for line in text.splitlines())


def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL, timeout: float = 20.0) -> int | None:
    """Send ``sig`` to a worker process (if alive) and reap it; SIGKILL if it does not exit."""
    return stop_process(proc, timeout, sig)


def scrape(port: int, path: str = "/metrics", timeout: float = 2.0) -> str:
    """GET ``http://127.0.0.1:port{path}`` as text."""
    return read_metrics(f"http://127.0.0.1:{port}{path}", timeout)


def until(fn, want, timeout: float = 10.0, every: float = 0.02):
    """Call ``fn() -> (key, value)`` until ``key == want`` (an HTTP status, a status string …);
    returns that call's ``value``. Fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (got := fn())[0] != want:
        assert time.monotonic() < deadline, f"still {got} after {timeout} s"
        time.sleep(every)
    return got[1]


def get_json(port: int, path: str, method: str = "GET") -> tuple[int, dict]:
    """HTTP request to serve; returns (status, JSON body)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body else {}


def read_dead_letters(bootstrap: str, topic: str, expected: int, timeout: float = 60.0) -> list:
    """The records of partition 0 of the dead-letter ``topic`` from its beginning: at least
    ``expected`` of them (or what arrived within ``timeout`` seconds), plus any that follow within
    a second — so that one too many is seen."""
    from kafka import TopicPartition

    from ingest.kafka.clients import consumer_client

    c = consumer_client(KafkaSettings(bootstrap_servers=bootstrap), enable_auto_commit=False,
                        auto_offset_reset="earliest", max_partition_fetch_bytes=32 << 20,
                        fetch_max_bytes=64 << 20)
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        out, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline and len(out) < expected:
            for recs in c.poll(timeout_ms=500).values():
                out.extend(recs)
        for recs in c.poll(timeout_ms=1000).values():  # anything beyond the expected ones
            out.extend(recs)
        return out
    finally:
        c.close()
