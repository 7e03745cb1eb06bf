"""Idempotency keys of the collector: which batches are in flight to Kafka and which were
accepted, per token (docs/collector.md §6).

An entry is keyed by ``(token id, Idempotency-Key)`` and holds the SHA-256 of the body and its
report count. Its life:

* **in flight** — created just before the body is sent to Kafka; it stays in flight until the
  Kafka client resolves the record's future (within ``delivery_timeout_ms``), also after the
  request that sent it gave up waiting (503 ``broker_unavailable``): the record may still be
  delivered. In-flight entries are never evicted.
* **accepted** — the broker acknowledged the record. The entry is kept for ``window_s`` seconds
  after the acknowledgement, at most ``max_keys`` of them (the least recently used is dropped
  first); a request with the key then is a duplicate.
* **unconfirmed** — the Kafka client failed the record after it was handed to the broker (the
  broker died, the connection dropped, the request timed out): it may or may not be in the topic.
  The entry keeps the record's partition and an offset at or below the one it would have. A retry
  reads that partition back (:mod:`aggregator.collector.readback`) and the entry becomes accepted
  (found) or removed (absent). Unconfirmed entries are never evicted; they expire ``window_s``
  after the failure.
* **removed** — nothing reached the topic (the client refused the record, or the read-back did
  not find it): the key is free and a retry forwards the body anew.

Every method runs on the event loop's thread (the Kafka callbacks are brought there with
``loop.call_soon_threadsafe``), so no lock is needed: between two ``await`` s nobody else touches
the table, and the check "is the key known?" and the creation of the in-flight entry happen in
one step.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["ACCEPTED", "IN_FLIGHT", "UNCONFIRMED", "Entry", "IdempotencyTable"]

IN_FLIGHT = "in_flight"
ACCEPTED = "accepted"
UNCONFIRMED = "unconfirmed"
REMOVED = "removed"


class Entry:
    """One key's state.

    Attributes
    ----------
    scope : str
        The token id.
    key : str
        The ``Idempotency-Key``.
    digest : bytes
        SHA-256 of the body (32 bytes).
    reports : int
        Reports in the body.
    size : int
        Body bytes (counted in :attr:`IdempotencyTable.inflight_bytes` while in flight).
    state : str
        :data:`IN_FLIGHT`, :data:`UNCONFIRMED` or :data:`ACCEPTED` (a removed entry is no longer in
        the table).
    done : asyncio.Future or None
        Resolved with True (acknowledged) or False (failed) when the entry leaves
        :data:`IN_FLIGHT`, then dropped (None); requests waiting on the key await it (shielded).
    accepted_at : float or None
        Monotonic seconds of the acknowledgement.
    partition : int or None
        The reports-topic partition the record was sent to (set by the forwarder).
    start : int
        An offset at or below the record's in ``partition`` (where a read-back starts).
    failed_at : float or None
        Monotonic seconds when the record became unconfirmed.
    """

    __slots__ = ("accepted_at", "digest", "done", "failed_at", "key", "partition", "reports", "scope",
                 "size", "start", "state")

    def __init__(self, scope: str, key: str, digest: bytes, reports: int, size: int,
                 done: asyncio.Future) -> None:
        self.scope, self.key, self.digest = scope, key, digest
        self.reports, self.size = int(reports), int(size)
        self.state = IN_FLIGHT
        self.done = done
        self.accepted_at: float | None = None
        self.partition: int | None = None
        self.start = 0
        self.failed_at: float | None = None

    def __repr__(self) -> str:
        return f"Entry({self.scope!r}, {self.key!r}, {self.state}, reports={self.reports})"


class IdempotencyTable:
    """The keys in flight and accepted.

    Parameters
    ----------
    window_s : float
        Seconds an accepted key is remembered after its acknowledgement (> 0).
    max_keys : int
        Accepted keys kept at most (≥ 1); beyond, the least recently used is evicted and counted
        in :attr:`evictions`. In-flight keys are not counted and never evicted.
    clock : callable () → float
        Monotonic seconds (for tests).

    Notes
    -----
    Source: docs/collector.md §6.
    """

    def __init__(self, window_s: float, max_keys: int, clock: Callable[[], float] = time.monotonic) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        if not max_keys >= 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys!r}")
        self.window_s, self.max_keys, self._clock = float(window_s), int(max_keys), clock
        self._inflight: dict[tuple[str, str], Entry] = {}
        self._accepted: OrderedDict[tuple[str, str], Entry] = OrderedDict()
        self._unconfirmed: OrderedDict[tuple[str, str], Entry] = OrderedDict()
        self.inflight_bytes = 0
        self.evictions = 0
        self.expired = 0
        #: called once per evicted key (the metrics count them)
        self.on_evict: Callable[[], None] | None = None
        #: called once per entry that becomes accepted — acknowledged, also after its request gave
        #: up waiting, or found by a read-back: its record is in the topic (the metrics count it)
        self.on_accept: Callable[[Entry], None] | None = None

    # ------------------------------------------------------------------ reading
    def lookup(self, scope: str, key: str) -> Entry | None:
        """The entry of ``(scope, key)`` — in flight, unconfirmed, or accepted within the window
        (then marked recently used) — or None."""
        k = (scope, key)
        e = self._inflight.get(k)
        if e is not None:
            return e
        self._expire()
        e = self._unconfirmed.get(k)
        if e is not None:
            return e
        e = self._accepted.get(k)
        if e is None:
            return None
        if self._clock() - e.accepted_at >= self.window_s:  # out of the window, not swept yet
            del self._accepted[k]
            self.expired += 1
            return None
        self._accepted.move_to_end(k)
        return e

    def __len__(self) -> int:
        return len(self._inflight) + len(self._unconfirmed) + len(self._accepted)

    @property
    def inflight(self) -> int:
        """Entries in flight."""
        return len(self._inflight)

    @property
    def unconfirmed(self) -> int:
        """Unconfirmed entries held."""
        return len(self._unconfirmed)

    def unconfirmed_in(self, partition: int) -> list[Entry]:
        """The unconfirmed entries of records sent to ``partition``, oldest failure first."""
        self._expire()
        return [e for e in self._unconfirmed.values() if e.partition == partition]

    @property
    def accepted(self) -> int:
        """Accepted entries held (some may be past the window and not swept yet)."""
        return len(self._accepted)

    # ------------------------------------------------------------------ writing
    def begin(self, scope: str, key: str, digest: bytes, reports: int, size: int) -> Entry:
        """Record ``(scope, key)`` as in flight, just before its body is sent.

        Raises
        ------
        KeyError
            If the key is already in flight or accepted (call :meth:`lookup` first, with no
            ``await`` in between).
        """
        k = (scope, key)
        if self.lookup(scope, key) is not None:
            raise KeyError(f"idempotency key {key!r} of {scope!r} is already known")
        e = Entry(scope, key, digest, reports, size, asyncio.get_running_loop().create_future())
        self._inflight[k] = e
        self.inflight_bytes += e.size
        return e

    def resolve(self, entry: Entry, acknowledged: bool) -> None:
        """The Kafka client resolved ``entry``'s record: acknowledged → accepted (kept for the
        window); not → removed (nothing was written: a retry forwards anew). Waiters of
        ``entry.done`` wake up. A call for an entry no longer in flight does nothing."""
        if self._leave_flight(entry):
            self._settle(entry, acknowledged)

    def unconfirm(self, entry: Entry) -> None:
        """The Kafka client failed ``entry``'s record after handing it to the broker: it may be in
        the topic. The entry becomes :data:`UNCONFIRMED` until :meth:`confirm`; waiters wake up
        with False. A call for an entry no longer in flight does nothing."""
        if not self._leave_flight(entry):
            return
        entry.state, entry.failed_at = UNCONFIRMED, self._clock()
        self._unconfirmed[(entry.scope, entry.key)] = entry
        self._wake(entry, False)

    def confirm(self, entry: Entry, found: bool) -> None:
        """A read-back of ``entry``'s partition settled it: ``found`` → accepted (the window
        counts from now), absent → removed. A call for an entry not unconfirmed does nothing."""
        k = (entry.scope, entry.key)
        if entry.state != UNCONFIRMED or self._unconfirmed.get(k) is not entry:
            return
        del self._unconfirmed[k]
        self._settle(entry, found)

    def _leave_flight(self, entry: Entry) -> bool:
        k = (entry.scope, entry.key)
        if entry.state != IN_FLIGHT or self._inflight.get(k) is not entry:
            return False
        del self._inflight[k]
        self.inflight_bytes -= entry.size
        return True

    def _settle(self, entry: Entry, accepted: bool) -> None:
        k = (entry.scope, entry.key)
        if accepted:
            entry.state = ACCEPTED
            entry.accepted_at = self._clock()
            self._accepted[k] = entry
            self._accepted.move_to_end(k)
            if self.on_accept is not None:
                self.on_accept(entry)
            self._expire()
            while len(self._accepted) > self.max_keys:
                self._accepted.popitem(last=False)
                self.evictions += 1
                if self.on_evict is not None:
                    self.on_evict()
        else:
            entry.state = REMOVED
        self._wake(entry, accepted)

    @staticmethod
    def _wake(entry: Entry, ok: bool) -> None:
        done, entry.done = entry.done, None  # the waiters hold it; a settled entry needs none
        if done is not None and not done.done():
            done.set_result(bool(ok))

    def _expire(self) -> None:
        """Drop accepted entries past the window from the least recently used end, and
        unconfirmed ones ``window_s`` after their failure."""
        now = self._clock()
        self._drop_older(self._unconfirmed, "failed_at", now)
        self._drop_older(self._accepted, "accepted_at", now)

    def _drop_older(self, entries: OrderedDict, stamp: str, now: float) -> None:
        """Pop ``entries`` from the front while their ``stamp`` is ``window_s`` old or more (the
        front is the oldest: failures come in time order, accepted keys by last use)."""
        while entries:
            first = next(iter(entries.values()))
            if now - getattr(first, stamp) < self.window_s:
                break
            entries.popitem(last=False)
            self.expired += 1
