"""The device-side sender: privatized reports POSTed to a collector through a persistent outbox
(docs/devices.md §6; the protocol is ``ingest.device.http_protocol``, docs/collector.md).

:meth:`CollectorSender.send` cuts a batch into records of ``reports_per_batch`` reports, encodes
each (``ingest.client.codec.encode``) and commits them to the :class:`~ingest.device.outbox.Outbox`; a
background thread POSTs the outbox's rows in order, each with its own idempotency key, and
deletes a row only after the collector's 202. Failures are retried with exponential back-off and
full jitter, never sooner than the answer's ``Retry-After``; a permanent refusal moves the batch
to the outbox's ``rejected`` table; a refused token (401) stops delivery with the queue kept.

Only the standard library is used for HTTP (``http.client`` with keep-alive) and TLS (``ssl``,
certificates verified against the system's CAs or a given CA file).
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import random
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ingest.client.batch import ReportBatch, concat_batches, slice_batch
from ingest.device.http_protocol import CONTENT_TYPE, IDEMPOTENCY_HEADER, REPORTS_PATH, RETRYABLE_STATUSES
from ingest.device.outbox import Outbox, QueuedBatch
from ingest.errors import ConfigError, OutboxError, SchemaError, SenderError, TokenFileError
from ingest.files import check_private_file

logger = logging.getLogger(__name__)

__all__ = ["STOP_STATUSES", "CollectorSender", "SenderStats", "backoff_delay", "parse_retry_after",
           "read_token_file"]

#: Statuses that no later batch can escape either (the token is refused, the URL is wrong):
#: delivery stops, the queue is kept, :meth:`CollectorSender.flush` raises.
STOP_STATUSES = frozenset({401, 403, 404, 405})
#: Seconds between looks at the outbox when idle (rows put by another process show up this late).
POLL_S = 0.2
_MAX_TOKEN_BYTES = 4096


def read_token_file(path: str | os.PathLike) -> str:
    """The collector token held in ``path``: one line of visible ASCII, surrounding whitespace aside.

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    str
        The token (never logged).

    Raises
    ------
    TokenFileError
        If the file does not exist or cannot be read, is not a regular file, is readable or
        writable by group or others (POSIX: ``mode & 0o077``; fix with ``chmod 600``), is empty,
        holds more than one line, or holds characters other than visible ASCII. The message names
        the path, never the content.
    """
    p = str(path)
    check_private_file(p, "token file", lambda msg: TokenFileError(msg, p))
    try:
        raw = Path(p).read_bytes()[:_MAX_TOKEN_BYTES + 1]
    except OSError as exc:
        raise TokenFileError(f"token file {p!r} cannot be read: {exc.strerror}", p) from None
    token = raw.strip()
    if not token:
        raise TokenFileError(f"token file {p!r} is empty", p)
    if len(token) > _MAX_TOKEN_BYTES or not all(0x21 <= b <= 0x7E for b in token):
        raise TokenFileError(f"token file {p!r} must hold one token of at most {_MAX_TOKEN_BYTES} visible "
                             "ASCII characters on one line", p)
    return token.decode("ascii")


def backoff_delay(attempts: int, initial_s: float, max_s: float, u: float) -> float:
    """Seconds to wait after the ``attempts``-th failure: full jitter, ``u · min(max_s,
    initial_s · 2**(attempts − 1))``.

    Parameters
    ----------
    attempts : int
        Failed attempts so far (>= 1).
    initial_s, max_s : float
        The first back-off bound and the cap (seconds).
    u : float
        A uniform draw in [0, 1).

    Returns
    -------
    float
        In ``[0, min(max_s, initial_s · 2**(attempts − 1)))``.
    """
    bound = max_s if attempts > 64 else min(max_s, initial_s * 2.0 ** (attempts - 1))
    return u * bound


def parse_retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (delay-seconds), or None if absent or not a number
    >= 0 (an HTTP date is not followed)."""
    if value is None:
        return None
    try:
        s = float(value.strip())
    except ValueError:
        return None
    return s if math.isfinite(s) and s >= 0 else None


@dataclass(frozen=True)
class SenderStats:
    """Counters of one sender (a snapshot).

    Attributes
    ----------
    batches_accepted, reports_accepted : int
        Batches (and their reports) the collector acknowledged (202) to this sender.
    duplicates : int
        Of those, answers with ``"duplicate": true`` (a retry of a batch the collector had).
    retries : int
        Failed attempts that will be retried (retryable status, connection error, timeout).
    rejected, reports_rejected : int
        Batches (reports) this sender moved to the outbox's ``rejected`` table.
    queued, queued_reports : int
        Batches (reports) in the outbox now, every process's.
    last_error : str or None
        The latest failure (``"503 overloaded: …"``); never holds the token.
    stopped : bool
        Delivery stopped on a status of :data:`STOP_STATUSES` (the token was refused …).
    """

    batches_accepted: int = 0
    reports_accepted: int = 0
    duplicates: int = 0
    retries: int = 0
    rejected: int = 0
    reports_rejected: int = 0
    queued: int = 0
    queued_reports: int = 0
    last_error: str | None = None
    stopped: bool = False


class _Http:
    """One keep-alive HTTP(S) connection to the collector, reopened after any error."""

    def __init__(self, parts: urllib.parse.SplitResult, timeout: float, ca_file: str | None) -> None:
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=ca_file) if self.https else None
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._aborted = threading.Event()

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any, bytes]:
        """``(status, headers, body)``; raises OSError / HTTPException (the connection is closed)."""
        for reused in (True, False):
            if self._aborted.is_set():
                raise ConnectionAbortedError("the sender is closing")
            with self._lock:
                if self._conn is None:
                    reused = False
                    if self.https:
                        self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                                                 context=self.context)
                    else:
                        self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                conn = self._conn
            try:
                conn.request("POST", path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                if reused and not self._aborted.is_set():  # a kept-alive connection the server closed
                    continue
                raise exc from None
            except BaseException:
                self.close()
                raise
            if resp.will_close:
                self.close()
            return resp.status, resp.headers, data
        raise AssertionError("unreachable")  # pragma: no cover

    def abort(self) -> None:
        """Break an in-flight request from another thread (its POST then fails, and so does every
        later one)."""
        self._aborted.set()
        conn = self._conn
        sock = getattr(conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class CollectorSender:
    """POST privatized reports to a collector, through a persistent outbox (docs/devices.md §6).

    Parameters
    ----------
    url : str
        The collector: ``http://`` or ``https://host[:port][/prefix]``; reports go to
        ``<prefix>/v1/reports`` (a URL that already ends with ``/v1/reports`` is used as is).
    token : str
        The device's bearer token (non-empty visible ASCII; see :func:`read_token_file`). Never
        logged, never in a message or ``repr``.
    schema : TelemetrySchema
        Schema of every batch sent (its fingerprint and time resolution).
    outbox : str, path-like, Outbox or None
        The outbox file (created if missing), an open :class:`~ingest.device.outbox.Outbox` (not closed
        by :meth:`close`), or None for an in-memory outbox (unsent batches are lost at exit).
    reports_per_batch : int
        Reports per POST, in [1, 1_000_000].
    linger_s : float
        Seconds (>= 0, <= 3600) a partial batch waits in memory for more reports before it is
        queued anyway; 0 queues the partial batch at the end of every :meth:`send`.
    timeout_s : float
        Socket timeout of a POST (connect, send, each read), in (0, 3600] seconds.
    backoff_initial_s, backoff_max_s : float
        The back-off bound after the first failure and its cap, seconds, with
        ``0 < backoff_initial_s <= backoff_max_s <= 86400``; the bound doubles per failure.
    max_attempts : int or None
        Attempts of one batch, in [1, 10**6], before it is moved to the rejected table
        (``error = "max_attempts"``); None retries forever.
    ca_file : str or path-like or None
        PEM file of the CAs that sign the collector's certificate (default: the system's).
    max_batches, max_bytes : int
        Bounds of an outbox this sender opens (:class:`~ingest.device.outbox.Outbox`).
    rng : random.Random or numpy.random.Generator or None
        Source of the jitter (anything with ``.random()``); None: a ``random.Random()`` seeded
        from the OS.

    Raises
    ------
    ConfigError
        If a parameter is out of range or of the wrong type (the message names it and the range).
    OutboxError
        If the outbox file cannot be opened.

    Notes
    -----
    Source: docs/devices.md §6. ``send`` is thread-safe; each call's batches are queued in one
    transaction, contiguous and in order. The sender delivers only while it holds the outbox's
    delivery lock, so several senders (processes) may share one outbox file. Statuses: 2xx →
    delivered, deleted; :data:`~ingest.device.http_protocol.RETRYABLE_STATUSES` and connection errors →
    retried with back-off, never sooner than ``Retry-After``; :data:`STOP_STATUSES` → delivery
    stops, the batch stays queued; any other → rejected (kept in the outbox's ``rejected`` table).
    """

    def __init__(self, url: str, token: str, schema: Any, *, outbox: str | os.PathLike | Outbox | None = None,
                 reports_per_batch: int = 1000, linger_s: float = 0.0, timeout_s: float = 30.0,
                 backoff_initial_s: float = 0.5, backoff_max_s: float = 60.0, max_attempts: int | None = None,
                 ca_file: str | os.PathLike | None = None, max_batches: int = 100_000,
                 max_bytes: int = 256 * 2**20, rng: Any = None) -> None:
        if not isinstance(url, str):
            raise ConfigError(f"url must be an http:// or https:// URL, got {type(url).__name__}")
        parts = urllib.parse.urlsplit(url.strip())
        try:
            if parts.port == 0:  # (raises on a port out of range)
                raise ValueError
        except ValueError:
            raise ConfigError(f"url must be an http:// or https:// URL with a port in [1, 65535], got "
                              f"{url!r}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment \
                or parts.username or parts.password:
            raise ConfigError(f"url must be an http:// or https:// URL (host, optional port and path; no "
                              f"user, query or fragment), got {url!r}")
        if not isinstance(token, str) or not token or not all("\x21" <= c <= "\x7e" for c in token):
            raise ConfigError("token must be a non-empty string of visible ASCII characters (no spaces, "
                              "no line breaks)")
        if not isinstance(getattr(schema, "fingerprint", None), bytes):
            raise ConfigError(f"schema must be a TelemetrySchema (with .fingerprint), got "
                              f"{type(schema).__name__}")
        _int("reports_per_batch", reports_per_batch, 1, 1_000_000)
        _seconds("linger_s", linger_s, 0.0, 3600.0, low_open=False)
        _seconds("timeout_s", timeout_s, 0.0, 3600.0)
        _seconds("backoff_initial_s", backoff_initial_s, 0.0, 86400.0)
        _seconds("backoff_max_s", backoff_max_s, 0.0, 86400.0)
        if backoff_max_s < backoff_initial_s:
            raise ConfigError(f"backoff_max_s must be >= backoff_initial_s ({backoff_initial_s}), got "
                              f"{backoff_max_s}")
        if max_attempts is not None:
            _int("max_attempts", max_attempts, 1, 10**6, none="None retries forever")
        if ca_file is not None:
            if not isinstance(ca_file, str | os.PathLike) or not str(ca_file).strip():
                raise ConfigError(f"ca_file must be a PEM file path or None, got {ca_file!r}")
            if parts.scheme != "https":
                raise ConfigError(f"ca_file is given but url {url!r} is not https://")
        if rng is not None and not callable(getattr(rng, "random", None)):
            raise ConfigError(f"rng must be a random.Random or numpy Generator (with .random()), got "
                              f"{type(rng).__name__}")
        path = parts.path.rstrip("/")
        self.url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
        self._path = path if path.endswith(REPORTS_PATH) else path + REPORTS_PATH
        self.fingerprint: bytes = schema.fingerprint
        self._time_resolution = getattr(schema, "time_resolution_s", None)
        self.reports_per_batch = int(reports_per_batch)
        self.linger_s = float(linger_s)
        self.timeout_s = float(timeout_s)
        self.backoff_initial_s = float(backoff_initial_s)
        self.backoff_max_s = float(backoff_max_s)
        self.max_attempts = max_attempts
        self._rng = random.Random() if rng is None else rng
        try:
            self._http = _Http(parts, self.timeout_s, None if ca_file is None else str(ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"ca_file {str(ca_file)!r} cannot be loaded: {exc}") from None
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": CONTENT_TYPE,
                         "Accept": "application/json", "User-Agent": "ldp-stream-sender"}
        self._own_outbox = not isinstance(outbox, Outbox)
        self.outbox = outbox if isinstance(outbox, Outbox) else Outbox(outbox, max_batches=max_batches,
                                                                      max_bytes=max_bytes)
        self._lock = threading.Lock()          # send / linger buffer / counters
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._buf: list[ReportBatch] = []
        self._buf_n = 0
        self._buf_since = 0.0
        self._stats = SenderStats()
        self._halted: str | None = None
        self._rejected_at_flush = (0, 0)
        self._closed = False
        self._final_counts: dict[str, int] | None = None  # the outbox's counts when closed
        self._thread = threading.Thread(target=self._run, name="ldp-collector-sender", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ sending
    def send(self, batch: ReportBatch) -> None:
        """Queue a batch's reports: cut into records of ``reports_per_batch``, encoded, committed
        to the outbox (a partial last record may linger, see ``linger_s``).

        Parameters
        ----------
        batch : ReportBatch
            Any number of reports of the sender's schema.

        Raises
        ------
        SchemaError
            If ``batch`` is not a ReportBatch of the schema (fingerprint, event times).
        OutboxFull
            If the outbox cannot take the batch's records; none of them was queued (the caller
            still holds the reports).
        SenderError
            If the sender is closed.
        """
        if not isinstance(batch, ReportBatch):
            raise SchemaError(f"batch must be a ReportBatch, got {type(batch).__name__}")
        if batch.fingerprint != self.fingerprint:
            raise SchemaError(f"batch fingerprint {batch.fingerprint.hex()[:12]} does not match the sender's "
                              f"schema {self.fingerprint.hex()[:12]}")
        if (batch.event_time is None) != (self._time_resolution is None):
            raise SchemaError("batch has event times but the sender's schema has no [event_time]"
                              if batch.event_time is not None else
                              "batch has no event times but the sender's schema has [event_time]")
        with self._lock:
            if self._closed:
                raise SenderError("sender is closed", rejected=0)
            if batch.n == 0:
                return
            parts = [*self._buf, batch]
            whole = parts[0] if len(parts) == 1 else concat_batches(parts)
            rpb = self.reports_per_batch
            cut = whole.n if self.linger_s == 0 else whole.n // rpb * rpb
            records = [slice_batch(whole, i, min(i + rpb, cut)) for i in range(0, cut, rpb)]
            self._put(records)  # raises OutboxFull with the buffer unchanged
            if not self._buf_n:
                self._buf_since = time.monotonic()
            self._buf = [] if cut == whole.n else [slice_batch(whole, cut, whole.n)]
            self._buf_n = whole.n - cut
        self._wake.set()

    def _put(self, records: list[ReportBatch]) -> None:
        from ingest.client.codec import encode

        if records:
            self.outbox.put_many([(encode(r, time_resolution=self._time_resolution), r.n) for r in records])

    def _put_lingering(self, force: bool) -> None:
        with self._lock:
            if self._buf_n and (force or time.monotonic() - self._buf_since >= self.linger_s):
                self._put(self._buf)
                self._buf, self._buf_n = [], 0

    # ------------------------------------------------------------------ delivery
    def _run(self) -> None:
        lock = self.outbox.delivery_lock()
        try:
            while not self._stop.is_set():
                self._wake.clear()
                try:
                    wait = self._step(lock)
                except Exception as exc:  # an outbox error: say it, keep trying
                    logger.error("collector sender: %s", exc)
                    self._note(last_error=str(exc))
                    wait = 1.0
                if wait:
                    self._wake.wait(wait)
        finally:
            lock.release()
            self._http.close()

    def _step(self, lock) -> float:
        """Deliver at most one batch; returns seconds to wait before the next step (0: none)."""
        if self._buf_n:
            self._put_lingering(force=False)
        if self._halted is not None:
            lock.release()
            return self.linger_s if self._buf_n else 3600.0
        head = self.outbox.head()
        if head is None:
            lock.release()
            return POLL_S if not self._buf_n else min(POLL_S, self.linger_s)
        if not lock.acquire():
            return POLL_S
        head = self.outbox.head()  # again, now that no one else delivers
        if head is None:
            return 0.0
        due = head.next_attempt_at - time.time()
        if due > 0:
            return min(due, POLL_S) if self._buf_n else min(due, 5 * POLL_S)
        self._deliver(head)
        return 0.0

    def _deliver(self, batch: QueuedBatch) -> None:
        headers = {**self._headers, IDEMPOTENCY_HEADER: batch.key}
        try:
            status, resp_headers, data = self._http.post(self._path, batch.body, headers)
        except (OSError, http.client.HTTPException) as exc:
            self._retry(batch, 0, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, None)
            return
        if 200 <= status < 300:
            duplicate = bool(_json(data).get("duplicate", False))
            self.outbox.delete(batch.id)
            self._note(batches_accepted=1, reports_accepted=batch.reports, duplicates=int(duplicate))
            return
        info = _json(data)
        code = str(info.get("error") or f"http_{status}")
        reason = str(info.get("reason") or data[:200].decode("utf-8", "replace").strip())
        what = f"{status} {code}: {reason}"
        if status in RETRYABLE_STATUSES:
            self._retry(batch, status, what, parse_retry_after(resp_headers.get("Retry-After")))
        elif status in STOP_STATUSES or 300 <= status < 400:
            self.outbox.record_failure(batch.id, what, time.time())
            self._halted = (f"the collector {self.url} answered {what}; every later batch would be refused "
                            "too, so delivery stopped with the queue kept (fix the token or URL and start "
                            "a sender on the same outbox)")
            logger.error("collector sender: %s", self._halted)
            self._note(last_error=what, stopped=True)
        else:
            self.outbox.reject(batch.id, status, code, reason)
            logger.error("collector sender: batch %s of %d reports refused for good by %s: %s; kept in the "
                         "outbox's rejected table", batch.key, batch.reports, self.url, what)
            self._note(rejected=1, reports_rejected=batch.reports, last_error=what)

    def _retry(self, batch: QueuedBatch, status: int, what: str, retry_after: float | None) -> None:
        attempts = batch.attempts + 1
        delay = backoff_delay(attempts, self.backoff_initial_s, self.backoff_max_s, float(self._rng.random()))
        if retry_after is not None:
            delay = max(delay, retry_after)
        self.outbox.record_failure(batch.id, what, time.time() + delay)
        if self.max_attempts is not None and attempts >= self.max_attempts:
            reason = f"gave up after {attempts} attempts; the last got {what}"
            self.outbox.reject(batch.id, status, "max_attempts", reason, attempted=False)
            logger.error("collector sender: batch %s of %d reports: %s; kept in the outbox's rejected table",
                         batch.key, batch.reports, reason)
            self._note(rejected=1, reports_rejected=batch.reports, last_error=what)
            return
        logger.info("collector sender: batch %s attempt %d got %s; next in %.2f s", batch.key, attempts, what,
                    delay)
        self._note(retries=1, last_error=what)

    def _note(self, **changes) -> None:
        with self._lock:
            s = self._stats
            new = {k: (getattr(s, k) + v if isinstance(v, int) and not isinstance(v, bool) else v)
                   for k, v in changes.items()}
            self._stats = replace(s, **new)

    # ------------------------------------------------------------------ state / flush / close
    @property
    def stats(self) -> SenderStats:
        """A snapshot of the counters, with the outbox's queue now (after :meth:`close`: then)."""
        counts = self._final_counts or self.outbox.counts()
        with self._lock:
            return replace(self._stats, queued=counts["queued"],
                           queued_reports=counts["queued_reports"] + self._buf_n)

    @property
    def last_error(self) -> str | None:
        """The latest failure (never holds the token)."""
        return self._stats.last_error

    def flush(self, timeout: float | None = None) -> None:
        """Queue any lingering reports and block until the outbox is empty.

        Parameters
        ----------
        timeout : float or None
            Seconds (>= 0) to wait; None waits as long as it takes.

        Raises
        ------
        SenderError
            If the timeout passed with batches still queued, delivery stopped (401 …), or
            batches were rejected since the previous flush; its attributes count what is still
            queued and what was rejected. The queued batches stay in the outbox.
        """
        if timeout is not None:
            _seconds("timeout", timeout, 0.0, math.inf, low_open=False)
        self._put_lingering(force=True)
        self._wake.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            counts = self.outbox.counts()
            halted = self._halted
            if not counts["queued"] or halted or self._stop.is_set():
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(0.02 if deadline is None else max(0.0, min(0.02, deadline - time.monotonic())))
        with self._lock:
            s = self._stats
            rej = s.rejected - self._rejected_at_flush[0]
            rej_reports = s.reports_rejected - self._rejected_at_flush[1]
            self._rejected_at_flush = (s.rejected, s.reports_rejected)
        if counts["queued"] or rej:
            why = (halted if halted else f"the last error: {s.last_error}" if s.last_error else "")
            raise SenderError(
                f"{counts['queued']} batches ({counts['queued_reports']} reports) still queued in outbox "
                f"{self.outbox.path!r}, {rej} batches ({rej_reports} reports) rejected since the last flush"
                + (f"; {why}" if why else ""),
                queued=counts["queued"], queued_reports=counts["queued_reports"], rejected=rej,
                rejected_reports=rej_reports)

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush (up to ``timeout`` seconds), stop the delivery thread (an in-flight POST is broken
        off; its batch stays queued) and close the outbox if the sender opened it. Idempotent.

        Raises
        ------
        SenderError
            If batches are still queued, or were rejected over the sender's life; the counts are
            its attributes.
        """
        with self._lock:
            if self._closed:
                return
        try:
            self.flush(timeout)
        except (SenderError, OutboxError):  # said below; an outbox too full for lingering reports
            pass
        with self._lock:
            self._closed = True
            lingering, self._buf, self._buf_n = self._buf_n, [], 0
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + self.timeout_s + 5.0
        while self._thread.is_alive() and time.monotonic() < deadline:
            self._http.abort()  # again and again: a POST may be connecting while the first one lands
            self._thread.join(0.05)
        self._final_counts = counts = self.outbox.counts()
        s = self.stats
        if self._own_outbox:
            self.outbox.close()
        if counts["queued"] or s.rejected or lingering:
            where = ("in memory: lost now" if self.outbox.memory else
                     f"kept in {self.outbox.path!r}, sent by the next sender on it")
            lost = f", {lingering} lingering reports the outbox could not take (lost)" if lingering else ""
            raise SenderError(
                f"{counts['queued_reports'] + s.reports_rejected + lingering} reports not delivered to "
                f"{self.url}: {counts['queued']} batches ({counts['queued_reports']} reports) still queued "
                f"({where}), {s.rejected} batches ({s.reports_rejected} reports) rejected{lost}; last error: "
                f"{s.last_error}",
                queued=counts["queued"], queued_reports=counts["queued_reports"] + lingering,
                rejected=s.rejected, rejected_reports=s.reports_rejected)

    def __enter__(self) -> CollectorSender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:  # never the token
        return (f"CollectorSender(url={self.url!r}, outbox={self.outbox.path!r}, "
                f"reports_per_batch={self.reports_per_batch})")


def _json(data: bytes) -> dict:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _int(name: str, value, low: int, high: int, none: str | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        extra = f" (or None: {none})" if none else ""
        raise ConfigError(f"{name} must be an integer in [{low}, {high}]{extra}, got {value!r}")


def _seconds(name: str, value, low: float, high: float, *, low_open: bool = True) -> None:
    ok = (not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
          and (value > low if low_open else value >= low) and value <= high)
    if not ok:
        bracket = "(" if low_open else "["
        raise ConfigError(f"{name} must be a finite number of seconds in {bracket}{low:g}, {high:g}], got "
                          f"{value!r}")
