"""Publish privatized reports to Kafka, batched into records (docs/schema.md §3, docs/kafka.md §3).

:class:`ReportProducer` accepts :class:`~ingest.client.batch.ReportBatch` es of any size (or raw event
columns, privatized on the way through an :class:`~ingest.client.privatizer.Privatizer`), cuts and merges
them into records of exactly ``reports_per_record`` reports (the last record of a flush may be
shorter), encodes the full records of each send in one vectorized pass
(:func:`ingest.client.encode.encode_records`, with the schema's event-time resolution) and sends them
through a :class:`~ingest.kafka.transport.Transport`. A report counts as sent only when the broker
acknowledged its record (the producer reads the delivery futures in send order); failures are
counted and raised as
:class:`~ingest.errors.ProducerError` from :meth:`ReportProducer.flush` / :meth:`ReportProducer.close`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ingest.client.batch import ReportBatch, concat_batches, slice_batch
from ingest.client.encode import encode, encode_records
from ingest.errors import ConfigError, ProducerError, SchemaError
from ingest.kafka.clients import reachable
from ingest.kafka.settings import KafkaSettings
from ingest.kafka.topics import ensure_topic
from ingest.kafka.transport import KafkaPythonTransport, Transport

logger = logging.getLogger(__name__)

#: In-flight records beyond which each send also resolves the leading finished ones.
_REAP_EVERY = 256


@dataclass
class ProducerStats:
    """Counters of a :class:`ReportProducer` (plain data, safe to export as metrics).

    Attributes
    ----------
    reports_sent, records_sent : int
        Acknowledged by the broker.
    reports_failed, records_failed : int
        Definitely not delivered (error from the transport, or delivery timeout).
    reports_pending, records_pending : int
        Handed to the transport, not yet resolved.
    reports_buffered : int
        Accepted but not yet cut into a record.
    bytes_sent : int
        Encoded bytes of acknowledged records.
    """

    reports_sent: int = 0
    records_sent: int = 0
    reports_failed: int = 0
    records_failed: int = 0
    reports_pending: int = 0
    records_pending: int = 0
    reports_buffered: int = 0
    bytes_sent: int = 0


class ReportProducer:
    """Batch privatized reports into Kafka records and publish them with delivery accounting.

    Parameters
    ----------
    settings : KafkaSettings or str
        Client settings, or bootstrap servers ``"host:port[,host:port]"``.
    topic : str
        Reports topic.
    schema : TelemetrySchema
        Schema of every batch sent; batches with another fingerprint raise ``SchemaError``.
    reports_per_record : int
        Reports per Kafka record, in [1, 1_000_000]. Batching is the main throughput lever
        (docs/schema.md §3); 1 gives single-report records.
    linger_s : float
        Seconds (>= 0) a partial record may wait for more reports before it is sent anyway
        (a background thread checks); also kafka-python's ``linger_ms``. 0 sends partial records
        at the end of every :meth:`send`.
    partitions : int
        Partition count (>= 1) used when the topic has to be created.
    transport : Transport or None
        Client implementation; ``None`` builds a :class:`~ingest.kafka.transport.KafkaPythonTransport`.
    create_topic : bool
        Create the topic (``partitions`` partitions) if missing before the first send.
    max_retries : int
        Extra connection attempts (>= 0) when the broker is unreachable at start-up.
    retry_backoff_s : float
        First back-off in seconds (> 0); doubles per attempt, capped at 5 s.
    delivery_timeout_s : float
        Seconds (> 0) after which an unacknowledged record counts as failed (kafka-python's
        ``delivery_timeout_ms``); bounds how long :meth:`flush` / :meth:`close` can block.
    key : bytes or str or None
        Default record key (e.g. a device id); records of one key go to one partition.
    privatizer : Privatizer or None
        Used by :meth:`send_events`; default ``Privatizer(schema, rng)`` built on first use.
    rng : Generator, int or None
        Noise source for the default privatizer; ``None`` seeds from OS entropy.

    Attributes
    ----------
    stats : ProducerStats
        Counters; ``reports_sent`` only counts acknowledged reports.

    Raises
    ------
    ConfigError
        A parameter is out of range (the message names it).
    ProducerError
        The broker stayed unreachable (or the topic could not be created) after
        ``max_retries`` retries with exponential back-off; ``undelivered == 0``.

    Notes
    -----
    Source: docs/schema.md §3 (records are batches of reports), docs/kafka.md §3. Thread-safe:
    ``send`` may be called from several threads; delivery callbacks run on the transport's thread.
    :meth:`flush` raises ``ProducerError(undelivered=N)`` for the reports that failed since the
    previous flush (plus any still unresolved); :meth:`close` raises with the total over the
    producer's life. Neither ever counts an unacknowledged report as sent.
    """

    def __init__(
        self,
        settings: KafkaSettings | str,
        topic: str,
        schema: Any,
        *,
        reports_per_record: int = 1000,
        linger_s: float = 0.05,
        partitions: int = 4,
        transport: Transport | None = None,
        create_topic: bool = True,
        max_retries: int = 5,
        retry_backoff_s: float = 0.2,
        delivery_timeout_s: float = 30.0,
        key: bytes | str | None = None,
        privatizer: Any = None,
        rng: Any = None,
    ) -> None:
        def is_int(v: Any) -> bool:
            return isinstance(v, int | np.integer) and not isinstance(v, bool)

        if not isinstance(topic, str) or not topic:
            raise ConfigError(f"topic must be a non-empty string, got {topic!r}")
        if not isinstance(getattr(schema, "fingerprint", None), bytes):
            raise ConfigError(
                f"schema must be a TelemetrySchema (with .fingerprint), got {type(schema).__name__}"
            )
        if not is_int(reports_per_record) or not 1 <= reports_per_record <= 1_000_000:
            raise ConfigError(
                f"reports_per_record must be an int in [1, 1000000], got {reports_per_record!r}"
            )
        if not isinstance(linger_s, int | float) or not linger_s >= 0:
            raise ConfigError(f"linger_s must be >= 0 seconds, got {linger_s!r}")
        if not is_int(partitions) or partitions < 1:
            raise ConfigError(f"partitions must be an int >= 1, got {partitions!r}")
        if not is_int(max_retries) or max_retries < 0:
            raise ConfigError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if not isinstance(retry_backoff_s, int | float) or not retry_backoff_s > 0:
            raise ConfigError(f"retry_backoff_s must be > 0 seconds, got {retry_backoff_s!r}")
        if not isinstance(delivery_timeout_s, int | float) or not delivery_timeout_s > 0:
            raise ConfigError(f"delivery_timeout_s must be > 0 seconds, got {delivery_timeout_s!r}")
        if transport is not None and not isinstance(transport, Transport):
            raise ConfigError(
                f"transport must implement ingest.kafka.transport.Transport, got {type(transport).__name__}"
            )
        self.settings = KafkaSettings.coerce(settings)
        self.topic = topic
        self.schema = schema
        self.fingerprint: bytes = schema.fingerprint
        self._time_resolution: int | None = getattr(schema, "time_resolution_s", None)
        self.reports_per_record = int(reports_per_record)
        self.linger_s = float(linger_s)
        self.partitions = int(partitions)
        self.delivery_timeout_s = float(delivery_timeout_s)
        self.key = self._as_key(key)
        self._privatizer = privatizer
        self._rng = rng
        self._stats = ProducerStats()
        self._inflight: collections.deque = collections.deque()  # (future, reports, bytes) in send order
        self._lock = threading.RLock()  # buffer + transport.send
        self._count_lock = threading.Lock()  # counters and the in-flight queue
        self._buf: list[ReportBatch] = []
        self._buf_n = 0
        self._buf_key: bytes | None = None
        self._buf_since = 0.0
        self._failed_at_last_flush = 0
        self._last_error: BaseException | None = None
        self._closed = False
        self._wake = threading.Condition(self._lock)
        self._connect(transport, create_topic, int(max_retries), float(retry_backoff_s))
        self._linger_thread: threading.Thread | None = None
        if self.linger_s > 0:
            self._linger_thread = threading.Thread(
                target=self._linger_loop, name="ldp-producer-linger", daemon=True
            )
            self._linger_thread.start()

    # ------------------------------------------------------------------ set-up
    @staticmethod
    def _as_key(key: bytes | str | None) -> bytes | None:
        if key is None or isinstance(key, bytes):
            return key
        if isinstance(key, str):
            return key.encode("utf-8")
        raise ConfigError(f"key must be bytes, str or None, got {type(key).__name__}")

    def _connect(self, transport: Transport | None, create_topic: bool, max_retries: int,
                 backoff: float) -> None:
        start = time.monotonic()
        last: BaseException | None = None
        for attempt in range(max_retries + 1):
            if attempt:
                delay = min(backoff * 2 ** (attempt - 1), 5.0)
                logger.warning("Kafka at %s not ready (%s); retry %d/%d in %.2f s",
                               self.settings.bootstrap, str(last), attempt, max_retries, delay)
                time.sleep(delay)
            try:
                if transport is None and not reachable(self.settings):
                    where = self.settings.bootstrap
                    raise ConnectionRefusedError(f"no broker accepts connections at {where}")
                if create_topic:
                    ensure_topic(self.settings, self.topic, self.partitions, timeout=self.delivery_timeout_s)
                if transport is None:
                    transport = KafkaPythonTransport(
                        self.settings, linger_s=self.linger_s, delivery_timeout_s=self.delivery_timeout_s,
                        max_block_ms=int(self.delivery_timeout_s * 1000),
                    )
                self.transport: Transport = transport
                return
            except ConfigError:
                raise
            except Exception as exc:  # connection/bootstrap errors of any client library
                last = exc
        raise ProducerError(
            f"could not connect to Kafka at {self.settings.bootstrap} for topic {self.topic!r} after "
            f"{max_retries + 1} attempts in {time.monotonic() - start:.1f} s: {last}",
            undelivered=0,
        ) from last

    # ------------------------------------------------------------------ sending
    def send(self, batch: ReportBatch, key: bytes | str | None = None) -> None:
        """Queue a batch of reports; full records are handed to the transport immediately.

        Parameters
        ----------
        batch : ReportBatch
            Any number of reports of this producer's schema.
        key : bytes or str or None
            Record key for these reports (default: the producer's ``key``). Reports with different
            keys never share a record.

        Raises
        ------
        SchemaError
            ``batch`` is not a ReportBatch of this schema (fingerprint mismatch), or carries
            event times although the schema has no ``[event_time]`` (or none although it has).
        ProducerError
            The producer is closed.
        """
        if not isinstance(batch, ReportBatch):
            raise SchemaError(f"batch must be a ReportBatch, got {type(batch).__name__}")
        if batch.fingerprint != self.fingerprint:
            raise SchemaError(
                f"batch fingerprint {batch.fingerprint.hex()[:12]} does not match the producer's schema "
                f"{self.fingerprint.hex()[:12]}"
            )
        if (batch.event_time is None) != (self._time_resolution is None):
            raise SchemaError("batch has event times but the producer's schema has no [event_time]"
                              if batch.event_time is not None else
                              "batch has no event times but the producer's schema has [event_time]")
        k = self._as_key(key) if key is not None else self.key
        with self._lock:
            if self._closed:
                raise ProducerError("producer is closed", undelivered=batch.n)
            if batch.n == 0:
                return
            if self._buf_n and k != self._buf_key:
                self._emit_buffer()
            if not self._buf_n:
                self._buf_since = time.monotonic()
                self._buf_key = k
            pos, rpr = 0, self.reports_per_record
            # top up a partial buffer, then cut full records straight from the batch
            if self._buf_n:
                take = min(rpr - self._buf_n, batch.n)
                self._push(slice_batch(batch, 0, take) if take < batch.n else batch)
                pos = take
                if self._buf_n == rpr:
                    self._emit_buffer()
            full = (batch.n - pos) // rpr
            if full:  # every full record of the batch encoded in one vectorized pass
                stop = pos + full * rpr
                part = batch if pos == 0 and stop == batch.n else slice_batch(batch, pos, stop)
                for value in encode_records(part, rpr, time_resolution=self._time_resolution):
                    self._emit(value, rpr, k)
                pos += full * rpr
            if pos < batch.n:
                if not self._buf_n:
                    self._buf_since = time.monotonic()
                    self._buf_key = k
                self._push(slice_batch(batch, pos, batch.n) if pos else batch)
            if self.linger_s == 0:
                self._emit_buffer()
            elif self._buf_n:
                self._wake.notify()

    def send_events(self, columns: Mapping[str, Any], *, on_invalid: Literal["raise", "skip"] = "skip",
                    key: bytes | str | None = None) -> int:
        """Privatize raw event columns on the client and send the reports.

        Parameters
        ----------
        columns : mapping str → array-like of length n
            One column per schema field (see ``Privatizer.privatize_batch``).
        on_invalid : {"raise", "skip"}
            Passed to the privatizer; skipped rows are counted in ``privatizer.stats.skipped``.
        key : bytes or str or None
            Record key (default: the producer's).

        Returns
        -------
        int
            Number of reports queued.
        """
        if self._privatizer is None:
            from ingest.client.privatizer import Privatizer

            self._privatizer = Privatizer(self.schema, self._rng)
        batch = self._privatizer.privatize_batch(columns, on_invalid=on_invalid)
        self.send(batch, key=key)
        return batch.n

    @property
    def privatizer(self) -> Any:
        """The privatizer used by :meth:`send_events` (``None`` before its first use)."""
        return self._privatizer

    def _push(self, part: ReportBatch) -> None:
        self._buf.append(part)
        self._buf_n += part.n
        self._stats.reports_buffered = self._buf_n

    def _emit_buffer(self) -> None:
        if not self._buf_n:
            return
        record = concat_batches(self._buf)
        key = self._buf_key
        self._buf, self._buf_n, self._buf_key = [], 0, None
        self._stats.reports_buffered = 0
        self._emit(encode(record, time_resolution=self._time_resolution), record.n, key)

    def _emit(self, value: bytes, n: int, key: bytes | None) -> None:
        """Hand one encoded record of ``n`` reports to the transport; it counts as pending until
        :meth:`_reap` finds its future resolved."""
        with self._count_lock:
            self._stats.reports_pending += n
            self._stats.records_pending += 1
        try:
            fut = self.transport.send(self.topic, value, key=key, partition=None)
        except Exception as exc:  # synchronous failure (buffer full, metadata timeout, closed client)
            self._on_failure(n, exc)
            return
        with self._count_lock:
            self._inflight.append((fut, n, len(value)))
            if len(self._inflight) > _REAP_EVERY and self._inflight[0][0].is_done:
                self._reap_locked(full=False)

    def _reap(self, full: bool = True) -> None:
        """Count the resolved records as sent or failed (see :meth:`_reap_locked`)."""
        with self._count_lock:
            self._reap_locked(full)

    def _reap_locked(self, full: bool) -> None:
        """Resolve the in-flight records whose futures are done: the leading ones in send order,
        or (``full``) every one. Reading futures instead of registering a callback per record
        keeps the client's network thread free of our bookkeeping."""
        q, st = self._inflight, self._stats
        keep = []
        while q:
            fut, n, size = q.popleft()
            if not fut.is_done:
                if not full:
                    q.appendleft((fut, n, size))
                    break
                keep.append((fut, n, size))
                continue
            st.reports_pending -= n
            st.records_pending -= 1
            if fut.exception is None:
                st.reports_sent += n
                st.records_sent += 1
                st.bytes_sent += size
            else:
                self._count_failure(n, fut.exception)
        q.extend(keep)

    @property
    def stats(self) -> ProducerStats:
        """Counters, with every record resolved so far accounted for (see :class:`ProducerStats`)."""
        self._reap()
        return self._stats

    def _on_failure(self, n: int, exc: BaseException) -> None:
        with self._count_lock:
            self._stats.reports_pending -= n
            self._stats.records_pending -= 1
            self._count_failure(n, exc)

    def _count_failure(self, n: int, exc: BaseException) -> None:
        """Count a failed record of ``n`` reports (pending already decremented; lock held)."""
        self._stats.reports_failed += n
        self._stats.records_failed += 1
        self._last_error = exc
        # repr now: a log record must not keep the exception (and its traceback's frames) alive
        logger.warning("record of %d reports to %s not delivered: %s", n, self.topic, repr(exc))

    def _linger_loop(self) -> None:
        with self._lock:
            while not self._closed:
                if self._buf_n:
                    wait = self._buf_since + self.linger_s - time.monotonic()
                    if wait <= 0:
                        try:
                            self._emit_buffer()
                        except Exception:  # pragma: no cover - encode errors surface on the next send
                            logger.exception("linger flush failed")
                        continue
                    self._wake.wait(wait)
                else:
                    self._wake.wait()

    # ------------------------------------------------------------------ flush / close
    @property
    def reports_sent(self) -> int:
        """Reports acknowledged by the broker."""
        return self.stats.reports_sent

    @property
    def records_sent(self) -> int:
        """Records acknowledged by the broker."""
        return self.stats.records_sent

    @property
    def reports_failed(self) -> int:
        """Reports that definitely were not delivered."""
        return self.stats.reports_failed

    @property
    def last_error(self) -> BaseException | None:
        """The most recent delivery error, if any."""
        return self._last_error

    def flush(self, timeout: float | None = None) -> None:
        """Send any partial record and block until every record is acknowledged or failed.

        Parameters
        ----------
        timeout : float or None
            Seconds to wait; ``None`` = ``2·delivery_timeout_s + 5`` (the client should resolve every
            record within ``delivery_timeout_s``; the bound keeps a wedged client from hanging the
            caller — what is still unresolved then counts as undelivered).

        Raises
        ------
        ProducerError
            Some reports failed since the previous flush, or are still unresolved at the timeout;
            ``undelivered`` counts them (never includes acknowledged reports).
        """
        with self._lock:
            self._emit_buffer()
        if timeout is None:
            timeout = 2.0 * self.delivery_timeout_s + 5.0
        timed_out = None
        try:
            self.transport.flush(timeout)
        except Exception as exc:  # KafkaTimeoutError or similar
            timed_out = exc
        with self._count_lock:
            self._reap_locked(full=True)
            failed_new = self._stats.reports_failed - self._failed_at_last_flush
            self._failed_at_last_flush = self._stats.reports_failed
            pending = self._stats.reports_pending
            last = self._last_error
        if failed_new or pending:
            raise ProducerError(
                f"{failed_new + pending} reports not delivered to {self.topic!r} "
                f"({failed_new} failed, {pending} unresolved): {timed_out or last!r}",
                undelivered=failed_new + pending,
            )

    def close(self, timeout: float | None = None) -> None:
        """Flush, stop the linger thread and close the transport. Idempotent.

        Parameters
        ----------
        timeout : float or None
            Seconds to wait for outstanding records (``None``: as :meth:`flush`).

        Raises
        ------
        ProducerError
            If any report over the producer's life was not delivered; ``undelivered`` is the
            total (failed + unresolved).
        """
        with self._lock:
            if self._closed:
                return
        try:
            self.flush(timeout)
        except ProducerError:
            pass
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        if self._linger_thread is not None:
            self._linger_thread.join(timeout=5.0)
        try:
            self.transport.close(timeout=0 if self.stats.reports_pending else timeout)
        except Exception as exc:  # pragma: no cover - close errors are only logged
            logger.warning("closing the transport failed: %r", exc)
        with self._count_lock:
            self._reap_locked(full=True)
            undelivered = self._stats.reports_failed + self._stats.reports_pending
            failed, pending, last = self._stats.reports_failed, self._stats.reports_pending, self._last_error
        if undelivered:
            raise ProducerError(
                f"{undelivered} of {undelivered + self._stats.reports_sent} reports were not delivered to "
                f"{self.topic!r} ({failed} failed, {pending} unresolved); last error: {last!r}",
                undelivered=undelivered,
            )

    def __enter__(self) -> ReportProducer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except ProducerError as err:  # do not mask the body's exception
            logger.error("%s", err)

    def __repr__(self) -> str:
        try:
            s = self.stats
            return (
                f"ReportProducer(topic={self.topic!r}, reports_per_record={self.reports_per_record}, "
                f"sent={s.reports_sent}, failed={s.reports_failed}, pending={s.reports_pending}, "
                f"buffered={s.reports_buffered}, closed={self._closed})"
            )
        except Exception:  # pragma: no cover - repr never raises
            return "ReportProducer(?)"
