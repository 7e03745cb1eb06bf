"""A tiny fake collector for the sender's tests: a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 that
answers ``POST /v1/reports`` from a script and records every request.

A request to another path than ``/v1/reports`` gets 404. Script actions (one per request, in
order; then ``default``):

* ``"accept"`` — 202 ``{"accepted": n, "idempotency_key": key, "duplicate": bool}`` (a key seen
  accepted before is a duplicate; ``n`` decoded from the body when ``schemas`` are given);
* an int status — ``{"error": code, "reason": "scripted <status>"}``; 429 and 503 carry
  ``Retry-After: retry_after``;
* ``(status, retry_after)`` — the same with that ``Retry-After``;
* ``"drop"`` — the connection closed without an answer;
* ``("slow", seconds)`` — wait, then accept;
* ``"stall"`` — wait until :meth:`FakeCollector.close` (or :attr:`release` is set), then drop.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ingest.device.http_protocol import ERROR_CODES, IDEMPOTENCY_HEADER, REPORTS_PATH
from ingest.local.processes import free_port

#: the ``error`` code the fake answers with each scripted status (one of the protocol's codes)
_CODES = {401: "invalid_token", 422: "empty_batch", 503: "overloaded",
          **{status: code for code, status in ERROR_CODES.items() if status not in (401, 422, 503)}}


@dataclass
class Request:
    key: str | None
    body: bytes
    headers: dict
    path: str
    arrived: float          # time.monotonic()
    status: int | None = None  # what it was answered (None: dropped)
    duplicate: bool = False
    done: float | None = None


@dataclass
class FakeCollector:
    script: list = field(default_factory=list)
    default: object = "accept"
    retry_after: int = 1
    schemas: dict | None = None
    tls: tuple | None = None  # (certificate PEM path, key PEM path): serve https

    def __post_init__(self) -> None:
        self.requests: list[Request] = []
        self.accepted: dict[str, bytes] = {}   # key -> body of its first 202
        self.overlaps: list[str] = []          # keys POSTed while a POST of the same key was open
        self.lock = threading.Lock()
        self.release = threading.Event()
        self._queue = deque(self.script)
        self._in_flight: dict[str, int] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # the headers and the body leave at once

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                fake._handle(self)

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        if self.tls:
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            # the handshake happens in the handler thread (on the first read), not in accept()
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def keys(self) -> list[str]:
        """The keys of the requests, in arrival order (repeats included)."""
        with self.lock:
            return [r.key for r in self.requests]

    def accepted_keys(self) -> list[str]:
        """Keys answered 202, in order (a key once per 202)."""
        with self.lock:
            return [r.key for r in self.requests if r.status == 202]

    def _next(self):
        with self.lock:
            return self._queue.popleft() if self._queue else self.default

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        n = int(h.headers.get("Content-Length", 0))
        body = h.rfile.read(n)
        key = h.headers.get(IDEMPOTENCY_HEADER)
        req = Request(key, body, dict(h.headers.items()), h.path, time.monotonic())
        with self.lock:
            self.requests.append(req)
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
            if self._in_flight[key] > 1:
                self.overlaps.append(key)
        try:
            self._answer(h, req, self._next() if h.path == REPORTS_PATH else 404)
        finally:
            req.done = time.monotonic()
            with self.lock:
                self._in_flight[key] -= 1

    def _answer(self, h, req: Request, action) -> None:
        if action == "drop":
            h.close_connection = True
            return
        if action == "stall":
            while not self.release.wait(0.05):
                pass
            h.close_connection = True
            return
        if isinstance(action, tuple) and action[0] == "slow":
            time.sleep(action[1])
            action = "accept"
        if action == "accept":
            with self.lock:
                dup = req.key in self.accepted
                if not dup:
                    self.accepted[req.key] = req.body
            n = 0
            if self.schemas:
                from ingest.client.codec import decode

                n = decode(req.body, self.schemas).n
            req.status, req.duplicate = 202, dup
            self._send(h, 202, {"accepted": n, "idempotency_key": req.key, "duplicate": dup})
            return
        status, retry_after = action if isinstance(action, tuple) else (action, self.retry_after)
        req.status = status
        extra = {"Retry-After": str(retry_after)} if status in (429, 503) else {}
        self._send(h, status, {"error": _CODES.get(status, f"http_{status}"), "reason": f"scripted {status}"},
                   extra)

    @staticmethod
    def _send(h, status: int, obj: dict, extra: dict | None = None) -> None:
        data = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeCollector:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


