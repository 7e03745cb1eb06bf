"""The Kafka side of the collector: each accepted body becomes one record of the reports topic,
written once per idempotency key while the key is remembered (docs/collector.md §6).

:meth:`Forwarder.submit` is the exactly-once step. With the key's entry
(:class:`~aggregator.collector.idempotency.IdempotencyTable`):

* accepted → a duplicate (same body) or ``idempotency_key_reused`` (another body), nothing sent;
* in flight → wait (up to ``ack_timeout_s`` in all) for that record's outcome, never send again:
  acknowledged → duplicate; failed → go on with the new state (the waiter that wakes first acts;
  the others then find the key in flight again or settled);
* unconfirmed (the client failed the record after the broker may have written it) → read its
  partition back (:mod:`aggregator.collector.readback`): found → duplicate; absent → send anew;
* unknown → create the in-flight entry, send, and wait for the acknowledgement.

Every record carries its batch id header and goes to the partition chosen from it, so a read-back
knows where to look; the Kafka client must not retry on its own (``retries=0``, no idempotent
producer — :data:`PRODUCER_OPTIONS`), since its retries are what writes a second copy when an
acknowledgement is lost.

The Kafka client resolves a record's future on its own thread; the callbacks hand the outcome to
the event loop with ``loop.call_soon_threadsafe``, where the table is changed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from dataclasses import dataclass

from aggregator.collector.idempotency import ACCEPTED, IN_FLIGHT, UNCONFIRMED, IdempotencyTable
from aggregator.collector.readback import BATCH_ID_HEADER, batch_id, partition_of
from aggregator.errors import RequestRefused

__all__ = ["PRODUCER_OPTIONS", "Forwarder", "Submitted"]

log = logging.getLogger(__name__)

#: kafka-python producer options the forwarder needs: no retries of its own (a retry after a lost
#: acknowledgement writes a second copy; the device's retry and the read-back replace them) and
#: hence no idempotent producer (which requires retries). Applied over ``[kafka] extra``.
PRODUCER_OPTIONS = {"retries": 0, "enable_idempotence": False}


@dataclass(frozen=True)
class Submitted:
    """The answer to an accepted body: ``reports`` (the count of the first copy for a duplicate)
    and whether it was a ``duplicate``."""

    reports: int
    duplicate: bool


class Forwarder:
    """Send bodies to the reports topic once per ``(token id, key)``.

    Parameters
    ----------
    transport : ingest.kafka.transport.Transport
        ``send(topic, value)`` returns a future with ``add_callback`` / ``add_errback``
        (kafka-python's ``FutureRecordMetadata``); ``flush`` and ``close`` take a timeout.
    topic : str
        The reports topic.
    table : IdempotencyTable
    ack_timeout_s : float
        Seconds a request waits for the outcome of its record, or for a read-back (> 0).
    max_inflight_bytes : int
        Body bytes allowed in flight; a body that would exceed it is refused (503 ``overloaded``).
    readback : aggregator.collector.readback.ReadBack
        Reads a partition back to settle an unconfirmed record.
    on_readback : callable (outcome: str) → None, optional
        Called once per settled entry (``"found"``, ``"absent"``) and per failed read-back
        (``"failed"``); the metrics count them.

    Notes
    -----
    Source: docs/collector.md §6. All methods but :meth:`close` run on the event loop.
    """

    def __init__(self, transport, topic: str, table: IdempotencyTable, *, ack_timeout_s: float,
                 max_inflight_bytes: int, readback, on_readback=None) -> None:
        self.transport, self.topic, self.table = transport, topic, table
        self.ack_timeout_s = float(ack_timeout_s)
        self.max_inflight_bytes = int(max_inflight_bytes)
        self.readback, self.on_readback = readback, on_readback
        self.sent = 0  # records handed to the transport
        #: per partition, an offset at or below that of the next record written there: the end
        #: offset read at :meth:`start`, then one past each acknowledged record
        self.marks: dict[int, int] = {}
        self._scans: dict[int, asyncio.Future] = {}  # the read-back under way per partition

    def start(self) -> None:
        """Read the partitions' end offsets (the first read-back lower bounds); on failure they
        start at 0 (a read-back then scans the partition from its beginning) and a warning is
        logged."""
        try:
            self.marks.update(self.readback.end_offsets())
        except Exception as exc:
            log.warning("end offsets of %s not read (%s): a read-back would scan from offset 0",
                        self.topic, _one_line(exc))

    def _unavailable(self, why: str) -> RequestRefused:
        return RequestRefused("broker_unavailable", why, retry_after=max(1, math.ceil(self.ack_timeout_s)))

    async def submit(self, scope: str, key: str, body: bytes, reports: int) -> Submitted:
        """Forward ``body`` once for ``(scope, key)`` and wait for Kafka's acknowledgement.

        Parameters
        ----------
        scope : str
            The token id (keys of different tokens never collide).
        key : str
            The ``Idempotency-Key``.
        body : bytes
            The exact request body, sent as the record value.
        reports : int
            Its report count (≥ 1, from the decoder).

        Returns
        -------
        Submitted

        Raises
        ------
        aggregator.errors.RequestRefused
            422 ``idempotency_key_reused`` (the key is known with another body); 503
            ``overloaded`` (``max_inflight_bytes`` would be exceeded); 503 ``broker_unavailable``
            (no outcome within ``ack_timeout_s`` — the record stays in flight and a retry waits
            for it —, the send failed — a retry reads the topic back or sends anew — or the
            read-back did not reach the partition's end).
        """
        digest = hashlib.sha256(body).digest()
        deadline = time.monotonic() + self.ack_timeout_s
        while True:
            entry = self.table.lookup(scope, key)
            if entry is not None and entry.digest != digest:
                raise RequestRefused("idempotency_key_reused",
                                     f"the key {key!r} was used for another body (a retry must send "
                                     "the same bytes; a new batch needs a new key)")
            if entry is not None and entry.state == ACCEPTED:
                return Submitted(entry.reports, True)
            if entry is not None and entry.state == IN_FLIGHT:
                # the first copy is on its way: wait for it, never send a second one
                if not await self._wait(entry.done, deadline):
                    raise self._unavailable("Kafka has not acknowledged an earlier copy of this batch "
                                            f"within {self.ack_timeout_s:g} s; retry with the same key")
                continue  # acknowledged → duplicate; failed → unconfirmed or free
            if entry is not None and entry.state == UNCONFIRMED:
                await self._confirm(entry, deadline)
                continue  # found → duplicate; absent → the key is free
            return await self._send(scope, key, body, reports, digest, deadline)

    async def _confirm(self, entry, deadline: float) -> None:
        """Settle ``entry`` by a read-back of its partition: join the one under way, or start one
        that settles every unconfirmed entry of the partition. Returns once a read-back that
        included ``entry`` (or a later one) ended; the caller looks at the entry again."""
        part = entry.partition
        scan = self._scans.get(part)
        if scan is None or scan.done():
            scan = asyncio.ensure_future(self._scan(part, deadline))
            self._scans[part] = scan
        remaining = deadline - time.monotonic()
        try:
            ok = await asyncio.wait_for(asyncio.shield(scan), max(remaining, 0.001))
        except TimeoutError:
            raise self._unavailable("the topic is still being read back for this batch; retry with "
                                    "the same key") from None
        if not ok:
            raise self._unavailable("could not read the topic back to learn whether an earlier copy "
                                    "of this batch was written; retry with the same key")

    async def _scan(self, part: int, deadline: float) -> bool:
        """One read-back of partition ``part`` from the lowest mark of its unconfirmed entries;
        settles each of them. False (logged, counted) if the end was not reached by ``deadline``."""
        batch = {batch_id(e.scope, e.key): e for e in self.table.unconfirmed_in(part)}
        if not batch:
            return True
        start = min(e.start for e in batch.values())
        remaining = max(deadline - time.monotonic(), 0.001)
        try:
            found = await asyncio.to_thread(self.readback.find, part, start, set(batch), remaining)
        except Exception as exc:
            log.warning("read-back of %s[%d] from offset %d failed: %s", self.topic, part, start,
                        _one_line(exc))
            self._count("failed")
            return False
        for bid, e in batch.items():
            self.table.confirm(e, bid in found)
            self._count("found" if bid in found else "absent")
        return True

    def _count(self, outcome: str) -> None:
        if self.on_readback is not None:
            self.on_readback(outcome)

    async def _send(self, scope: str, key: str, body: bytes, reports: int, digest: bytes,
                    deadline: float) -> Submitted:
        if self.table.inflight_bytes + len(body) > self.max_inflight_bytes:
            raise RequestRefused("overloaded", f"{self.table.inflight_bytes} bytes await Kafka's "
                                 f"acknowledgement (limit {self.max_inflight_bytes}); retry later",
                                 retry_after=1)
        entry = self.table.begin(scope, key, digest, reports, len(body))  # no await before: atomic
        done = entry.done  # the table drops it once resolved, maybe while the send is awaited
        loop = asyncio.get_running_loop()
        bid = batch_id(scope, key)

        def send() -> None:  # in a thread: kafka-python's send may block on metadata or a full buffer
            try:
                part = partition_of(bid, self.transport.partitions_for(self.topic) or ())
                # marks only grow, and one read here was set by an acknowledgement that came
                # before this send: the record lands above it
                entry.partition, entry.start = part, self.marks.get(part, 0)
                future = self.transport.send(self.topic, body, partition=part,
                                             headers=[(BATCH_ID_HEADER, bid)])
            except BaseException:  # nothing queued: the key is free again
                _call_soon(loop, self.table.resolve, entry, False)
                raise
            self.sent += 1
            self._bridge(loop, future, entry)  # here, so that a cancelled request still settles it

        try:
            await asyncio.to_thread(send)
        except Exception as exc:
            self.table.resolve(entry, False)
            log.warning("send to %s failed for token %r: %s", self.topic, scope, _one_line(exc))
            raise self._unavailable(f"the batch could not be sent to Kafka ({type(exc).__name__}); "
                                    "retry with the same key") from None
        if not await self._wait(done, deadline):
            # the client may still deliver it: the entry stays in flight until it says
            raise self._unavailable(f"Kafka did not acknowledge the batch within {self.ack_timeout_s:g} "
                                    "s; retry with the same key")
        if entry.state != ACCEPTED:
            raise self._unavailable("Kafka failed the batch (it may have been written: a retry with "
                                    "the same key reads the topic back)")
        return Submitted(reports, False)

    def _bridge(self, loop: asyncio.AbstractEventLoop, future, entry) -> None:
        table, marks = self.table, self.marks

        def acknowledged(metadata) -> None:
            part, offset = getattr(metadata, "partition", None), getattr(metadata, "offset", None)
            if part is not None and offset is not None and offset >= marks.get(part, 0):
                marks[part] = offset + 1
            table.resolve(entry, True)

        def failed(exc: BaseException) -> None:
            # the broker may have written it (a lost acknowledgement): a retry reads it back
            log.warning("Kafka failed a record of token %r: %s", entry.scope, _one_line(exc))
            table.unconfirm(entry)

        def on_ack(metadata) -> None:
            _call_soon(loop, acknowledged, metadata)

        def on_error(exc: BaseException) -> None:
            _call_soon(loop, failed, exc)

        future.add_callback(on_ack)
        future.add_errback(on_error)

    @staticmethod
    async def _wait(done: asyncio.Future, deadline: float) -> bool:
        """Whether ``done`` resolved before ``deadline`` (monotonic); it is shielded, so a timeout
        leaves it for the others."""
        remaining = deadline - time.monotonic()
        if not done.done():
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(asyncio.shield(done), remaining)
            except TimeoutError:
                return False
        return True

    def close(self, timeout_s: float) -> None:
        """Flush the transport (bounded by ``timeout_s``) and close it and the read-back; logs,
        never raises."""
        try:
            self.transport.flush(timeout=timeout_s)
        except Exception as exc:
            log.warning("flush on shutdown: %s (%d record(s) in flight)", _one_line(exc),
                        self.table.inflight)
        try:
            self.transport.close(timeout=timeout_s)
        except Exception as exc:  # pragma: no cover - best effort
            log.warning("closing the Kafka producer: %s", _one_line(exc))
        try:
            self.readback.close()
        except Exception as exc:  # pragma: no cover - best effort
            log.warning("closing the read-back consumer: %s", _one_line(exc))


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed (shutdown): nobody waits any more
        pass


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
