"""The worker's main loop and rebalance handling (docs/reliability.md §1, docs/kafka.md §2.3).

The worker is a kafka-python ``KafkaConsumer`` in a consumer group over the reports topic, with
``enable_auto_commit=False``. It keeps, **per owned partition**, the state of every query together
with ``next_offset`` (the first offset not yet folded in):

* records below ``next_offset`` are skipped and counted (``ldp_duplicates_skipped_total``); the
  others are folded in by :class:`~aggregator.worker.fold.Folder` (decode, double, update) or
  dead-lettered. The main thread polls: each poll is folded on the ``ldp-fold`` thread while the
  main thread fetches the next one (a poll capped at ``max_poll_records`` is folded in the main
  thread: the next one is already buffered), and its state updates run on the ``ldp-update``
  thread (one update in flight) while the fold thread takes the next poll
  (:class:`~aggregator.worker.threads.OverlapThreads`);
* every ``checkpoint_interval_s`` seconds or ``checkpoint_reports`` reports (or once the windowed
  queries hold :data:`MAX_CLOSED_PANES` closed panes), each changed partition's checkpoint is published
  to the state topic, and **only once the broker has acknowledged it** are group offsets committed
  (:class:`~aggregator.worker.checkpointing.Checkpointer`; at most one such checkpoint is on
  its way while the main thread keeps fetching);
* on assignment the latest checkpoint of the partition is read from the state topic (to its end)
  and the consumer seeks to its ``next_offset`` (no checkpoint: from the earliest offset; an
  undecodable checkpoint: logged, counted, rebuilt from the earliest offset); on revocation the
  partition is checkpointed; on loss it is dropped;
* :meth:`Worker.stop` (SIGTERM/SIGINT in the CLI) → final checkpoint and ``consumer.close()``
  (without ``LeaveGroup`` when stopped during a group join: docs/kafka.md);
* every synchronous checkpoint (:meth:`Worker.checkpoint`, the shutdown's) first waits for the
  poll being folded, the update in flight and the main loop's checkpoint on its way; a
  revocation waits for the update in flight and a checkpoint queued behind it (a poll folded
  after it finds its partition gone and drops the records: the next owner fetches them again);
  a failed fold or update stops the worker without any further checkpoint (its offsets were
  already past the batch).

kafka-python 3.x runs rebalance callbacks on its network loop, so the callbacks only pause the
new partitions and flag them (restore happens in the main loop), or publish the small checkpoint
records of revoked partitions through the separate producer client.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka.errors import KafkaError

from aggregator.checkpoint import Checkpoint, StateTopicReader, checkpoint_key
from aggregator.errors import CheckpointError, ConfigError
from aggregator.metrics import WorkerMetrics
from aggregator.plan import PipelineRuntime
from aggregator.worker.checkpointing import Checkpointer, InFlight, Published
from aggregator.worker.fold import Folder
from aggregator.worker.partition import PartitionState
from aggregator.worker.recovery import Recovery
from aggregator.worker.threads import OverlapThreads
from ingest.kafka.groups import close_without_leaving
from ingest.kafka.settings import CLOSE_TIMEOUT_S

__all__ = ["DEFAULT_MAX_POLL_RECORDS", "MAX_CLOSED_PANES", "KafkaClients", "Worker"]

log = logging.getLogger("aggregator.worker")

#: Records per poll. Each poll costs ≈ 0.6 ms of fixed work (one update of every query state and
#: the decoder's set-up), so small records need large polls: at 1 report/record the worker's own
#: cost falls from 2.7 (500 per poll) to 1.0 µs per record (5000). Large records are capped
#: by kafka-python's fetch size (1 MiB per partition) long before.
DEFAULT_MAX_POLL_RECORDS = 5000
#: Closed window panes held by the owned partitions that make a checkpoint due (docs/windows.md §3).
MAX_CLOSED_PANES = 512


@dataclass(frozen=True)
class KafkaClients:
    """The Kafka clients of one worker.

    Attributes
    ----------
    consumer : kafka.KafkaConsumer
        The group consumer, not yet subscribed (built with ``group_id``,
        ``enable_auto_commit=False``, ``auto_offset_reset="earliest"`` and ``max_poll_records``);
        :meth:`Worker.run` subscribes it to the reports topic.
    producer : kafka.KafkaProducer
        Sends checkpoints and dead-lettered records (``acks="all"``; ``max_request_size`` above
        the worker's ``max_record_bytes``).
    reader : StateTopicReader or None
        Reads the state topic on assignment (its own consumer, without a group). ``None`` only
        where no partition is ever assigned.
    """

    consumer: Any
    producer: Any
    reader: StateTopicReader | None = None


def _listener_base():
    from kafka import ConsumerRebalanceListener

    return ConsumerRebalanceListener


class _Listener(_listener_base()):
    """Rebalance listener; runs on kafka-python's network loop, so it only does short work."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def on_partitions_assigned(self, assigned) -> None:
        self.worker.on_assigned(assigned)

    def on_partitions_revoked(self, revoked) -> None:
        self.worker.on_revoked(revoked)

    def on_partitions_lost(self, lost) -> None:
        self.worker.on_lost(lost)


class Worker(Recovery):
    """Exactly-once consumer-group worker over one reports topic (docs/reliability.md §1).

    Parameters
    ----------
    runtime : PipelineRuntime
        Decoder, doubling and state builders of the pipeline.
    clients : callable () → KafkaClients
        Builds the worker's clients; called once, by :meth:`open` (kafka-python clients connect
        when they are built, so a worker can be constructed without a broker).
        :func:`aggregator.worker.worker_from_config` passes one that builds them from the
        ``[kafka]`` settings. The worker closes them in :meth:`shutdown`.
    reports_topic, state_topic, dead_letter_topic : str
        Topic names.
    group_id : str
        Consumer group (the consumer's).
    checkpoint_interval_s : float
        Checkpoint at least this often while there is new data (> 0 seconds).
    checkpoint_reports : int
        … or after this many reports (≥ 1) since the last checkpoint.
    max_record_bytes : int
        Records larger than this are dead-lettered with reason ``"oversized"`` (≥ 1 byte); the
        dead-letter copy is their first ``max_record_bytes`` bytes with header ``truncated_from``.
    coalesce : bool
        Concatenate the decoded batches of one poll and partition into one update (fast). With
        ``False`` every record is its own update, which makes the float sums independent of poll
        boundaries and restarts (bit-identical replays).
    max_poll_records : int
        ``max_records`` per ``poll`` (≥ 1; default :data:`DEFAULT_MAX_POLL_RECORDS`).
    overlap : bool
        Fold each poll on background threads while the main thread polls the next records: the
        ``ldp-fold`` thread decodes and doubles one poll at a time and hands its update to the
        ``ldp-update`` thread (one update in flight). States, offsets and checkpoints are
        identical to ``False`` (everything inline, in the main thread): every checkpoint and
        shutdown first waits for both threads, a revoke for the update in flight; checkpoints
        that fall due in :meth:`run` are marked by the fold thread and sent by the update thread
        behind the updates before them; only the offset commit waits for the broker's
        acknowledgement. A poll that returned ``max_poll_records`` records is folded in the main
        thread: kafka-python still holds records, so the next poll does not wait for the
        network, and many small records would otherwise cost GIL hand-offs between the two
        threads. Returning to ``poll`` at once matters because kafka-python 3.0 sends the next
        fetch request only when ``poll`` is called again if the previous call had to wait for
        its records; folding in the main thread delayed every fetch by the fold's time
        (docs/benchmarks.md §3.3).
    metrics : WorkerMetrics or None
        ``None`` creates one with a private registry.
    max_event_time_skew_s : float
        With windowed queries: records holding an event time more than this many seconds ahead
        of their Kafka timestamp are dead-lettered (``event_time_skew``; ≥ 0).

    Attributes
    ----------
    consumer, producer, reader
        The clients (``None`` until :meth:`open`).
    owned : dict int → PartitionState
        The restored partitions this worker owns.
    pending : set of TopicPartition
        Partitions assigned and paused until :meth:`restore_pending` restores them.
    folder : Folder or None
        Folds records into partition states (:meth:`process`); built by :meth:`open`.
    threads : OverlapThreads
        The fold and update threads.
    checkpoints : Checkpointer or None
        The checkpoint protocol (publish → acknowledge → commit); built by :meth:`open`.

    Raises
    ------
    ConfigError
        If a parameter is out of range (the message names it).

    Notes
    -----
    Records of the dead-letter topic are at-least-once (a crash after producing them and before
    the next checkpoint re-sends them); states are exactly-once.

    The loop calls :meth:`process`, :meth:`restore_pending` and the methods of :attr:`folder`,
    :attr:`threads` and :attr:`checkpoints` through their instances: wrapping one (as
    ``benchmarks/pipeline.py`` does to time the phases) changes nothing else.
    """

    def __init__(self, runtime: PipelineRuntime, clients: Callable[[], KafkaClients], *,
                 reports_topic: str, state_topic: str,
                 dead_letter_topic: str, group_id: str, checkpoint_interval_s: float = 5.0,
                 checkpoint_reports: int = 100_000, max_record_bytes: int = 16 * 1024 * 1024,
                 coalesce: bool = True, max_poll_records: int = DEFAULT_MAX_POLL_RECORDS,
                 overlap: bool = True, metrics: WorkerMetrics | None = None,
                 max_event_time_skew_s: float = 3600.0) -> None:
        for arg, val in (("reports_topic", reports_topic), ("state_topic", state_topic),
                         ("dead_letter_topic", dead_letter_topic), ("group_id", group_id)):
            if not isinstance(val, str) or not val:
                raise ConfigError(f"{arg} must be a non-empty string, got {val!r}")
        if len({reports_topic, state_topic, dead_letter_topic}) != 3:
            raise ConfigError("reports_topic, state_topic and dead_letter_topic must be three different "
                              "topics")
        if not (isinstance(checkpoint_interval_s, int | float) and checkpoint_interval_s > 0):
            raise ConfigError(f"checkpoint_interval_s must be > 0 seconds, got {checkpoint_interval_s!r}")
        if not (isinstance(checkpoint_reports, int) and checkpoint_reports >= 1):
            raise ConfigError(f"checkpoint_reports must be an integer >= 1, got {checkpoint_reports!r}")
        if not (isinstance(max_record_bytes, int) and max_record_bytes >= 1):
            raise ConfigError(f"max_record_bytes must be an integer >= 1, got {max_record_bytes!r}")
        if not (isinstance(max_poll_records, int) and max_poll_records >= 1):
            raise ConfigError(f"max_poll_records must be an integer >= 1, got {max_poll_records!r}")
        if not (isinstance(max_event_time_skew_s, int | float) and max_event_time_skew_s >= 0):
            raise ConfigError(f"max_event_time_skew_s must be >= 0 seconds, got {max_event_time_skew_s!r}")
        self.runtime = runtime
        self._clients = clients
        self.consumer = self.producer = self.reader = None
        self.reports_topic = reports_topic
        self.state_topic = state_topic
        self.dead_letter_topic = dead_letter_topic
        self.group_id = group_id
        self.checkpoint_interval_s = float(checkpoint_interval_s)
        self.checkpoint_reports = int(checkpoint_reports)
        self.max_poll_records = int(max_poll_records)
        self.metrics = metrics if metrics is not None else WorkerMetrics()

        self.owned: dict[int, PartitionState] = {}
        self.processed_reports = 0  # in this process
        self.processed_records = 0
        self.pending: set = set()  # TopicPartitions awaiting restore (paused)
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._closing = False
        # an assignment is in force: set when a join completes (assigned), cleared when one starts
        # (revoked, lost) — a close in between sends no LeaveGroup (docs/kafka.md)
        self._stable = False
        #: set by the shutdown when the final checkpoint failed or could not be taken
        self.final_checkpoint_failed = False
        self.owned_at_stop: list[int] = []  # partitions owned when the loop ended (before leaving)
        self._last_data = time.monotonic()
        self._last_trouble_log = 0.0
        self.max_record_bytes = int(max_record_bytes)
        self.coalesce = bool(coalesce)
        self.max_event_time_skew_s = float(max_event_time_skew_s)
        self.threads = OverlapThreads(overlap)
        self.folder: Folder | None = None
        self.checkpoints: Checkpointer | None = None

    def open(self) -> Worker:
        """Build the clients (once) and the parts that use them: :attr:`folder` (the producer,
        for dead letters) and :attr:`checkpoints` (the producer and the consumer). :meth:`run`
        calls it; returns the worker."""
        if self.consumer is None:
            clients = self._clients()
            self.consumer, self.producer, self.reader = clients.consumer, clients.producer, clients.reader
            self.folder = Folder(self.runtime, self.producer, threads=self.threads, metrics=self.metrics,
                                 dead_letter_topic=self.dead_letter_topic,
                                 max_record_bytes=self.max_record_bytes, coalesce=self.coalesce,
                                 max_event_time_skew_s=self.max_event_time_skew_s)
            self.checkpoints = Checkpointer(self.runtime, self.producer, self.consumer, owned=self.owned,
                                            threads=self.threads, lock=self.lock, metrics=self.metrics,
                                            reports_topic=self.reports_topic, state_topic=self.state_topic)
        return self

    # -------------------------------------------------------------------------------- callbacks
    def on_assigned(self, assigned) -> None:
        """Rebalance callback: pause the new partitions until :meth:`restore_pending`."""
        tps = [tp for tp in assigned if tp.topic == self.reports_topic]
        with self.lock:
            self._stable = True
            self.metrics.rebalances.inc()
            if tps:
                self.consumer.pause(*tps)
                self.pending.update(tps)
        log.info("assigned %s (restore pending)", sorted(tp.partition for tp in tps))

    def on_revoked(self, revoked) -> None:
        """Rebalance callback: checkpoint the revoked partitions (through the producer), then
        drop them."""
        with self.lock:
            self._stable = False  # a (re)join starts
            self.metrics.rebalances.inc()
            parts = [tp.partition for tp in revoked if tp.topic == self.reports_topic]
            self.pending.difference_update(revoked)
            todo = [self.owned[p] for p in parts if p in self.owned]
            if todo and not self._closing:
                # the producer is a separate client: publishing + flushing here is short and safe
                try:
                    self.threads.drain()
                    self.checkpoints.publish(todo)
                except Exception:
                    log.exception("checkpoint on revoke failed; the next owner replays from the last one")
            for p in parts:
                self.owned.pop(p, None)
                if _has_label(self.metrics.lag, str(p)):
                    self.metrics.lag.remove(str(p))
            self.metrics.owned.set(len(self.owned))
        log.info("revoked %s", parts)

    def on_lost(self, lost) -> None:
        """Rebalance callback: drop the lost partitions (no checkpoint can follow). Logged as a
        warning only when a lost partition had records folded in after its last durable
        checkpoint (its next owner replays them); otherwise — the usual case at shutdown, when
        another member left first — at info level."""
        behind: dict[int, int] = {}  # partition → records folded after its durable checkpoint
        with self.lock:
            self._stable = False
            self.metrics.rebalances.inc()
            self.pending.difference_update(lost)
            for tp in lost:
                ps = self.owned.pop(tp.partition, None)
                if ps is not None and ps.dirty:  # never checkpointed: every record it folded
                    behind[tp.partition] = (ps.records if ps.published_offset is None
                                            else ps.next_offset - ps.published_offset)
            self.metrics.owned.set(len(self.owned))
        # the group moved on without this member (a rebalance it missed, e.g. while another member
        # left at shutdown): no checkpoint can be published for them any more, but the last one is
        # durable, so the next owner resumes there — exactly once all the same
        parts = sorted(tp.partition for tp in lost)
        if behind:
            log.warning("lost %s to a rebalance (no checkpoint can follow); their next owner resumes "
                        "from their last published checkpoint and folds again the records after it "
                        "(%s), so no report is lost or counted twice", parts,
                        ", ".join(f"partition {p}: {n}" for p, n in sorted(behind.items())))
        else:
            log.info("lost %s to a rebalance; their last published checkpoint holds every record "
                     "folded here, so their next owner resumes where this worker stopped", parts)

    # ---------------------------------------------------------------------------------- restore
    def restore_pending(self) -> None:
        """Restore the partitions assigned since the last call from their latest checkpoints,
        seek to their ``next_offset`` and resume them (main thread)."""
        # a poll still being folded may hold records of a partition restored (and seeked) below
        self._wait_fold()
        with self.lock:
            todo = [tp for tp in self.pending if tp in self.consumer.assignment()]
            self.pending.clear()
        if not todo:
            return
        self.reader.catch_up()
        starts = self.consumer.beginning_offsets(todo)
        for tp in sorted(todo):
            ps = self._restore_partition(tp.partition)
            start = int(starts.get(tp) or 0)
            if ps.next_offset < start:
                gap = start - ps.next_offset
                log.warning("partition %d: offsets [%d, %d) are gone from the log (retention); %d "
                            "records lost, resuming at %d", tp.partition, ps.next_offset, start, gap, start)
                self.metrics.offset_gap.labels(partition=str(tp.partition)).inc(gap)
                ps.next_offset = start
            with self.lock:
                if tp not in self.consumer.assignment():
                    continue
                self.owned[tp.partition] = ps
                if self.folder is not None:
                    self.folder.refetch.pop(tp.partition, None)
                self.consumer.seek(tp, ps.next_offset)
                self.consumer.resume(tp)
                self.metrics.owned.set(len(self.owned))
            log.info("partition %d restored: next_offset=%d reports=%d", tp.partition, ps.next_offset,
                     ps.reports)

    def _restore_partition(self, partition: int) -> PartitionState:
        """The state of ``partition`` from its latest checkpoint (query set and fingerprint as
        the plan's), or a fresh one from offset 0 (none, or unusable: logged and counted)."""
        key = checkpoint_key(self.runtime.name, partition)
        raw = self.reader.latest.get(key)
        if raw is not None:
            try:
                ck = Checkpoint.from_bytes(raw)
                if ck.fingerprint != self.runtime.fingerprint:
                    raise CheckpointError("checkpoint was built for another schema fingerprint")
                ck.require_queries(self.runtime.query_names)
                states = {n: self.runtime.restore_state(n, blob) for n, blob in ck.states.items()}
                return PartitionState(partition, ck.next_offset, states, ck.reports, ck.records,
                                      published_offset=ck.next_offset)
            except Exception as exc:  # any corrupt state: rebuild this partition from scratch
                self.metrics.state_invalid.inc()
                log.error("state record %r (offset %s) cannot be restored with this config (%s); "
                          "rebuilding partition %d from the earliest offset (if the queries were "
                          "edited, this is expected: docs/deploy.md, \"Changing the queries\")",
                          key, self.reader.offsets.get(key), exc, partition)
        return PartitionState(partition, 0, self.runtime.new_states(), 0, 0)  # dirty: none published

    # ------------------------------------------------------------------------------- processing
    def process(self, partition: int, records: list) -> int:
        """Fold the records of one poll of ``partition`` into its state (:class:`Folder`);
        returns the number of reports folded in (0 for a partition not owned: not restored
        yet, or revoked — its records are fetched again by its owner — and for one whose
        update was rejected). A fold that raises an ``Exception`` marks the partition
        rejected (:meth:`recover_rejected` folds it again) instead of stopping the worker."""
        ps = self.owned.get(partition)
        if ps is None or ps.rejected is not None:  # a rejected one is folded again from its checkpoint
            return 0
        try:
            return self.folder.fold(ps, records)
        except Exception as exc:  # a fold that failed on data: this partition alone is folded again
            if ps.rejected is None:
                ps.rejected = (max(ps.next_offset, records[-1].offset + 1) if records else ps.next_offset,
                               f"{type(exc).__name__}: {exc}")
            return 0

    def fold_poll(self, got: Mapping) -> None:
        """Fold the records of one ``poll`` result (``{TopicPartition: [ConsumerRecord]}``) into
        their partitions' states and count them, under the lock (on the ``ldp-fold`` thread, or
        inline). A failure stops checkpoints as a failed update does: offsets may already have
        moved past records that are not in the states."""
        with self.lock:  # the failure is recorded before a rebalance callback can publish
            try:
                for tp, recs in got.items():
                    if tp.topic == self.reports_topic:
                        r = self.process(tp.partition, recs)
                        self.processed_reports += r
                        self.checkpoints.since_reports += r
                        self.processed_records += len(recs)
            except BaseException as exc:
                self.threads.record_failure(exc)
                raise

    # ------------------------------------------------------------------------------ checkpoints
    def checkpoint(self, force: bool = False) -> int:
        """Publish the checkpoints of owned partitions, flush, then commit their offsets.

        Waits first for the poll being folded and for a checkpoint of :meth:`run` still on its
        way (committing its offsets).

        Parameters
        ----------
        force : bool
            Publish every owned partition, not only those changed since the last checkpoint.

        Returns
        -------
        int
            Number of partitions checkpointed.

        Raises
        ------
        kafka.errors.KafkaError
            If the broker refused or did not acknowledge a checkpoint (nothing committed).
        """
        self._wait_fold()  # never under the lock: the fold holds it while it runs
        self._check_checkpoint(block=True)
        published = self.checkpoints.publish_due(force)
        self.checkpoints.commit(published)
        return published.partitions

    def panes_due(self) -> bool:
        """Whether the owned partitions hold :data:`MAX_CLOSED_PANES` closed window panes or more:
        they leave the state only with a checkpoint (docs/windows.md §3), so a stream that closes
        panes fast is checkpointed sooner and the state stays bounded by its open panes (the
        counts are read while the update thread may add to them: a trigger, not a measure)."""
        if not self.runtime.windowed:
            return False
        closed = 0
        for ps in list(self.owned.values()):
            for name in self.runtime.windowed:
                closed += len(ps.states[name].closed)
        return closed >= MAX_CLOSED_PANES

    def _wait_fold(self) -> None:
        """Wait until the fold thread's tasks are done (re-raising a fold's failure)."""
        self.threads.collect(True, self._fold_result)

    def _fold_result(self, out) -> None:
        """Main thread: the result of a fold-thread task — a checkpoint begun
        (:class:`InFlight`, committed once acknowledged), one with nothing to publish
        (:class:`Published`), or a fold's ``None``."""
        if isinstance(out, InFlight):  # a checkpoint begun: its records are on their way
            self.checkpoints.in_flight = out
        elif isinstance(out, Published):  # a checkpoint with nothing to publish
            self.checkpoints.finish(out)

    def _check_checkpoint(self, block: bool) -> None:
        """:meth:`Checkpointer.check`, backing off after a broker error."""
        try:
            self.checkpoints.check(block)
        except KafkaError as exc:  # retried once the next one falls due
            self._checkpoint_trouble(exc)

    def _checkpoint_trouble(self, exc: KafkaError) -> None:
        """A checkpoint failed at the broker: log, back off, retry once the next one is due."""
        self.broker_trouble("checkpoint", exc)
        self.checkpoints.retry_later()

    def broker_trouble(self, what: str, exc: Exception) -> None:
        """Log a broker error of the main loop (at most every 10 s) and back off for a second
        (the state stays in memory; called by the loop, a test may replace it)."""
        now = time.monotonic()
        if now - self._last_trouble_log > 10:
            log.warning("%s failed (%s: %s); keeping state in memory and retrying",
                        what, type(exc).__name__, exc)
            self._last_trouble_log = now
        self._stop.wait(1.0)

    # -------------------------------------------------------------------------------- main loop
    def stop(self) -> None:
        """Ask the main loop to finish: final checkpoint, then ``consumer.close()``.

        Safe to call from a signal handler or another thread.
        """
        self._stop.set()

    def _update_lag(self) -> None:
        """Set ``ldp_consumer_lag_records`` of each owned partition from its fetch high watermark."""
        from kafka import TopicPartition

        for p, ps in list(self.owned.items()):
            hw = self.consumer.highwater(TopicPartition(self.reports_topic, p))
            if hw is not None:
                self.metrics.lag.labels(partition=str(p)).set(max(0, int(hw) - ps.next_offset))

    def caught_up(self) -> bool:
        """Whether the worker owns partitions, none awaits restore, and every owned partition's
        ``next_offset`` has reached the fetch high watermark."""
        from kafka import TopicPartition

        with self.lock:
            if self.pending or not self.owned:
                return False
            for p, ps in self.owned.items():
                hw = self.consumer.highwater(TopicPartition(self.reports_topic, p))
                if hw is None or ps.next_offset < hw:
                    return False
            return True

    def run(self, max_reports: int | None = None, exit_when_idle: float | None = None,
            poll_timeout_ms: int = 200) -> int:
        """Consume until :meth:`stop`, ``max_reports`` reports, or ``exit_when_idle`` seconds with
        nothing left to read; then :meth:`shutdown`.

        Parameters
        ----------
        max_reports : int or None
            Stop once this process has folded in at least this many reports (≥ 1). With
            ``overlap`` the count is read while the last poll may still be folded, so up to one
            more poll can be folded in before the loop stops.
        exit_when_idle : float or None
            Stop once caught up (every owned partition at its high watermark) and no record has
            arrived for this many seconds (> 0).
        poll_timeout_ms : int
            ``poll`` timeout, milliseconds.

        Returns
        -------
        int
            Reports processed by this process.

        Raises
        ------
        ConfigError
            If ``max_reports`` < 1 or ``exit_when_idle`` ≤ 0.
        AggregatorError
            If the state topic cannot be read.
        """
        if max_reports is not None and (not isinstance(max_reports, int) or max_reports < 1):
            raise ConfigError(f"max_reports must be an integer >= 1, got {max_reports!r}")
        if exit_when_idle is not None and not exit_when_idle > 0:
            raise ConfigError(f"exit_when_idle must be > 0 seconds, got {exit_when_idle!r}")
        self.open()
        self.threads.start()
        self.consumer.subscribe([self.reports_topic], listener=_Listener(self))
        self._last_data = time.monotonic()
        cp, threads = self.checkpoints, self.threads
        try:
            while not self._stop.is_set():
                self.recover_rejected()
                self.refetch_gaps()
                if self.pending:
                    self.restore_pending()
                try:
                    got = self.consumer.poll(timeout_ms=poll_timeout_ms, max_records=self.max_poll_records)
                except KafkaError as exc:  # broker gone or restarting: keep the state, retry
                    self.broker_trouble("poll", exc)
                    continue
                threads.collect(False, self._fold_result)
                self._check_checkpoint(block=False)
                n_got = sum(len(recs) for tp, recs in got.items() if tp.topic == self.reports_topic)
                if n_got:
                    self._last_data = time.monotonic()
                    if threads.folder is None:
                        self.fold_poll(got)
                    elif n_got >= self.max_poll_records:
                        # a poll capped at max_records leaves records buffered in kafka-python: the
                        # next poll does not wait for the network, so folding here costs no fetch
                        # time and saves the GIL hand-offs of the fold thread (many small records)
                        self._wait_fold()
                        self.fold_poll(got)
                    else:
                        self._wait_fold()  # one poll folded while the next is fetched
                        threads.submit_fold(self.fold_poll, got)
                self._update_lag()
                due = cp.due(self.checkpoint_reports, self.checkpoint_interval_s) or self.panes_due()
                if due and threads.folder is None:
                    try:
                        published = cp.publish_due()
                    except KafkaError as exc:
                        self._checkpoint_trouble(exc)
                    else:
                        cp.finish(published)
                elif due and not cp.pending:  # begun on the fold thread after the fold
                    cp.pending = True  # above, committed here once acknowledged
                    threads.submit_fold(cp.begin)
                if max_reports is not None and self.processed_reports >= max_reports:
                    log.info("processed %d reports (max %d): stopping", self.processed_reports, max_reports)
                    break
                if (exit_when_idle is not None and time.monotonic() - self._last_data >= exit_when_idle
                        and self.caught_up()):
                    log.info("idle for %.1f s and caught up: stopping", exit_when_idle)
                    break
        finally:
            self.shutdown()
        return self.processed_reports

    def shutdown(self) -> None:
        """Final checkpoint (none after a failed fold or update), stop the threads and close
        the clients within :data:`ingest.kafka.settings.CLOSE_TIMEOUT_S` (:meth:`run` ends with it)."""
        self.owned_at_stop = sorted(self.owned)
        try:
            if self.threads.failure is not None:
                self.final_checkpoint_failed = True
                log.error("no final checkpoint: a state update failed (%r); the next start replays "
                          "from the last checkpoint", self.threads.failure)
            elif self.consumer is not None:
                self.checkpoint()
        except Exception:
            self.final_checkpoint_failed = True
            log.exception("final checkpoint failed; the next start replays from the last checkpoint")
        self.threads.shutdown()
        self._closing = True
        ms = int(CLOSE_TIMEOUT_S * 1000)  # bounded closes: a hung broker must not hang the stop
        for client in (self.consumer, self.producer):
            if client is None:  # never opened
                continue
            try:
                if client is self.producer:
                    client.close(timeout=CLOSE_TIMEOUT_S)
                elif self._stable:
                    client.close(timeout_ms=ms)
                else:  # stopped during a group join: leave by disconnecting (docs/kafka.md)
                    log.info("stopped during a group join: closing without LeaveGroup")
                    close_without_leaving(client, timeout_ms=ms)
            except Exception:
                log.debug("closing client failed", exc_info=True)
        if self.reader is not None:
            self.reader.close()

    def __repr__(self) -> str:
        try:
            return (f"Worker(pipeline={self.runtime.name!r}, group={self.group_id!r}, "
                    f"owned={sorted(self.owned)}, reports={self.processed_reports})")
        except Exception:  # pragma: no cover - repr never raises
            return "Worker(?)"


def _has_label(metric, value: str) -> bool:
    try:
        return (value,) in metric._metrics  # prometheus_client keeps children by label tuple
    except AttributeError:
        return False
