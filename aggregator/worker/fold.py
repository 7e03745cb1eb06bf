"""Folding records into a partition's states: skip duplicates, dead-letter what cannot be
folded, decode, double and update (docs/reliability.md §1.2).

The records of one poll and partition are decoded together (``codec.decode_many``; with
``coalesce=False`` one by one), ``X̃₂ = X̃₁ + S′`` is drawn for each record's rows — seeded by the
record bytes, so a replay is bit-identical — and every query state is updated with the batch
(:meth:`OverlapThreads.update`). Undecodable records go to the dead-letter topic (value = the
original bytes, headers ``reason``, ``source_topic``, ``source_partition``, ``source_offset``)
and are counted by reason.

With windowed queries (docs/windows.md §3) every report needs an event time: the record's own
(schema with a time column) or its Kafka timestamp. A record holding an event time more than
``max_event_time_skew_s`` ahead of its Kafka timestamp is dead-lettered (``event_time_skew``): one
device with a clock in 2099 must not move the watermark past every open window.

A partition whose states refused an update (:attr:`PartitionState.rejected`) is folded again from
its last checkpoint; until it is past the refused batch, :meth:`Folder.fold` takes its records
one at a time, each update on a copy of the states kept for a roll-back, and dead-letters a record
whose update raises (``state_rejected``) or whose fold fails otherwise (``fold_error``), with the
error in the header ``error`` (docs/reliability.md §9).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from aggregator.errors import UpdateRejectedError
from aggregator.metrics import WorkerMetrics
from aggregator.plan import PipelineRuntime
from aggregator.worker.partition import PartitionState
from aggregator.worker.threads import OverlapThreads
from ingest.client.batch import ReportBatch, concat_batches, slice_batch, with_event_time

__all__ = ["Folder"]

log = logging.getLogger(__name__)


class Folder:
    """Fold the records of one poll and partition into its :class:`PartitionState`.

    Parameters
    ----------
    runtime : PipelineRuntime
    producer : kafka.KafkaProducer
        Sends dead-lettered records.
    threads : OverlapThreads
        Runs the state updates (inline or on the update thread).
    metrics : WorkerMetrics
    dead_letter_topic : str
    max_record_bytes : int
        Larger records are dead-lettered (``"oversized"``), truncated to this size.
    coalesce : bool
        One update per poll and partition (``False``: one per record, bit-identical replays).
    max_event_time_skew_s : float
        With windowed queries: a record with an event time more than this many seconds ahead of
        its Kafka timestamp is dead-lettered (``event_time_skew``).

    Attributes
    ----------
    careful : dict int → int
        Partition → offset below which its records are folded one at a time with a roll-back
        (set by the worker after a rejected update, cleared once past it).

    Notes
    -----
    The methods call each other through the instance, so a benchmark may wrap one (e.g.
    :meth:`fold_contiguous`) to time it.
    """

    def __init__(self, runtime: PipelineRuntime, producer, *, threads: OverlapThreads,
                 metrics: WorkerMetrics, dead_letter_topic: str, max_record_bytes: int,
                 coalesce: bool, max_event_time_skew_s: float = 3600.0) -> None:
        self.runtime = runtime
        self.producer = producer
        self.threads = threads
        self.metrics = metrics
        self.dead_letter_topic = dead_letter_topic
        self.max_record_bytes = max_record_bytes
        self.coalesce = coalesce
        self.max_event_time_skew_s = float(max_event_time_skew_s)
        self.careful: dict[int, int] = {}
        # partition → offsets dead-lettered by this process at or after the partition's durable
        # checkpoint: a replay (after a rejected update, or a partition assigned again) does not
        # send them twice
        self.sent: dict[int, set[int]] = {}
        self._atomic = False  # fold_decoded updates inline, rolling back a refused update
        # partition → [first missing offset, seeked]: a gap is fetched once more before it is
        # believed (the embedded broker's fetch sometimes leaves out a record of several MB that
        # a fetch starting at it returns); the worker's main loop seeks (:meth:`Worker.refetch_gaps`)
        self.refetch: dict[int, list] = {}

    def fold(self, ps: PartitionState, records: list) -> int:
        """Fold ``records`` (kafka-python ``ConsumerRecord``\\ s of ``ps``'s partition, offsets
        increasing) into ``ps``; returns the number of reports folded in. Records of a partition
        in :attr:`careful` go through :meth:`fold_carefully`."""
        sent = self.sent.get(ps.partition)
        if sent is not None and len(sent) > 4096 and ps.published_offset is not None:
            self.sent[ps.partition] = {o for o in sent if o >= ps.published_offset}
        end = self.careful.get(ps.partition)
        if end is not None:
            return self.fold_carefully(ps, records, end)
        return self.fold_plain(ps, records)

    def fold_carefully(self, ps: PartitionState, records: list, end: int) -> int:
        """Fold the records below offset ``end`` one at a time, each update applied to the
        states inline and rolled back if a state raises; such a record, or one whose fold fails
        otherwise, is dead-lettered (``state_rejected`` / ``fold_error``, header ``error``).
        The records from ``end`` on are folded as usual. Returns the reports folded in."""
        n = 0
        for i, rec in enumerate(records):
            if rec.offset >= end:
                del self.careful[ps.partition]
                log.info("partition %d: past offset %d, folding as usual again", ps.partition, end)
                return n + self.fold_plain(ps, records[i:])
            self._atomic = True
            try:
                n += self.fold_plain(ps, [rec])
            except UpdateRejectedError as exc:
                self.dead_letter(rec, "state_rejected", error=str(exc))
            except Exception as exc:
                ps.next_offset = max(ps.next_offset, rec.offset + 1)
                self.dead_letter(rec, "fold_error", error=f"{type(exc).__name__}: {exc}")
            finally:
                self._atomic = False
        return n

    def _gap_believed(self, ps: PartitionState, offset: int) -> bool:
        """Whether the offsets from ``ps.next_offset`` to ``offset`` (a record beyond them
        arrived) are missing from the log: only once they were fetched again from the first of
        them (:attr:`refetch`), then counted in ``ldp_offset_gap_total`` and logged."""
        p = ps.partition
        entry = self.refetch.get(p)
        if entry is None or entry[0] != ps.next_offset:
            self.refetch[p] = [ps.next_offset, False]
            log.info("partition %d: offsets [%d, %d) not in this fetch; fetching again from %d", p,
                     ps.next_offset, offset, ps.next_offset)
            return False
        if not entry[1]:
            return False  # fetched before the seek
        del self.refetch[p]
        log.warning("partition %d: offsets [%d, %d) missing from the log", p, ps.next_offset, offset)
        self.metrics.offset_gap.labels(partition=str(p)).inc(offset - ps.next_offset)
        return True

    def fold_plain(self, ps: PartitionState, records: list) -> int:
        """:meth:`fold` without the careful path: skip duplicates, count gaps, dead-letter
        what is refused, fold the rest (one update per poll with ``coalesce``)."""
        entry = self.refetch.get(ps.partition)
        if entry is not None and entry[1] and any(r.offset == entry[0] for r in records):
            del self.refetch[ps.partition]
            log.info("partition %d: offset %d arrived when fetched again", ps.partition, entry[0])
        if self.coalesce and records and records[0].offset == ps.next_offset \
                and records[-1].offset == ps.next_offset + len(records) - 1:
            # the usual poll: the next offsets, no gap, no duplicate (offsets increase)
            n_reports = self.fold_contiguous(ps, records)
            if n_reports is not None:
                self.metrics.last_processed.set(time.time())
                return n_reports
        todo = []  # (record, reason it is refused before decoding or None), in offset order
        n_reports = 0
        for rec in records:
            if rec.offset < ps.next_offset:
                self.metrics.duplicates.inc()
                continue
            if rec.offset > ps.next_offset and not self._gap_believed(ps, rec.offset):
                break  # the rest of this poll of the partition comes again after the seek
            ps.next_offset = rec.offset + 1
            value = rec.value
            refused = ("empty" if value is None
                       else "oversized" if len(value) > self.max_record_bytes else None)
            todo.append((rec, refused))
            if not self.coalesce:
                n_reports += self.fold_records(ps, todo)
                todo = []
        if todo:
            n_reports += self.fold_records(ps, todo)
        if n_reports or records:
            self.metrics.last_processed.set(time.time())
        return n_reports

    def fold_contiguous(self, ps: PartitionState, records: list) -> int | None:
        """:meth:`fold_records` of records that follow ``next_offset`` without a gap, without a
        per-record Python loop; ``None`` (nothing done) unless every record is present, within
        ``max_record_bytes`` and decodes."""
        values = [rec.value for rec in records]
        if None in values or max(map(len, values)) > self.max_record_bytes:
            return None
        batch, results = self.runtime.decode_many(values)
        if batch is None or batch.fingerprint != self.runtime.fingerprint \
                or not all(type(r) is int for r in results):
            return None  # decode again in fold_records, which dead-letters what fails
        if self.runtime.windowed:
            batch, skewed = self.event_times(batch, records, results)
            if skewed.any():
                return None  # fold_records dead-letters the skewed records
        ps.next_offset = records[-1].offset + 1
        return self.fold_decoded(ps, batch, values, results)

    def fold_records(self, ps: PartitionState, todo: list) -> int:
        """Decode the records of ``todo`` (``[(record, reason refused or None)]``) as one batch,
        dead-letter the refused and undecodable ones (in offset order), double each record's
        rows with its own seed and update the states; returns the report count."""
        values = [rec.value for rec, refused in todo if refused is None]
        batch, results = self.runtime.decode_many(values) if values else (None, [])
        foreign = batch is not None and batch.fingerprint != self.runtime.fingerprint
        if foreign:
            batch = None
        decoded = [rec for rec, refused in todo if refused is None]
        skewed = iter(())
        if batch is not None and self.runtime.windowed:
            ok = [(rec, r) for rec, r in zip(decoded, results, strict=True) if isinstance(r, int)]
            batch, flags = self.event_times(batch, [rec for rec, _ in ok], [r for _, r in ok])
            skewed = iter(flags.tolist())
        outcome = iter(results)  # per record: its report count, or the DecodeError it raised
        good, counts, keep = [], [], []  # keep: (start, stop) rows of batch folded in
        row = 0
        for rec, refused in todo:
            if refused is None:
                res = next(outcome)
                if isinstance(res, int) and batch is not None:
                    span = (row, row + res)
                    row += res
                    if not next(skewed, False):
                        good.append(rec.value)
                        counts.append(res)
                        keep.append(span)
                        continue
                    refused = "event_time_skew"
                else:
                    refused = ("unknown_fingerprint" if isinstance(res, int)
                               else getattr(res, "reason", "malformed"))
            self.dead_letter(rec, refused)
        if batch is None or not good:
            return 0
        if sum(counts) != batch.n:  # a skewed record's reports leave the batch
            batch = concat_batches([slice_batch(batch, a, b) for a, b in keep])
        return self.fold_decoded(ps, batch, good, counts)

    def event_times(self, batch: ReportBatch, records: list, counts: list) -> tuple[ReportBatch, np.ndarray]:
        """``batch`` (the reports of ``records``, ``counts`` each, in order) with its event times,
        and per record whether it holds one more than ``max_event_time_skew_s`` ahead of the
        record's Kafka timestamp (bool array). A schema without a time column takes the record
        timestamps as event times (whole seconds; a record without a timestamp: time 0); the
        event times of a record without a timestamp are not bounded."""
        stamps = np.fromiter(((rec.timestamp if rec.timestamp is not None else -1) for rec in records),
                             dtype=np.int64, count=len(records))
        ts = np.maximum(stamps, 0) // 1000
        if batch.event_time is None:
            return with_event_time(batch, np.repeat(ts, counts)), np.zeros(len(records), dtype=bool)
        n = np.asarray(counts, dtype=np.int64)
        starts = np.cumsum(n) - n
        latest = np.full(len(records), np.iinfo(np.int64).min)
        has = n > 0
        if has.any():
            latest[has] = np.maximum.reduceat(batch.event_time, starts[has])
        # a record without a timestamp (-1) bounds nothing
        return batch, (latest > ts + self.max_event_time_skew_s) & (stamps >= 0)

    def fold_decoded(self, ps: PartitionState, batch: ReportBatch, values: list, counts: list) -> int:
        """Double each record's rows of ``batch`` with its own seed, update the states and count
        them; returns the batch's report count."""
        x2 = self.runtime.double_many(batch, values, counts)
        for name in self.runtime.windowed:  # the late counter, once per (restored) state
            st = ps.states[name]
            if st.late_listener is None:
                st.late_listener = self.metrics.late.labels(query=name).inc
        if self._atomic:
            self.update_or_roll_back(ps, batch, x2)
        else:
            self.threads.update(ps, batch, x2)
        ps.records += len(values)
        ps.reports += batch.n
        self.metrics.records.inc(len(values))
        self.metrics.reports.inc(batch.n)
        return batch.n

    def update_or_roll_back(self, ps: PartitionState, batch: ReportBatch, x2: np.ndarray) -> None:
        """Update the states of ``ps`` inline after the updates in flight; if a state raises,
        put back copies of the states taken before and raise :class:`UpdateRejectedError`."""
        self.threads.drain()
        before = {name: st.copy() for name, st in ps.states.items()}
        try:
            for st in ps.states.values():
                st.update(batch, x2)
        except Exception as exc:
            ps.states.clear()
            ps.states.update(before)
            raise UpdateRejectedError(f"{type(exc).__name__}: {exc}") from exc

    def dead_letter(self, rec, reason: str, error: str | None = None) -> None:
        """Send ``rec`` to the dead-letter topic with its ``reason`` and source headers (and
        ``error``, the exception's text truncated to 1000 characters, when given) — unless this
        process already sent it (a replay of the partition)."""
        sent = self.sent.setdefault(rec.partition, set())
        if rec.offset in sent:
            return
        sent.add(rec.offset)
        headers = [("reason", reason.encode()), ("source_topic", rec.topic.encode()),
                   ("source_partition", str(rec.partition).encode()),
                   ("source_offset", str(rec.offset).encode())]
        if error is not None:
            headers.append(("error", error[:1000].encode()))
        value = rec.value or b""
        if len(value) > self.max_record_bytes:
            # an oversized record would exceed the producer's max_request_size and crash the worker
            # on every restart: dead-letter its first max_record_bytes bytes and the original size
            headers.append(("truncated_from", str(len(value)).encode()))
            value = value[:self.max_record_bytes]
        fut = self.producer.send(self.dead_letter_topic, key=rec.key, value=value, headers=headers)
        fut.add_errback(lambda exc: log.error("dead letter of %s/%d@%d failed: %r", rec.topic, rec.partition,
                                              rec.offset, exc))
        self.metrics.dead_lettered.labels(reason=reason).inc()
        log.warning("record %s/%d@%d dead-lettered: %s", rec.topic, rec.partition, rec.offset, reason)
