"""The worker's checkpoint protocol as one state machine: publish → acknowledge → commit.

A checkpoint of a partition is its states with a :class:`~aggregator.worker.partition.Mark`
(``next_offset`` and counts), sent to the state topic; **only once the broker has acknowledged
it** are the group offsets committed (docs/reliability.md §1.3). :class:`Checkpointer` holds the
producer that publishes and the consumer that commits, and the one checkpoint of the main loop
that may be on its way at a time:

* synchronously (:meth:`Checkpointer.publish_due`, :meth:`Checkpointer.publish`): drain the
  updates, send, flush, then :meth:`Checkpointer.commit`;
* in the main loop with overlap: :meth:`Checkpointer.begin` (fold thread) marks the changed
  partitions and queues :meth:`Checkpointer.snapshot` (update thread) behind the updates before
  the mark; :meth:`Checkpointer.check` (main thread) commits once every record is acknowledged.

A broker error is raised (``kafka.errors.KafkaError``): the caller backs off and calls
:meth:`Checkpointer.retry_later`; nothing is committed and the partitions stay dirty.
"""

from __future__ import annotations

import logging
import time
import zlib
from concurrent.futures import Future
from dataclasses import dataclass

from aggregator.errors import AggregatorError
from aggregator.metrics import WorkerMetrics
from aggregator.plan import PipelineRuntime
from aggregator.worker.partition import Mark, PartitionState
from aggregator.worker.threads import OverlapThreads

__all__ = ["Checkpointer", "InFlight", "Published", "SendOutcome"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published:
    """Checkpoints published and flushed: the offsets to commit, how many partitions, and when
    publishing started and ended (``time.perf_counter``)."""

    offsets: dict
    partitions: int
    started: float
    published: float


@dataclass(frozen=True)
class SendOutcome:
    """What :meth:`Checkpointer.snapshot` did on the update thread: the records sent
    (``[(partition state, next_offset, send future)]``) or the error of ``send``, raised by
    :meth:`result` — an error must not fail the update thread's task, which the fold thread would
    take for a failed update."""

    sent: list | None = None
    error: Exception | None = None

    def result(self) -> list:
        """The records sent; raises the error of ``send``."""
        if self.error is not None:
            raise self.error
        return self.sent


@dataclass(frozen=True)
class InFlight:
    """A checkpoint :meth:`Checkpointer.begin` queued: the update thread's snapshot (a future of
    a :class:`SendOutcome`) and when it began (``time.perf_counter``)."""

    snapshot: Future
    started: float

    def acknowledged(self) -> bool:
        """Whether the snapshot ran and the broker answered for each of its records (or the
        snapshot failed): :meth:`Checkpointer.check` can finish it without waiting."""
        if not self.snapshot.done():
            return False
        if self.snapshot.exception() is not None:
            return True
        out = self.snapshot.result()
        return out.error is not None or all(f.is_done for _, _, f in out.sent)


class Checkpointer:
    """Publish, acknowledge and commit the checkpoints of one worker's partitions.

    Parameters
    ----------
    runtime : PipelineRuntime
    producer : kafka.KafkaProducer
        Sends the checkpoints (a client apart from the consumer: safe in rebalance callbacks).
    consumer : kafka.KafkaConsumer
        Commits the offsets (main thread only: the consumer is not thread-safe).
    owned : dict int → PartitionState
        The worker's owned partitions (the same dict, shared).
    threads : OverlapThreads
    lock : threading.RLock
        The worker's lock (guards ``owned`` and the update queue).
    metrics : WorkerMetrics
    reports_topic, state_topic : str

    Attributes
    ----------
    in_flight : InFlight or None
        The main loop's checkpoint awaiting acknowledgement.
    pending : bool
        A checkpoint of the main loop is being published (until its offsets are committed).
    since_reports : int
        Reports folded in since the last checkpoint.
    last_at : float
        ``time.monotonic()`` of the last checkpoint (or retry).
    """

    def __init__(self, runtime: PipelineRuntime, producer, consumer, *, owned: dict,
                 threads: OverlapThreads, lock, metrics: WorkerMetrics, reports_topic: str,
                 state_topic: str) -> None:
        self.runtime = runtime
        self.producer = producer
        self.consumer = consumer
        self.owned = owned
        self.threads = threads
        self.lock = lock
        self.metrics = metrics
        self.reports_topic = reports_topic
        self.state_topic = state_topic
        self.in_flight: InFlight | None = None
        self.pending = False
        self.since_reports = 0
        self.last_at = time.monotonic()
        self._state_partitions: int | None = None

    def _pane_partition(self, key: bytes) -> int | None:
        """The state-topic partition of a pane record: CRC-32 of its key modulo the partition
        count (the same key always lands in the same partition, as compaction needs; computing
        it here costs a fraction of kafka-python's pure-Python murmur2 partitioner). ``None``
        (the producer's partitioner) while the topic's partitions are not known."""
        n = self._state_partitions
        if n is None:
            lookup = getattr(self.producer, "partitions_for", None)
            parts = lookup(self.state_topic) if lookup is not None else None
            n = self._state_partitions = len(parts) if parts else None
        return None if not n else zlib.crc32(key) % n

    def due(self, every_reports: int, every_s: float) -> bool:
        """Whether a checkpoint falls due: ``every_reports`` reports or ``every_s`` seconds."""
        return self.since_reports >= every_reports or time.monotonic() - self.last_at >= every_s

    def retry_later(self) -> None:
        """After a broker error: nothing committed, the next checkpoint falls due after the
        interval (the state stays in memory)."""
        self.pending = False
        self.last_at = time.monotonic()

    # -------------------------------------------------------------------------------- publish
    def send(self, marked: list[tuple[PartitionState, Mark]]) -> list[tuple]:
        """Send the checkpoint of each ``(partition state, mark)``: its states with the mark's
        offset and counts (the caller makes sure the states hold exactly the records below it:
        under the lock after a drain, or on the update thread) — except a partition whose update
        was rejected (:attr:`PartitionState.rejected`), which is skipped; returns
        ``[(partition state, next_offset sent, send future)]`` for :meth:`settle` (``None``
        for the records of closed window panes sent before a checkpoint, :meth:`send_panes`).

        Raises
        ------
        AggregatorError
            If a state update failed: no checkpoint is published after it.
        """
        failure = self.threads.failure
        if marked and failure is not None:
            raise AggregatorError(f"a state update failed ({failure!r}); no checkpoint is published "
                                  "after it") from failure
        sent = []
        for ps, mark in marked:
            if ps.rejected is not None:  # its states missed a batch: the worker restores it
                continue
            sent += self.send_panes(ps, mark)
            ck = ps.to_checkpoint(self.runtime, mark)
            sent.append((ps, ck.next_offset,
                         self.producer.send(self.state_topic, key=ck.key, value=ck.to_bytes())))
        return sent

    def send_panes(self, ps: PartitionState, mark: Mark) -> list[tuple]:
        """Before ``ps``'s checkpoint at ``mark``: send every closed window pane of its windowed
        queries under its own key and every tombstone due (docs/windows.md §3), after dropping
        those a durable checkpoint already carried (:meth:`WindowedState.settle`). Returns
        ``[(ps, None, send future)]`` — :meth:`settle` waits for them with the checkpoint, so a
        pane leaves the partition state only in a checkpoint after its record is durable."""
        from aggregator.checkpoint import pane_key

        out = []
        for name in self.runtime.windowed:
            st = ps.states[name]
            st.settle(ps.published_offset)
            for start, blob in st.outbox(mark.next_offset):
                key = pane_key(self.runtime.name, ps.partition, name, start)
                part = self._pane_partition(key)
                where = {} if part is None else {"partition": part}
                out.append((ps, None, self.producer.send(self.state_topic, key=key, value=blob, **where)))
        if out:
            self.metrics.pane_records.inc(len(out))
        return out

    def settle(self, sent: list[tuple], flush: bool = True) -> dict:
        """Wait for the checkpoints :meth:`send` sent (``flush``: flush the producer first;
        without, every future must be done) and return the offsets to commit; raises the send
        error of a refused record. Lock not needed: only the producer is used."""
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        if not sent:
            return {}
        if flush:
            self.producer.flush(timeout=30)
        for _, _, f in sent:  # flush() does not raise for a failed record: its future does
            f.get(timeout=1)
        # the state is durable: only now may the group offsets move
        sent = [(ps, offset, f) for ps, offset, f in sent if offset is not None]  # not pane records
        for ps, offset, _ in sent:
            if ps.published_offset is None or offset > ps.published_offset:
                ps.published_offset = offset
        self.metrics.checkpoints.inc(len(sent))
        return {TopicPartition(self.reports_topic, ps.partition): OffsetAndMetadata(offset, "", -1)
                for ps, offset, _ in sent}

    def publish(self, parts: list[PartitionState]) -> dict:
        """Send the checkpoints of ``parts`` and flush; returns the offsets to commit. Only the
        producer is used, so this is safe inside a rebalance callback and under the lock."""
        return self.settle(self.send([(ps, ps.mark()) for ps in parts]))

    def publish_due(self, force: bool = False) -> Published:
        """The synchronous checkpoint: wait for the updates in flight, then publish the
        checkpoints of the changed (``force``: all) owned partitions and flush (outside the
        lock); :meth:`commit` commits the offsets.

        Raises
        ------
        kafka.errors.KafkaError
            If the broker refused or did not acknowledge a record.
        """
        t0 = time.perf_counter()
        with self.lock:
            self.threads.drain()
            sent = self.send([(ps, ps.mark()) for ps in self.owned.values() if force or ps.dirty])
        # the flush outside the lock: a rebalance callback waiting for it would hold up
        # kafka-python's network loop (heartbeats); a revoke's own checkpoint of the same partition
        # goes through the same producer after these records and is flushed by the callback
        offsets = self.settle(sent)
        self.since_reports = 0
        self.last_at = time.monotonic()
        return Published(offsets, len(offsets), t0, time.perf_counter())

    # ------------------------------------------------------------------ in the background
    def begin(self) -> InFlight | Published:
        """A checkpoint of the main loop with overlap, on the fold thread after the folds before
        it: mark where each changed owned partition stands and queue :meth:`snapshot` on the
        update thread, behind the updates of those folds. Returns at once (an empty
        :class:`Published` if nothing changed); :meth:`check` commits once acknowledged."""
        t0 = time.perf_counter()
        with self.lock:
            self.threads.raise_failure()
            marked = [(ps, ps.mark()) for ps in self.owned.values() if ps.dirty]
            self.since_reports = 0
            self.last_at = time.monotonic()
            if not marked:
                return Published({}, 0, t0, time.perf_counter())
            # behind the updates: a revoke's (or the shutdown's) drain waits for it, so that its
            # own checkpoint of a partition is sent after this one
            snapshot = self.threads.submit_after_updates(self.snapshot, marked)
        return InFlight(snapshot, t0)

    def snapshot(self, marked: list[tuple[PartitionState, Mark]]) -> SendOutcome:
        """Update thread: :meth:`send` the marked checkpoints (their states now hold exactly the
        records below their marks) of the partitions still owned by the same state — a revoke
        drains this task before it drops its partitions, a loss does not, and a lost partition's
        checkpoint must not be sent after its next owner's. An error of ``send`` is kept in the
        outcome; a failed update is raised."""
        self.threads.raise_failure()
        try:
            return SendOutcome(sent=self.send([(ps, m) for ps, m in marked
                                               if self.owned.get(ps.partition) is ps]))
        except Exception as exc:
            return SendOutcome(error=exc)

    def check(self, block: bool) -> None:
        """Main thread: finish :attr:`in_flight` once its records are acknowledged (``block``:
        wait for them) — commit its offsets.

        Raises
        ------
        kafka.errors.KafkaError
            A broker error while sending or acknowledging (call :meth:`retry_later` after
            backing off; nothing is committed, the partitions stay dirty).
        Exception
            A failed update or fold, or any other error of ``send`` (a bug).
        """
        fl = self.in_flight
        if fl is None or not (block or fl.acknowledged()):
            return
        self.in_flight = None
        sent = fl.snapshot.result().result()
        offsets = self.settle(sent, flush=block)
        # a partition revoked or lost meanwhile: its next owner commits (committing this older
        # offset would move the group's offset back)
        owned = {ps.partition for ps, offset, _ in sent
                 if offset is not None and self.owned.get(ps.partition) is ps}
        offsets = {tp: om for tp, om in offsets.items() if tp.partition in owned}
        self.finish(Published(offsets, len(offsets), fl.started, time.perf_counter()))

    # --------------------------------------------------------------------------------- commit
    def finish(self, published: Published) -> None:
        """The main loop's checkpoint is done: commit its offsets."""
        self.pending = False
        self.commit(published)

    def commit(self, published: Published) -> None:
        """Commit the offsets of published checkpoints (main thread: the consumer is not
        thread-safe) and record the checkpoint's duration."""
        if published.offsets:
            # outside the lock: commit runs on the consumer's network loop, which also runs the
            # rebalance callbacks that take the lock
            t0 = time.perf_counter()
            try:
                self.consumer.commit(published.offsets)
            except Exception as exc:  # committed offsets are advisory: positions come from checkpoints
                log.warning("offset commit failed (%s); checkpoints are already durable", exc)
            # publish + commit, without the wait between them (the fold thread's queue)
            self.metrics.checkpoint_duration.observe(published.published - published.started
                                                     + time.perf_counter() - t0)
