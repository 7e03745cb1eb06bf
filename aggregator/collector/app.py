"""The collector's HTTP application: ``POST /v1/reports`` and the health and metrics endpoints
(docs/collector.md §2, §3, §10).

A report request is checked in this order, and nothing is forwarded on any error:

1. ``Authorization: Bearer <token>`` (401 ``missing_token`` / ``invalid_token``);
2. ``Content-Type`` is ``application/vnd.ldp-stream.batch`` (415);
3. ``Idempotency-Key`` is valid (400 ``bad_request``);
4. ``Content-Length`` is a number ≤ ``max_body_bytes`` (413, answered before any body byte is
   read); a chunked body is counted as it arrives and cut at the limit (413);
5. the token's rate bucket holds a report (429 with ``Retry-After``);
6. the whole body arrives within ``body_timeout_s`` (408, connection closed);
7. it decodes as the workers decode it (422 with the decoder's reason; 0 reports → 422
   ``empty_batch``); the token is charged ``max(1, n)`` reports;
8. with windowed queries, no event time is more than ``max_event_time_skew_s`` ahead of the
   collector's clock (422 ``event_time_skew``: the workers would dead-letter the record);
9. it is forwarded once per key (:class:`~aggregator.collector.forward.Forwarder`) and answered
   ``202`` once Kafka acknowledged it (422 ``idempotency_key_reused``, 503 ``overloaded`` or
   ``broker_unavailable``).

A request that h11 cannot parse is refused before any of this, by the HTTP layer
(:mod:`aggregator.collector.protocol`: 400 ``bad_request``, ``malformed HTTP request: …``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from aggregator.collector.config import CollectorSection
from aggregator.collector.forward import Forwarder
from aggregator.collector.idempotency import IdempotencyTable
from aggregator.collector.metrics import CollectorMetrics
from aggregator.collector.protocol import HTTP_REFUSED_SCOPE_KEY
from aggregator.collector.ratelimit import RateLimiter
from aggregator.collector.readback import TopicReadBack
from aggregator.collector.readiness import BrokerProbe, Readiness
from aggregator.collector.tokens import TokenStore
from aggregator.errors import RequestRefused
from ingest.device.http_protocol import CONTENT_TYPE, IDEMPOTENCY_HEADER, REPORTS_PATH, valid_idempotency_key

__all__ = ["Collector", "build_app"]

log = logging.getLogger(__name__)

#: bodies larger than this are decoded on a thread, not on the event loop
_DECODE_INLINE_BYTES = 256 * 1024


class Collector:
    """Everything a report request needs: tokens, limits, decoder, idempotency table, Kafka.

    Parameters
    ----------
    section : CollectorSection
        ``[collector]`` of the pipeline config (docs/collector.md §4).
    schema : ingest.client.schema.TelemetrySchema
        The pipeline's schema: the only one whose records are accepted.
    transport : ingest.kafka.transport.Transport
        Where bodies go (:class:`ingest.kafka.transport.KafkaPythonTransport` in production, built with
        :data:`aggregator.collector.forward.PRODUCER_OPTIONS`), with ``partitions_for(topic)``.
    topic : str
        The reports topic.
    tokens : TokenStore
    settings : ingest.kafka.settings.KafkaSettings or None
        For the readiness TCP check, the default readiness probe and the default read-back
        (None: no TCP check and no default probe; then ``readback`` is required).
    readback : aggregator.collector.readback.ReadBack or None
        Reads the topic back to settle unconfirmed batches; None builds a
        :class:`~aggregator.collector.readback.TopicReadBack` from ``settings``.
    probe : callable (partitions: set[int], timeout_s: float) → None, or None
        The readiness round trip to the broker, called with ``ack_timeout_s``; it raises when
        the broker does not answer. None builds a
        :class:`~aggregator.collector.readiness.BrokerProbe` from ``settings`` (without
        ``settings``: no round trip, the transport's metadata only).
    max_event_time_skew_s : float or None
        Refuse (422 ``event_time_skew``) a body holding an event time more than this many
        seconds ahead of ``wall_clock``: the pipeline's ``[worker] max_event_time_skew_s`` when
        it has windowed queries (the workers dead-letter such a record), else None (no check).
    metrics : CollectorMetrics or None
        A new private registry by default.
    clock : callable () → float
        Monotonic seconds for the rate limiter and the idempotency window (tests).
    wall_clock : callable () → float
        Unix seconds, for the event-time check (tests).
    readiness_interval_s : float
        Seconds between readiness probes.

    Raises
    ------
    ValueError
        Neither ``settings`` nor ``readback`` given, or ``max_event_time_skew_s`` < 0.

    Notes
    -----
    Source: docs/collector.md §2–§3.
    """

    def __init__(self, section: CollectorSection, schema, transport, topic: str, *, tokens: TokenStore,
                 settings=None, readback=None, probe=None, max_event_time_skew_s: float | None = None,
                 metrics: CollectorMetrics | None = None, clock=time.monotonic,
                 wall_clock=time.time, readiness_interval_s: float = 2.0) -> None:
        if max_event_time_skew_s is not None and not max_event_time_skew_s >= 0:
            raise ValueError(f"max_event_time_skew_s must be >= 0 or None, got {max_event_time_skew_s!r}")
        self.section, self.schema, self.topic, self.tokens = section, schema, topic, tokens
        self.max_event_time_skew_s = max_event_time_skew_s
        self.wall_clock = wall_clock
        self.known = {bytes(schema.fingerprint): schema}
        self.metrics = metrics if metrics is not None else CollectorMetrics()
        self.table = IdempotencyTable(section.idempotency_window_s, section.idempotency_max_keys, clock)
        self.metrics.bind(self.table)
        self.limiter = RateLimiter(section.rate_limit_reports_per_s, section.rate_limit_burst, clock)
        if readback is None:
            if settings is None:
                raise ValueError("Collector needs settings (to read the topic back) or a readback")
            readback = TopicReadBack(settings, topic)
        self.forwarder = Forwarder(transport, topic, self.table, ack_timeout_s=section.ack_timeout_s,
                                   max_inflight_bytes=section.max_inflight_bytes, readback=readback,
                                   on_readback=self.metrics.readback)
        if probe is None and settings is not None:
            probe = BrokerProbe(settings, topic)
        self.readiness = Readiness(transport, topic, settings, readiness_interval_s, probe=probe,
                                   timeout_s=section.ack_timeout_s)
        self.stopping = False
        tokens._on_reload = self.metrics.token_reload

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Collector:
        """Read the topic's end offsets (read-back lower bounds) and start the readiness probe."""
        self.forwarder.start()
        self.readiness.start()
        return self

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the probe, flush and close the Kafka client (bounded by ``timeout_s``)."""
        self.stopping = True
        self.readiness.stop(min(timeout_s, self.section.ack_timeout_s + 1.0))
        self.forwarder.close(timeout_s)

    # ------------------------------------------------------------------ the request
    async def post_reports(self, request) -> tuple[int, dict, dict]:
        """Answer one ``POST /v1/reports``: ``(status, JSON payload, extra headers)``.

        Raises
        ------
        aggregator.errors.RequestRefused
            Every refusal (the caller turns it into the JSON answer).
        """
        from ingest.client import codec
        from ingest.errors import DecodeError

        s = self.section
        token = self.tokens.authenticate(request.headers.get("authorization"))
        ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype != CONTENT_TYPE:
            raise RequestRefused("unsupported_media_type",
                                 f"Content-Type must be {CONTENT_TYPE}, got {ctype or 'none'!r}")
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if not valid_idempotency_key(key):
            raise RequestRefused("bad_request", f"{IDEMPOTENCY_HEADER} must be 1-128 characters of "
                                 "A-Z a-z 0-9 . _ : - " + ("(missing)" if key is None else "(invalid)"))
        length = request.headers.get("content-length")
        chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
        if length is not None:
            if not (length.isascii() and length.isdigit()):
                raise RequestRefused("bad_request", "Content-Length must be a number of bytes")
            if int(length) > s.max_body_bytes:
                raise RequestRefused("body_too_large", f"the body has {int(length)} bytes; at most "
                                     f"{s.max_body_bytes} are accepted (send smaller batches)")
        elif not chunked:
            raise RequestRefused("bad_request", "send Content-Length (or a chunked body)")
        wait = self.limiter.retry_after(token.id)
        if wait:
            raise RequestRefused("rate_limited", f"the token {token.id!r} sends more than "
                                 f"{s.rate_limit_reports_per_s:g} reports/s", retry_after=wait)
        try:
            body = await asyncio.wait_for(self._read_body(request), s.body_timeout_s)
        except TimeoutError:
            raise RequestRefused("body_timeout",
                                 f"the body did not arrive within {s.body_timeout_s:g} s") from None
        try:
            if len(body) > _DECODE_INLINE_BYTES:
                batch = await asyncio.to_thread(codec.decode, body, self.known,
                                                max_reports=s.max_reports_per_batch,
                                                max_bytes=s.max_body_bytes)
            else:
                batch = codec.decode(body, self.known, max_reports=s.max_reports_per_batch,
                                     max_bytes=s.max_body_bytes)
        except DecodeError as exc:
            self.limiter.charge(token.id, 1)
            raise RequestRefused(exc.reason, " ".join(str(exc).split()), status=422) from None
        n = int(batch.n)
        self.limiter.charge(token.id, n)
        if n == 0:
            raise RequestRefused("empty_batch", "the batch holds no report")
        self._check_event_times(batch)
        done = await self.forwarder.submit(token.id, key, body, n)
        # reports_accepted counts the table's accepted entries (CollectorMetrics.bind)
        if done.duplicate:
            self.metrics.batches.labels(outcome="duplicate").inc()
            log.debug("duplicate batch %r of token %r", key, token.id)
        else:
            self.metrics.batches.labels(outcome="accepted").inc()
        return 202, {"accepted": done.reports, "idempotency_key": key, "duplicate": done.duplicate}, {}

    def _check_event_times(self, batch) -> None:
        """Refuse ``batch`` when a worker would dead-letter it for event-time skew: its latest
        event time more than ``max_event_time_skew_s`` ahead of the record's timestamp, here
        the collector's clock in whole seconds (the record's Kafka timestamp is taken later)."""
        skew = self.max_event_time_skew_s
        if skew is None or batch.event_time is None or not len(batch.event_time):
            return
        from ingest.client.event_time import iso_utc

        latest, now = int(batch.event_time.max()), int(self.wall_clock())
        if latest > now + skew:
            raise RequestRefused("event_time_skew", f"the batch holds the event time {iso_utc(latest)}, "
                                 f"more than max_event_time_skew_s = {skew:g} s ahead of the "
                                 f"collector's clock ({iso_utc(now)}); the workers would "
                                 "dead-letter it (check the device's clock)")

    async def _read_body(self, request) -> bytes:
        from starlette.requests import ClientDisconnect

        limit = self.section.max_body_bytes
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RequestRefused("body_too_large", f"the body exceeds {limit} bytes (send "
                                         "smaller batches)")
                chunks.append(chunk)
        except ClientDisconnect:
            raise RequestRefused("client_disconnected", "the client closed the connection before "
                                 "the body was complete", status=400) from None
        return b"".join(chunks)

    # ------------------------------------------------------------------ health
    def readiness_state(self) -> tuple[int, dict]:
        """``(200, {"status": "ready"})`` or ``(503, {"error": "not_ready", "reason": …})``."""
        self.tokens.maybe_reload()
        if self.stopping:
            return 503, {"error": "not_ready", "reason": "shutting down"}
        if not self.readiness.ready:
            return 503, {"error": "not_ready", "reason": self.readiness.reason}
        body = {"status": "ready", "tokens": len(self.tokens.tokens), "topic": self.topic}
        if self.tokens.last_error:
            body["token_file_error"] = self.tokens.last_error
        return 200, body


#: codes after which the rest of the request body is not read: the connection is closed
_CLOSE = frozenset({"body_too_large", "body_timeout", "client_disconnected"})


def build_app(collector: Collector):
    """The starlette application of ``collector``.

    Routes: ``POST /v1/reports``; ``GET /healthz`` (200 while the process runs), ``GET
    /readyz`` (200 when the token file is loaded and the broker answers the readiness probe,
    else 503 JSON), ``GET /metrics`` (Prometheus text). Unknown paths answer 404 and other
    methods 405, as JSON ``{"error", "reason"}`` like every error. Serve it with
    ``uvicorn.Config(http=aggregator.collector.protocol.http_protocol(collector.metrics.refuse))``
    so that malformed requests are answered the same way.

    Notes
    -----
    Source: docs/collector.md §2, §10.
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from aggregator.metrics import CONTENT_TYPE_LATEST

    metrics = collector.metrics

    def refusal(exc: RequestRefused) -> JSONResponse:
        headers = {}
        if exc.status == 401:
            headers["WWW-Authenticate"] = f'Bearer realm="ldp-stream", error="{exc.code}"' \
                if exc.code == "invalid_token" else 'Bearer realm="ldp-stream"'
        if exc.retry_after is not None:
            headers["Retry-After"] = str(int(exc.retry_after))
        if exc.code in _CLOSE:
            headers["Connection"] = "close"
        return JSONResponse({"error": exc.code, "reason": exc.reason}, status_code=exc.status,
                            headers=headers)

    async def reports(request: Request):
        t0 = time.perf_counter()
        try:
            status, payload, headers = await collector.post_reports(request)
            return JSONResponse(payload, status_code=status, headers=headers)
        except RequestRefused as exc:
            if not (exc.code == "client_disconnected" and request.scope.get(HTTP_REFUSED_SCOPE_KEY)):
                metrics.refuse(exc.code)  # else the HTTP layer refused the body and counted it
            if exc.status >= 500 or exc.status in (401, 429):
                log.info("refused a batch (%s %s): %s", exc.status, exc.code, exc.reason)
            return refusal(exc)
        finally:
            metrics.request_seconds.observe(time.perf_counter() - t0)

    async def healthz(request: Request):
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request):
        code, body = collector.readiness_state()
        return JSONResponse(body, status_code=code)

    async def metrics_route(request: Request):
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request: Request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
        reason = {404: f"no such path {request.url.path!r} (reports go to POST {REPORTS_PATH})",
                  405: f"{request.method} is not allowed on {request.url.path!r}"}.get(
                      exc.status_code, str(exc.detail))
        return JSONResponse({"error": code, "reason": reason}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    async def server_error(request: Request, exc: Exception):
        log.exception("request %s %s failed", request.method, request.url.path)
        return JSONResponse({"error": "internal_error", "reason": "internal server error"}, 500)

    get = ["GET", "HEAD"]
    routes = [
        Route(REPORTS_PATH, reports, methods=["POST"]),
        Route("/healthz", healthz, methods=get),
        Route("/readyz", readyz, methods=get),
        Route("/metrics", metrics_route, methods=get),
    ]
    return Starlette(routes=routes, debug=False,
                     exception_handlers={HTTPException: http_error, Exception: server_error})
