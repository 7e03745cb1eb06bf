"""Shared pieces of the collector tests: a fake Kafka transport, a schema, batches, a served
collector and raw-HTTP helpers."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path

import numpy as np

from aggregator.collector.app import Collector, build_app
from aggregator.collector.config import CollectorSection
from aggregator.collector.protocol import http_protocol
from aggregator.collector.tokens import TokenStore, mint_token
from ingest.client.codec import encode
from ingest.client.privatizer import Privatizer
from ingest.client.schema import TelemetrySchema
from ingest.device.http_protocol import CONTENT_TYPE, REPORTS_PATH
from tests.http_server import ServedApp

SCHEMA = TelemetrySchema.from_dict({"name": "col", "numeric": {
    "zero_prob": 0.2, "scale": 0.5, "fields": [{"name": "a", "low": 0.0, "high": 1.0}]}})
OTHER = TelemetrySchema.from_dict({"name": "other", "numeric": {
    "zero_prob": 0.2, "scale": 0.5, "fields": [{"name": "b", "low": 0.0, "high": 2.0}]}})
TOPIC = "ldp.col.reports"


def body(n: int, seed: int = 0, schema: TelemetrySchema = SCHEMA) -> bytes:
    """One wire record of ``n`` privatized reports."""
    rng = np.random.default_rng(seed)
    field = schema.numeric_names[0]
    return encode(Privatizer(schema, rng).privatize_batch({field: rng.random(n)}))


class Metadata:
    """kafka-python's ``RecordMetadata`` surface: ``partition`` and ``offset``."""

    def __init__(self, partition: int, offset: int) -> None:
        self.partition, self.offset = partition, offset


class FakeFuture:
    """kafka-python's future surface: callbacks run at once if already resolved, else when
    resolved (on the resolving thread)."""

    def __init__(self) -> None:
        self.metadata: Metadata | None = None
        self._lock = threading.Lock()
        self._ok: list = []
        self._err: list = []
        self.is_done = False
        self.exception: BaseException | None = None

    def add_callback(self, fn):
        with self._lock:
            if not self.is_done:
                self._ok.append(fn)
                return self
        if self.exception is None:
            fn(self.metadata)
        return self

    def add_errback(self, fn):
        with self._lock:
            if not self.is_done:
                self._err.append(fn)
                return self
        if self.exception is not None:
            fn(self.exception)
        return self

    def resolve(self, exc: BaseException | None = None) -> None:
        with self._lock:
            self.is_done, self.exception = True, exc
            fns = self._err if exc is not None else self._ok
        for fn in fns:
            fn(exc if exc is not None else self.metadata)


class FakeTransport:
    """An ``ingest.kafka.transport.Transport`` over an in-memory topic, and the collector's ``ReadBack``
    of it.

    ``mode``: ``"ack"`` writes and acknowledges at once; ``"hold"`` keeps the futures in
    :attr:`pending` until :meth:`ack_all` / :meth:`fail_all` / :meth:`lose_acks`; ``"fail"`` fails
    the future without writing; ``"lost-ack"`` writes the record and fails the future (a broker that
    died after storing it); ``"raise"`` raises from ``send``. :attr:`log` holds each partition's
    written ``(value, headers)``; :attr:`delivered` the written values in order; ``readback_error``
    makes :meth:`find` raise it."""

    def __init__(self, mode: str = "ack") -> None:
        self.mode = mode
        self.sent: list[bytes] = []
        self.delivered: list[bytes] = []
        self.pending: list[tuple[bytes, int, list, FakeFuture]] = []
        self.closed = False
        self.flushed = 0
        self.partitions: set[int] | None = {0}
        self.log: dict[int, list[tuple[bytes, list]]] = {}
        self.finds: list[tuple[int, int, int]] = []  # (partition, start, ids asked)
        self.readback_error: BaseException | None = None

    def _write(self, value: bytes, partition: int, headers: list, fut: FakeFuture) -> None:
        records = self.log.setdefault(partition, [])
        fut.metadata = Metadata(partition, len(records))
        records.append((value, list(headers)))
        self.delivered.append(value)

    def send(self, topic, value, key=None, partition=None, headers=None):
        assert topic == TOPIC
        if self.mode == "raise":
            raise RuntimeError("buffer full")
        assert partition in (self.partitions or ()), partition
        value, headers = bytes(value), list(headers or ())
        self.sent.append(value)
        fut = FakeFuture()
        if self.mode == "ack":
            self._write(value, partition, headers, fut)
            fut.resolve()
        elif self.mode == "fail":
            fut.resolve(RuntimeError("broker said no"))
        elif self.mode == "lost-ack":
            self._write(value, partition, headers, fut)
            fut.resolve(ConnectionError("connection lost before the acknowledgement"))
        else:
            self.pending.append((value, partition, headers, fut))
        return fut

    def ack_all(self) -> None:
        pending, self.pending = self.pending, []
        for value, partition, headers, fut in pending:
            self._write(value, partition, headers, fut)
            fut.resolve()

    def fail_all(self) -> None:
        """Fail the held records without writing them."""
        pending, self.pending = self.pending, []
        for *_, fut in pending:
            fut.resolve(RuntimeError("delivery timed out"))

    def lose_acks(self) -> None:
        """Write the held records and fail their futures."""
        pending, self.pending = self.pending, []
        for value, partition, headers, fut in pending:
            self._write(value, partition, headers, fut)
            fut.resolve(ConnectionError("connection lost before the acknowledgement"))

    def partitions_for(self, topic):
        return self.partitions

    # ReadBack
    def end_offsets(self):
        return {p: len(self.log.get(p, ())) for p in (self.partitions or ())}

    def find(self, partition, start, ids, timeout_s):
        self.finds.append((partition, start, len(ids)))
        if self.readback_error is not None:
            raise self.readback_error
        return {v for _, headers in self.log.get(partition, [])[start:] for k, v in headers
                if k == "ldp-batch-id" and v in ids}

    def flush(self, timeout=None):
        self.flushed += 1

    def close(self, timeout=None):
        self.closed = True


class Clock:
    """A settable monotonic clock (seconds), starting at 1000."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def token_file(tmp_path: Path, token_id: str = "dev-a", expires: int | None = None) -> tuple[Path, str]:
    """A fresh token file holding one token; ``(path, token)``."""
    path = tmp_path / "tokens"
    return path, mint_token(path, token_id, expires)


class Served:
    """A :class:`Collector` over a :class:`FakeTransport`, served on a free loopback port with the
    collector's HTTP protocol (:func:`aggregator.collector.protocol.http_protocol`).

    ``probe`` is the readiness round trip (default: none, the fake's metadata only); ``schema``
    the pipeline's schema (default :data:`SCHEMA`); ``max_event_time_skew_s`` and ``wall_clock``
    the event-time check (default: none, as without windowed queries); the other keywords make
    the ``[collector]`` section."""

    def __init__(self, tmp_path: Path, transport: FakeTransport | None = None, clock=time.monotonic,
                 *, probe=None, schema: TelemetrySchema = SCHEMA, max_event_time_skew_s=None,
                 wall_clock=time.time, **section) -> None:
        self.tokens_path, self.token = token_file(tmp_path)
        self.transport = transport if transport is not None else FakeTransport()
        self.section = CollectorSection(**section)
        self.collector = Collector(self.section, schema, self.transport, TOPIC,
                                   tokens=TokenStore(self.tokens_path, check_every_s=0.0),
                                   readback=self.transport, probe=probe, clock=clock,
                                   max_event_time_skew_s=max_event_time_skew_s,
                                   wall_clock=wall_clock, readiness_interval_s=0.05).start()
        self.server = ServedApp(build_app(self.collector),
                                http=http_protocol(self.collector.metrics.refuse))
        self.port = self.server.port

    def reset(self) -> None:
        """A fresh fake transport and idempotency table (the server and metrics stay)."""
        from aggregator.collector.idempotency import IdempotencyTable

        self.transport = FakeTransport()
        c = self.collector
        c.forwarder.transport = c.forwarder.readback = c.readiness.transport = self.transport
        c.forwarder.marks.clear()
        c.table = c.forwarder.table = IdempotencyTable(self.section.idempotency_window_s,
                                                       self.section.idempotency_max_keys)
        c.metrics.bind(c.table)

    def headers(self, key: str | None = "k-1", token: str | None = None, ctype: str = CONTENT_TYPE) -> dict:
        h = {"Content-Type": ctype}
        if key is not None:
            h["Idempotency-Key"] = key
        tok = self.token if token is None else token
        if tok:
            h["Authorization"] = f"Bearer {tok}"
        return h

    def post(self, data: bytes, key: str | None = "k-1", *, headers: dict | None = None,
             path: str = REPORTS_PATH, method: str = "POST", timeout: float = 10.0):
        """``(status, JSON body, response headers)``."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=data,
                         headers=headers if headers is not None else self.headers(key))
            r = conn.getresponse()
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None), {k.lower(): v for k, v in r.getheaders()}
        finally:
            conn.close()

    def get(self, path: str):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read().decode()
        finally:
            conn.close()

    def raw(self, head: str) -> socket.socket:
        """A socket that has sent the request line and headers ``head`` (CRLF-joined, ending in a
        blank line)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(head.encode("latin-1"))
        return s

    def raw_head(self, extra: str) -> str:
        h = self.headers()
        lines = [f"POST {REPORTS_PATH} HTTP/1.1", "Host: 127.0.0.1"]
        lines += [f"{k}: {v}" for k, v in h.items()]
        return "\r\n".join(lines) + "\r\n" + extra + "\r\n"

    def close(self) -> None:
        self.server.close()
        self.collector.close(1.0)


def read_response(s: socket.socket, timeout: float = 5.0, *,
                  wait_close: bool = True) -> tuple[int, dict, bytes, bool]:
    """``(status, headers, body, closed)`` of one response read from a raw socket; ``closed``:
    the server closed the connection after it (looked for only with ``wait_close``)."""
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    closed = False
    if not wait_close:
        return status, headers, rest[:length], closed
    try:
        s.settimeout(1.0)
        closed = s.recv(1) == b""
    except TimeoutError:
        closed = False
    except ConnectionResetError:
        closed = True
    return status, headers, rest[:length], closed


def metric(text: str, name: str, **labels) -> float:
    """The value of one sample of a Prometheus text exposition (0 if absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0
