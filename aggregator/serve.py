"""Merge partition checkpoints into global estimates and serve them (docs/deploy.md, "The HTTP API
of serve"; the estimators: docs/mechanisms.md §6).

* :func:`merge_checkpoints` restores every partition's states and merges them per query (in
  ascending partition order, so the result is deterministic).
* :class:`EstimateStore` keeps the latest checkpoint per ``"<pipeline>/<partition>"`` key of the
  state topic — a background thread reads it with a group-less consumer assigned to every
  partition from the beginning — and recomputes the merged estimates and the Prometheus gauges.
  A query whose estimate is a batch fit (a renewable query still in its warm-up) is estimated on
  a second thread, so that a slow fit does not hold up the other queries' estimates; until it is
  done its entry is the previous one with ``"pending": true``.
* :func:`build_app` is a read-only starlette app: ``GET /estimates``, ``GET /estimates/{query}``,
  ``GET /privacy``, ``GET /healthz`` (liveness), ``GET /readyz`` (readiness), ``GET /metrics``.
  Other methods get 405; errors are JSON (never a traceback).

Health (docs/deploy.md): ``/healthz`` is 200 while the refresh thread runs — ``"status": "ok"``,
or ``"degraded"`` with ``last_error`` while the state topic cannot be read (a restart would not
help: the last good estimates stay served) — and 503 once the thread has died. ``/readyz`` is 200
once the state topic has been read to its end and while the broker last answered less than
``stale_after_s`` seconds ago; otherwise 503 with the reason, so that a fresh replica gets no
traffic before it holds the estimates, nor a replica cut off from the broker.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aggregator.checkpoint import Checkpoint, CheckpointError, StateTopicReader, parse_state_key
from aggregator.errors import AggregatorError, ConfigError
from aggregator.metrics import CONTENT_TYPE_LATEST, ServeMetrics
from aggregator.windows import WindowView, latest_final

__all__ = ["EstimateStore", "build_app", "estimate_payload", "merge_checkpoints", "merge_restored",
           "restore_checkpoint", "run_server"]

log = logging.getLogger(__name__)


def merge_checkpoints(checkpoints: Iterable[Checkpoint], runtime) -> tuple[dict, dict]:
    """Restore and merge partition checkpoints per query.

    Parameters
    ----------
    checkpoints : iterable of Checkpoint
        At most one per partition (the latest); other pipelines' checkpoints are ignored.
    runtime : aggregator.plan.PipelineRuntime
        Provides ``restore_state(name, blob)``, the pipeline name and the fingerprint.

    Returns
    -------
    states : dict str → state
        Merged state per query (queries without any checkpoint are absent).
    info : dict
        ``partitions`` (sorted list), ``reports`` (sum) and ``next_offsets`` ({partition: offset}).

    Raises
    ------
    StateError
        If a checkpoint's states cannot be restored or merged (callers may skip it).
    """
    parts = sorted((c for c in checkpoints if c.pipeline == runtime.name), key=lambda c: c.partition)
    merged = merge_restored([restore_checkpoint(ck, runtime) for ck in parts])
    info = {
        "partitions": [c.partition for c in parts],
        "reports": sum(c.reports for c in parts),
        "next_offsets": {c.partition: c.next_offset for c in parts},
    }
    return merged, info


def restore_checkpoint(ck: Checkpoint, runtime) -> dict:
    """The states of one partition checkpoint, by query name.

    Raises
    ------
    CheckpointError
        If it was built for another schema or holds another query set (as the workers refuse it).
    StateError
        If a state cannot be restored.
    """
    if ck.fingerprint != runtime.fingerprint:
        raise CheckpointError(f"checkpoint of partition {ck.partition} has another schema fingerprint")
    if runtime.queries:  # as the workers: a query added or removed makes it unusable
        ck.require_queries(runtime.queries)
    return {name: runtime.restore_state(name, blob) for name, blob in ck.states.items()}


def merge_restored(restored: Iterable[Mapping], skip: Iterable[str] = ()) -> dict:
    """Merge restored partition states per query, in the given order (in place into the first
    partition's states); queries in ``skip`` are left out."""
    skip = set(skip)
    merged: dict[str, Any] = {}
    for states in restored:
        for name, st in states.items():
            if name in skip:
                continue
            if name in merged:
                merged[name].merge(st)
            else:
                merged[name] = st
    return merged


def estimate_payload(name: str, state) -> dict:
    """JSON-ready estimate of one merged state.

    Returns
    -------
    dict
        ``Estimate.to_dict()`` (value, stderr, ci_low, ci_high, n, level, params, …), plus
        ``hessian_guard`` for the renewable regression states (docs/mechanisms.md §6.6) and
        ``independence`` (``{"assumed": true, "memoized_fields", "note"}``) when the query reads
        a memoized field (:func:`memoized_fields`, docs/devices.md §4); when the
        state cannot estimate yet, ``{"query": name, "n": state.n, "error": "..."}``.
    """
    try:
        out = state.estimate().to_dict()
        guarded = getattr(state, "guarded", None)
        if guarded is not None:  # renewable states: how often H's positive-definiteness guard acted
            out["hessian_guard"] = int(guarded)
        memo = memoized_fields(state)
        if memo:
            out["independence"] = {
                "assumed": True, "memoized_fields": list(memo),
                "note": "stderr and the interval treat every report as independent, but devices resend "
                        f"the memoized reports of {', '.join(memo)}: with T resends of one randomization "
                        "they are up to sqrt(T) too narrow (docs/devices.md §4)"}
        return out
    except (AggregatorError, ValueError, ArithmeticError) as exc:
        return {"query": name, "n": int(getattr(state, "n", 0)), "error": str(exc)}
    except Exception as exc:  # a bug in one state (or a user's loss) must not stop the others
        log.exception("query %r: estimate failed", name)
        return {"query": name, "n": int(getattr(state, "n", 0)),
                "error": f"internal error: {type(exc).__name__}: {exc}"}


def memoized_fields(state) -> tuple[str, ...]:
    """The fields of ``state``'s query that the schema memoizes (docs/devices.md §3): their
    reports may be resends of one randomization, which the intervals do not model.

    Parameters
    ----------
    state : State
        A query state (``query`` and ``schema`` attributes).

    Returns
    -------
    tuple of str
        In the query's field order; empty when none (or the state has no query).
    """
    from aggregator.queries import query_fields

    query, schema = getattr(state, "query", None), getattr(state, "schema", None)
    if query is None or schema is None:
        return ()
    memo = {c.name for c in schema.categorical if c.memoize}
    if schema.numeric is not None:
        memo |= {f.name for f in schema.numeric.fields if f.memoize}
    return tuple(f for f in query_fields(query) if f in memo)


class EstimateStore:
    """Merged estimates of one pipeline, refreshed from the state topic.

    Parameters
    ----------
    runtime : aggregator.plan.PipelineRuntime
        Pipeline name, fingerprint, ``restore_state`` and the schema (for ``/privacy``).
    reader : StateTopicReader or None
        Source of checkpoints (``None``: feed :meth:`set_checkpoints` by hand — tests).
    metrics : ServeMetrics or None
        Gauges to update; ``None`` creates one with a private registry.
    refresh_interval_s : float
        Seconds between recomputations of the merged estimates (> 0). A poll that returns state
        records shows the broker answers; after ``stale_after_s / 3`` without any, a refresh asks
        the broker for the state topic's end offsets (:meth:`StateTopicReader.probe`).
    stale_after_s : float
        :meth:`readiness` fails once the broker has not answered for this many seconds
        (> ``refresh_interval_s``).
    reports_topic : str or None
        With windowed queries: the reports topic, whose partitions' end offsets tell which
        partitions are caught up (an idle one stops holding windows open). ``None``: every
        partition with a checkpoint holds windows open.
    window_idle_timeout_s : float
        A caught-up partition without a new checkpoint for this long is idle (> 0;
        docs/windows.md §4).
    background : bool or None
        Estimate a query whose ``costly_estimate`` is true (its estimate is a batch fit: a
        renewable query in its warm-up) on the ``ldp-estimate`` thread; meanwhile its entry is
        the previous one (or a placeholder with ``error``) with ``"pending": true``. ``None``:
        when there is a ``reader`` (a store fed by hand computes everything in
        :meth:`set_checkpoints`). :meth:`wait_estimates` waits for them.

    Attributes
    ----------
    loaded_at, last_contact : float or None
        Unix times the state topic was first read to its end, and the broker last answered.

    Raises
    ------
    ConfigError
        If ``refresh_interval_s`` ≤ 0 or ``stale_after_s`` ≤ ``refresh_interval_s``.
    """

    def __init__(self, runtime, reader: StateTopicReader | None = None, metrics: ServeMetrics | None = None,
                 refresh_interval_s: float = 1.0, stale_after_s: float = 60.0, *,
                 reports_topic: str | None = None, window_idle_timeout_s: float = 300.0,
                 background: bool | None = None) -> None:
        if not (isinstance(refresh_interval_s, int | float) and refresh_interval_s > 0):
            raise ConfigError(f"refresh_interval_s must be > 0 seconds, got {refresh_interval_s!r}")
        if not (isinstance(stale_after_s, int | float) and stale_after_s > refresh_interval_s):
            raise ConfigError(f"stale_after_s must be > refresh_interval_s ({refresh_interval_s}), "
                              f"got {stale_after_s!r}")
        self.runtime = runtime
        self.reader = reader
        self.metrics = metrics if metrics is not None else ServeMetrics()
        self.reports_topic = reports_topic
        self.window_view = (WindowView(runtime, window_idle_timeout_s)
                            if getattr(runtime, "windowed", ()) else None)
        self._windows: dict[str, dict] = {}
        self.partition_ends: dict[int, int] | None = None  # reports-topic end offsets (windowed)
        self.refresh_interval_s = float(refresh_interval_s)
        self.stale_after_s = float(stale_after_s)
        self.loaded_at: float | None = None
        self.last_contact: float | None = None
        self._lock = threading.Lock()
        self._estimates: dict[str, dict] = {}
        self._info: dict = {"partitions": [], "reports": 0, "next_offsets": {}}
        self._bad: set[tuple[bytes, int]] = set()
        self._computed_for: tuple | None = None  # the (key, offset) set of the last computation
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_refresh: float | None = None
        self.last_error: str | None = None
        self.background = reader is not None if background is None else bool(background)
        self._idle = threading.Condition(self._lock)
        self._seq = 0  # numbers the merged states queued for a late estimate
        self._wanted: dict[str, tuple[int, Any]] = {}  # query → the newest state to estimate late
        self._late: dict[str, tuple[int, dict]] = {}  # query → the last estimate computed late
        self._running: set[str] = set()
        self._queued: dict[str, tuple[Any, int]] = {}  # query → (inputs, number) queued last

    # -------------------------------------------------------------------------------- refresh
    def set_checkpoints(self, raw: Mapping[bytes, bytes], offsets: Mapping[bytes, int] | None = None) -> None:
        """Recompute the merged estimates from the latest raw checkpoint per key.

        With ``offsets`` (the state-topic offset of each key's record), nothing is recomputed
        while no key's offset changed.

        Undecodable checkpoints are logged, counted once (``ldp_state_records_invalid_total``)
        and skipped.
        """
        inputs = None  # the (key, offset) set merged: a costly estimate is queued once per set
        if offsets is not None:
            sig = inputs = tuple(sorted((bytes(k), offsets.get(k, -1)) for k in raw))
            if self.window_view is not None:  # finality also moves with the ends and idle time
                tick = int(time.time() // max(1.0, self.window_view.idle_timeout_s / 10))
                sig += (tuple(sorted((self.partition_ends or {}).items())), tick)
            if sig == self._computed_for:  # no checkpoint changed since the last computation
                self.last_refresh = time.time()
                return
            self._computed_for = sig
        cks, panes = [], {}
        windowed = set(getattr(self.runtime, "windowed", ()))
        for key, value in raw.items():
            try:
                pipeline, part, query, start = parse_state_key(key)
            except CheckpointError:
                continue
            if pipeline != self.runtime.name:
                continue  # another pipeline sharing the state topic
            if query is not None:  # a closed window pane (docs/windows.md §3)
                if query in windowed:
                    panes[(query, part, start)] = (key, value, (offsets or {}).get(key, -1))
                continue
            try:
                ck = Checkpoint.from_bytes(value)
            except CheckpointError as exc:
                tag = (key, (offsets or {}).get(key, -1))
                if tag not in self._bad:
                    self._bad.add(tag)
                    self.metrics.state_invalid.inc()
                    log.error("state record %r failed to decode: %s", key, exc)
                continue
            if ck.pipeline == self.runtime.name:
                cks.append(ck)
        good, unusable, restored = [], [], {}
        for ck in sorted(cks, key=lambda c: c.partition):  # one by one: a bad partition hides no other
            try:
                restored[ck.partition] = restore_checkpoint(ck, self.runtime)
                good.append(ck)
            except Exception as exc:
                unusable.append((ck.partition, exc))
                tag = (ck.key, (offsets or {}).get(ck.key, -1))
                if tag not in self._bad:
                    self._bad.add(tag)
                    self.metrics.state_invalid.inc()
                    log.error("checkpoint %r cannot be restored: %s", ck.key, exc)
        windows = {}
        if self.window_view is not None:
            windows = self.window_view.compute(restored, {ck.partition: ck for ck in good}, panes,
                                               self.partition_ends, time.time())
        merged = merge_restored(restored.values(), skip=windowed)
        info = {"partitions": [c.partition for c in good], "reports": sum(c.reports for c in good),
                "next_offsets": {c.partition: c.next_offset for c in good}}
        missing = "no checkpoint yet"
        if unusable:  # e.g. the queries were edited: the workers rebuild those partitions
            parts = sorted(p for p, _ in unusable)
            missing = (f"no usable checkpoint yet: the checkpoints of partition(s) {parts} cannot be "
                       f"restored with this config ({unusable[0][1]}); if the queries changed, the "
                       "workers rebuild them from the earliest offset (docs/deploy.md, \"Changing "
                       "the queries\")")
        estimates, late = {}, {}
        for name in self.runtime.queries or merged:
            if name in windows:  # the latest final window (docs/windows.md §4)
                est = latest_final(windows[name])
                if "error" not in est:
                    self.metrics.set_window(name, est)
                else:
                    self.metrics.clear_window(name)
            elif name in merged and self.background and getattr(merged[name], "costly_estimate", False):
                est, late[name] = self._estimate_late(name, merged[name], inputs)
            else:
                est = (estimate_payload(name, merged[name]) if name in merged
                       else {"query": name, "n": 0, "error": missing})
                self._publish_metrics(name, est)
            estimates[name] = est
            self.metrics.partitions.labels(query=name).set(len(info["partitions"]))
        with self._lock:
            landed = [name for name, seq in late.items()  # while the others were computed
                      if self._late.get(name, (-1,))[0] == seq]
            for name in landed:
                estimates[name] = self._late[name][1]
            self._estimates = estimates
            self._windows = windows
            self._info = info
            self.last_refresh = time.time()
        for name in landed:
            self._publish_metrics(name, estimates[name])
        if self.reader is None:  # fed by hand: the caller's checkpoints are the whole topic
            self._contact(loaded=True)

    def _publish_metrics(self, name: str, est: dict) -> None:
        if "error" not in est:
            self.metrics.set_estimate(name, est)
        else:
            self.metrics.reports.labels(query=name).set(est.get("n", 0))

    def _estimate_late(self, name: str, state, inputs=None) -> tuple[dict, int]:
        """Queue ``state`` (the newest merged state of ``name``) for the ``ldp-estimate`` thread;
        return the entry to serve meanwhile (the last one, marked ``"pending": true``) and the
        queued state's number. The same ``inputs`` (not None) as the state queued last queue
        nothing: a recomputation without a new checkpoint (the windows' clock) serves that
        state's estimate, or waits for it, instead of starting the fit again."""
        with self._lock:
            queued, seq = self._queued.get(name, (None, 0))
            fresh = start = inputs is None or inputs != queued
            if fresh:
                self._seq += 1
                seq = self._seq
                self._queued[name] = (inputs, seq)
                self._wanted[name] = (seq, state)
                start = name not in self._running
                self._running.add(name)
            done, prev = self._late.get(name, (0, None))
        if done == seq and not fresh:  # these checkpoints' estimate is computed
            return prev, seq
        if start:
            threading.Thread(target=self._late_loop, args=(name,), name="ldp-estimate", daemon=True).start()
        if prev is None:
            prev = {"query": name, "n": int(getattr(state, "n", 0)),
                    "error": "the estimate (a batch fit of the reports of the warm-up) is being computed"}
        return {**prev, "pending": True}, seq

    def _late_loop(self, name: str) -> None:
        """Estimate ``name``'s newest queued state until none is queued (one thread per query at
        a time; a state queued meanwhile replaces the one waiting)."""
        while True:
            with self._lock:
                seq, state = self._wanted.pop(name, (0, None))
                if state is None or self._stop.is_set():
                    self._running.discard(name)
                    self._idle.notify_all()
                    return
            est = estimate_payload(name, state)
            with self._lock:
                self._late[name] = (seq, est)
                # serve it if no newer state waits and the entry served is still a pending one (a
                # refresh that estimated the query at once, its warm-up done, is newer than this)
                serve = name not in self._wanted and self._estimates.get(name, {}).get("pending", False)
                if serve:
                    self._estimates = {**self._estimates, name: est}
            if serve:
                self._publish_metrics(name, est)

    def wait_estimates(self, timeout_s: float = 30.0) -> bool:
        """Wait until no estimate is being computed late (``background``); False on timeout."""
        with self._lock:
            return self._idle.wait_for(lambda: not self._running, timeout=timeout_s)

    def _contact(self, loaded: bool = False) -> None:
        """Record an answer of the broker (and, with ``loaded``, a full read of the topic)."""
        now = time.time()
        self.last_contact = now
        if loaded and self.loaded_at is None:
            self.loaded_at = now
        self.metrics.state_contact.set(now)

    def refresh(self, timeout_s: float = 30.0) -> None:
        """Read the state topic to its end and recompute (synchronously: waits up to
        ``timeout_s`` more for the estimates computed late)."""
        if self.reader is None:
            raise AggregatorError("EstimateStore has no state-topic reader")
        self.reader.catch_up(timeout_s)
        self._refresh_ends()
        self.set_checkpoints(dict(self.reader.latest), dict(self.reader.offsets))
        self.wait_estimates(timeout_s)
        self._contact(loaded=True)

    def _refresh_ends(self) -> None:
        """With windowed queries: the reports topic's end offsets (which partitions are caught up)."""
        if self.window_view is not None and self.reports_topic and self.reader is not None:
            self.partition_ends = self.reader.end_offsets_of(self.reports_topic)

    def _loop(self) -> None:
        next_compute = 0.0
        while not self._stop.is_set():
            try:
                if self.loaded_at is None:  # first read the topic to its end (readiness)
                    self.refresh(timeout_s=max(10.0, self.stale_after_s))
                    self.last_error = None
                    next_compute = time.monotonic() + self.refresh_interval_s
                if self.reader.poll(timeout_ms=200):
                    self._contact()  # records arrived: the broker answers
                if time.monotonic() >= next_compute:
                    self._refresh_ends()
                    self.set_checkpoints(dict(self.reader.latest), dict(self.reader.offsets))
                    next_compute = time.monotonic() + self.refresh_interval_s
                    if time.time() - (self.last_contact or 0.0) >= self.stale_after_s / 3:
                        # nothing arrived lately: ask the broker (a ListOffsets request queues
                        # behind the reader's long-poll fetch, so it is not sent on every refresh)
                        self.reader.probe(timeout_s=min(10.0, self.stale_after_s))
                        self._contact()
                    self.last_error = None
            except Exception as exc:  # keep serving the last good estimates
                text = str(exc)  # kafka-python's errors start with their class name already
                name = type(exc).__name__
                self.last_error = text if text.startswith(name) else f"{name}: {text}"
                log.warning("state-topic refresh failed: %s", self.last_error)
                self._stop.wait(1.0)

    # -------------------------------------------------------------------------------- health
    def health(self) -> tuple[int, dict]:
        """Liveness: ``(HTTP status, body)`` — 503 once the started refresh thread has died, else
        200 with ``"status"`` ``"ok"`` or ``"degraded"`` (the last refresh failed: ``last_error``)."""
        body = {"last_refresh": self.last_refresh, "last_contact": self.last_contact,
                "last_error": self.last_error, "partitions": self.info()["partitions"]}
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            return 503, {"status": "failed", "error": "the state-topic refresh thread stopped", **body}
        return 200, {"status": "degraded" if self.last_error else "ok", **body}

    def readiness(self) -> tuple[int, dict]:
        """Readiness: ``(HTTP status, body)`` — 200 ``{"status": "ready"}`` once the state topic
        has been read to its end and while the broker answered within ``stale_after_s``; else 503
        ``{"status": "not_ready", "reason": ...}``."""
        code, body = self.health()
        if code != 200:
            return code, {**body, "status": "not_ready", "reason": body["error"]}
        if self.loaded_at is None:
            reason = "the state topic has not been read to its end yet"
        elif time.time() - (self.last_contact or 0.0) > self.stale_after_s:
            reason = (f"no answer from the broker for {time.time() - (self.last_contact or 0.0):.0f} s "
                      f"(stale_after_s = {self.stale_after_s:g})")
        else:
            return 200, {**body, "status": "ready"}
        return 503, {**body, "status": "not_ready", "reason": reason}

    def start(self) -> EstimateStore:
        """Start the background reader thread (daemon)."""
        if self.reader is None:
            raise AggregatorError("EstimateStore has no state-topic reader")
        self._thread = threading.Thread(target=self._loop, name="ldp-serve-state", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the background thread and close the reader (an estimate being computed late
        finishes on its daemon thread; nothing new starts)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.reader is not None:
            self.reader.close()

    # -------------------------------------------------------------------------------- access
    def estimates(self) -> dict[str, dict]:
        """Merged estimate per query (a snapshot)."""
        with self._lock:
            return dict(self._estimates)

    def windows(self, name: str) -> dict | None:
        """``{"query", "window", "windows", "horizon"}`` of windowed query ``name`` (None: not
        windowed, or nothing computed yet)."""
        with self._lock:
            return self._windows.get(name)

    def info(self) -> dict:
        """``partitions``, ``reports``, ``next_offsets`` of the merged checkpoints."""
        with self._lock:
            return dict(self._info)

    def __repr__(self) -> str:
        name = getattr(self.runtime, 'name', '?')
        return f"EstimateStore(pipeline={name!r}, queries={len(self._estimates)})"


def _json_safe(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _json_safe(obj.tolist())
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    return str(obj)


def build_app(store: EstimateStore, privacy: Mapping | None = None):
    """The read-only HTTP API over ``store`` (a starlette application).

    Routes (GET/HEAD only; anything else → 405 JSON):

    * ``/estimates`` → ``{"pipeline", "reports", "partitions", "estimates": {query: estimate}}``
    * ``/estimates/{query}`` → one estimate (404 JSON for an unknown query); for a windowed
      query the latest final window, with ``start``/``end``
    * ``/windows/{query}?from=&to=&limit=`` → ``{"query", "window": {"size_s", "hop_s",
      "grace_s", "retention_s"}, "horizon", "windows": [{"start", "end", "final", "n", "params",
      "value", "stderr", "ci_low", "ci_high", …}, …]}`` ordered by start: the windows with
      ``from ≤ start < to`` (ISO-8601 or Unix seconds), the latest ``limit`` of them (400 JSON
      ``{"error", "reason"}`` for a bad parameter; 404 for an unknown or unwindowed query)
    * ``/privacy`` → the schema's privacy summary
    * ``/healthz`` → liveness, :meth:`EstimateStore.health` (200 ``ok``/``degraded``, 503 ``failed``)
    * ``/readyz`` → readiness, :meth:`EstimateStore.readiness` (200 ``ready``, 503 ``not_ready``)
    * ``/metrics`` → Prometheus text exposition of the store's gauges

    Every error is a JSON body ``{"error": ...}`` — never a traceback.
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def js(payload, status: int = 200) -> JSONResponse:
        return JSONResponse(_json_safe(payload), status_code=status)

    async def estimates(request: Request):
        info = store.info()
        return js({"pipeline": store.runtime.name, "reports": info["reports"],
                   "partitions": info["partitions"], "estimates": store.estimates()})

    async def one(request: Request):
        name = request.path_params["query"]
        ests = store.estimates()
        if name not in ests:
            return js({"error": f"unknown query {name!r}", "queries": sorted(ests)}, 404)
        return js(ests[name])

    async def windows(request: Request):
        name = request.path_params["query"]
        if name not in store.estimates() and name not in getattr(store.runtime, "queries", {}):
            return js({"error": f"unknown query {name!r}", "queries": sorted(store.estimates())}, 404)
        if name not in getattr(store.runtime, "windowed", ()):
            return js({"error": f"query {name!r} has no window",
                       "reason": "only queries with a `window` table have windows; its cumulative "
                                 f"estimate is at /estimates/{name}"}, 404)
        try:
            lo, hi, limit = _window_params(request.query_params)
        except ValueError as exc:
            return js({"error": "invalid query parameter", "reason": str(exc)}, 400)
        payload = store.windows(name) or {"query": name, "window": None, "windows": []}
        rows = [r for r in payload["windows"]
                if (lo is None or r["start_s"] >= lo) and (hi is None or r["start_s"] < hi)]
        if limit is not None:
            rows = rows[-limit:] if limit else []
        return js({**payload, "windows": rows})

    async def privacy_route(request: Request):
        summary = privacy
        if summary is None:
            schema = getattr(store.runtime, "schema", None)
            summary = schema.privacy_summary() if schema is not None else {}
        if not isinstance(summary, Mapping):
            summary = {"summary": summary if isinstance(summary, str) else str(summary)}
        return js(summary)

    async def healthz(request: Request):
        code, body = store.health()
        return js(body, code)

    async def readyz(request: Request):
        code, body = store.readiness()
        return js(body, code)

    async def metrics(request: Request):
        return Response(store.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request: Request, exc: HTTPException):
        return js({"error": exc.detail}, exc.status_code)

    async def server_error(request: Request, exc: Exception):
        log.exception("request %s %s failed", request.method, request.url.path)
        return js({"error": "internal server error"}, 500)

    methods = ["GET", "HEAD"]
    routes = [
        Route("/estimates", estimates, methods=methods),
        Route("/estimates/{query}", one, methods=methods),
        Route("/windows/{query}", windows, methods=methods),
        Route("/privacy", privacy_route, methods=methods),
        Route("/healthz", healthz, methods=methods),
        Route("/readyz", readyz, methods=methods),
        Route("/metrics", metrics, methods=methods),
    ]
    return Starlette(routes=routes, debug=False,
                     exception_handlers={HTTPException: http_error, Exception: server_error})


def _window_params(params: Mapping) -> tuple[int | None, int | None, int | None]:
    """``(from, to, limit)`` of ``GET /windows/{query}``; raises ValueError naming the parameter."""
    import re

    from ingest.client.event_time import parse_iso_utc

    def when(key: str) -> int | None:
        v = params.get(key)
        if v is None or v == "":
            return None
        if re.fullmatch(r"-?[0-9]+", v):
            return int(v)
        try:
            return parse_iso_utc(v, key)
        except ValueError:
            raise ValueError(f"{key} must be an ISO-8601 time like \"2013-01-01T00:00:00Z\" or Unix "
                             f"seconds, got {v!r}") from None

    lo, hi = when("from"), when("to")
    limit = params.get("limit")
    if limit is not None:
        if not re.fullmatch(r"[0-9]{1,7}", limit) or int(limit) > 1_000_000:
            raise ValueError(f"limit must be an integer in [0, 1000000], got {limit!r}")
        limit = int(limit)
    return lo, hi, limit


def check_bindable(host: str, port: int) -> None:
    """Raise ``ConfigError`` (one line naming ``host:port``) unless a server could listen there.

    Raises
    ------
    ConfigError
        If ``port`` is outside [0, 65535] or the address is in use or not local.
    """
    import errno
    import os

    from ingest.local.processes import port_is_free

    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"port must be an integer in [0, 65535], got {port!r}")
    try:
        free = port_is_free(host, port)
    except OSError as exc:
        raise ConfigError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    if not free:
        raise ConfigError(f"cannot serve on {host}:{port}: {os.strerror(errno.EADDRINUSE)}")


def run_server(app, host: str = "127.0.0.1", port: int = 8080, log_level: str = "warning"):
    """Serve ``app`` with uvicorn until interrupted (blocking).

    Raises
    ------
    ConfigError
        If ``port`` is outside [0, 65535] or ``host:port`` cannot be bound (in use, not local).
    """
    import uvicorn

    check_bindable(host, port)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
