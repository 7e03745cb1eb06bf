"""Helpers of ``benchmarks/pipeline.py``: pipeline configs, pre-encoded records, raw produce,
child processes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._common import ROOT
from ingest.local.processes import spawn_process, stop_process

EXAMPLE = ROOT / "examples" / "flights.pipeline.toml"
SCHEMA = ROOT / "examples" / "flights.schema.toml"


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------
#: (reports per record, records) of the consume sections: ≥ 2 s of the raw loop each, so that
#: start-up (first fetch, threads) does not set the rate, and at 100 and 1000 reports/record long
#: enough (6·10⁶ and 1.2·10⁷ reports) that a fresh worker's warm-up fits (≈ 1 s of CPU, paid once
#: per partition) are a small part of the pass.
CONSUME_PLAN = [(1, 200_000), (100, 60_000), (1000, 12_000)]
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
    drop_windowed: bool = True,
    name: str | None = None,
) -> Path:
    """Copy of ``examples/flights.pipeline.toml`` with unique topics/group and the given settings;
    queries whose ``kind`` is in ``drop_kinds`` are left out, and with ``drop_windowed`` (the
    default: ``benchmarks/windows.py`` measures them) those with a ``window``. ``name``: the
    file's stem (default ``tag``; a second variant of one tag shares its topics)."""
    text = EXAMPLE.read_text()
    if drop_kinds or drop_windowed:
        head, *blocks = text.split("[[queries]]")
        keep = [b for b in blocks if not any(f'kind = "{k}"' in b for k in drop_kinds)
                and not (drop_windowed and "window = {" in b)]
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
    path = tmp / f"{name or tag}.pipeline.toml"
    path.write_text(text)
    return path


def load_config(path: Path):
    from aggregator.config import PipelineConfig

    return PipelineConfig.load(path)


def encoded_records(pool, per_record: int, k: int) -> list[bytes]:
    """``k`` distinct encoded records of ``per_record`` consecutive reports of ``pool`` (wrapping).

    A pool with event times keeps them increasing over the records: each time the records wrap
    around the pool, its event times are shifted by the pool's span (rounded up to the schema's
    resolution), so windows close as they would in a longer stream."""
    from ingest.client.batch import with_event_time
    from ingest.client.codec import encode
    from ingest.kafka.producer import slice_batch

    res = span = None
    if pool.event_time is not None:
        from ingest.client.schema import TelemetrySchema

        res = TelemetrySchema.load(SCHEMA).time_resolution_s
        span = (int(pool.event_time.max()) - int(pool.event_time.min())) // res * res + res
    out = []
    wrap = max(1, pool.n - per_record)
    for i in range(k):
        s = (i * per_record) % wrap
        part = slice_batch(pool, s, s + per_record)
        if res is not None:
            part = with_event_time(part, part.event_time + (i * per_record) // wrap * span)
        out.append(encode(part, time_resolution=res))
    return out


def stream_records(pool, per_record: int, n_records: int) -> list[bytes]:
    """The distinct records a stream of ``n_records`` repeats: at least 200, and enough to hold
    every report of ``pool`` once (at 1 report per record, 200 records repeated would feed the
    regressions' warm-up fits 200 distinct reports, whose DR objective is unbounded)."""
    return encoded_records(pool, per_record, min(n_records, max(200, -(-pool.n // per_record))))


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
    from ingest.kafka.clients import producer_client
    from ingest.kafka.settings import KafkaSettings

    prod = producer_client(KafkaSettings(bootstrap_servers=bootstrap), linger_ms=5,
                           max_request_size=16 << 20, batch_size=1 << 20)
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


def spawn(args: list[str], log: Path, tree: Path = ROOT) -> subprocess.Popen:
    """Start ``python -m benchmarks.pipeline <args>`` of the source tree ``tree`` (default this
    checkout; ``benchmarks/worker_ab.py`` passes an exported earlier commit) in its own session,
    output appended to ``log``."""
    return spawn_process(_python() + args, log_path=log, cwd=tree,
                         env={**os.environ, "PYTHONPATH": str(tree)})


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
    """Wait up to ``timeout`` s for each child to exit by itself, then SIGKILL it."""
    for pr in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            pr.wait(timeout=timeout)
        stop_process(pr, 10.0, signal.SIGKILL)
