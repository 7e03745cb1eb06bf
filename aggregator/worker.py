"""Exactly-once consumer-group worker (DESIGN §5).

The worker is a kafka-python ``KafkaConsumer`` in a consumer group over the reports topic, with
``enable_auto_commit=False``. It keeps, **per owned partition**, the state of every query together
with ``next_offset`` (the first offset not yet folded in):

* records below ``next_offset`` are skipped and counted (``ldp_duplicates_skipped_total``);
* the records of one poll and partition are decoded together (``codec.decode_many``; with
  ``coalesce=False`` one by one), ``X̃₂ = X̃₁ + S′`` (``zil.double``'s distribution, draws from
  ``aggregator.state.doubling_draws``) is drawn for each record's rows — seeded by the record
  bytes, so a replay is bit-identical — and all query states are updated with the batch. The
  main thread polls: each poll is folded (decoded, doubled, offsets moved) on the ``ldp-fold``
  thread while the main thread fetches the next one (a poll capped at ``max_poll_records`` is
  folded in the main thread: the next one is already buffered), and its state updates run on
  the ``ldp-update`` thread (one update in flight) while the fold thread takes the next poll;
* undecodable records go to the dead-letter topic (value = original bytes, headers ``reason``,
  ``source_topic``, ``source_partition``, ``source_offset``) and are counted by reason; the worker
  goes on;
* every ``checkpoint_interval_s`` seconds or ``checkpoint_reports`` reports, each owned partition's
  :class:`~aggregator.checkpoint.Checkpoint` is published to the state topic (key
  ``"<pipeline>/<partition>"``), and **only once the broker has acknowledged it** are group
  offsets committed. In the main loop the fold thread, after the folds before it, marks each
  partition's ``next_offset`` and queues the checkpoint on the update thread behind those folds'
  updates, then goes on folding; the update thread serializes and sends it; the main thread
  commits the offsets once every record is acknowledged (it keeps fetching meanwhile, and at most
  one such checkpoint is on its way);
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
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from kafka.errors import KafkaError

from aggregator.checkpoint import Checkpoint, CheckpointError, StateTopicReader, checkpoint_key
from aggregator.errors import AggregatorError, ConfigError
from aggregator.metrics import WorkerMetrics
from ingest.batch import ReportBatch, concat_batches, slice_batch
from ingest.errors import DecodeError
from ingest.kafka import CLOSE_TIMEOUT_S, close_without_leaving

__all__ = [
    "PartitionState",
    "PipelineRuntime",
    "Worker",
    "client_config",
    "concat_batches",
    "ensure_topics",
    "fast_group_settings",
    "worker_from_config",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# pipeline runtime: decode, double, build and restore states
# --------------------------------------------------------------------------------------------------
#: Records per poll. Each poll costs ≈ 0.6 ms of fixed work (one update of every query state and
#: the decoder's set-up), so small records need large polls: at 1 report/record the worker's own
#: cost falls from 2.7 (500 per poll) to 1.0 µs per record (5000). Large records are capped
#: by kafka-python's fetch size (1 MiB per partition) long before.
DEFAULT_MAX_POLL_RECORDS = 5000



class PipelineRuntime:
    """Everything the worker needs to know about the pipeline, independent of Kafka.

    Parameters
    ----------
    name : str
        Pipeline (query-set) name: prefix of the state-topic keys. Non-empty, no ``/``.
    fingerprint : bytes
        16-byte fingerprint of the schema the states are built for.
    decode : callable bytes → ReportBatch
        Decoder of one reports-topic record; raises :class:`ingest.errors.DecodeError` (with a
        ``reason``) on anything it refuses, including unknown fingerprints.
    new_states : callable () → dict str → state
        Fresh (empty) state per query name.
    restore_state : callable (name, bytes) → state
        Inverse of ``state.to_bytes()`` for the query ``name``; raises on a corrupt blob.
    double : callable (ReportBatch, bytes) → ndarray (n, d)
        ``X̃₂`` of the batch, seeded from the record bytes (DESIGN §2 doubling).
    decode_many : callable list[bytes] → (ReportBatch or None, list[int or DecodeError]) or None
        Batched decoder (``ingest.codec.decode_many``); None: ``decode`` record by record.
    double_many : callable (ReportBatch, list[bytes], list[int]) → ndarray (n, d) or None
        ``X̃₂`` of a batch made of several records (their bytes and report counts), equal to
        ``double`` applied record by record; None: ``double`` on slices.
    queries : mapping or None
        Query specs by name (informational; used by analyze/serve).
    schema : object or None
        The ``TelemetrySchema`` (for ``privacy_summary``).

    Raises
    ------
    ConfigError
        If ``name`` is empty or contains ``/`` or ``fingerprint`` is not 16 bytes.
    """

    def __init__(self, name: str, fingerprint: bytes, decode: Callable[[bytes], ReportBatch],
                 new_states: Callable[[], dict], restore_state: Callable[[str, bytes], Any],
                 double: Callable[[ReportBatch, bytes], np.ndarray], queries: Mapping | None = None,
                 schema: Any = None, decode_many: Callable | None = None,
                 double_many: Callable | None = None) -> None:
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigError(f"pipeline name must be a non-empty string without '/', got {name!r}")
        if not isinstance(fingerprint, bytes) or len(fingerprint) != 16:
            raise ConfigError(f"fingerprint must be 16 bytes, got {fingerprint!r}")
        self.name = name
        self.fingerprint = fingerprint
        self.decode = decode
        self.new_states = new_states
        self.restore_state = restore_state
        self.double = double
        self.queries = dict(queries or {})
        self.schema = schema
        self._decode_many = decode_many
        self._double_many = double_many

    def decode_many(self, values: list) -> tuple[ReportBatch | None, list]:
        """Decode records into one batch: ``(batch or None, [report count or DecodeError per
        record])``, the same outcome per record as :attr:`decode` (see ``codec.decode_many``)."""
        if self._decode_many is not None:
            return self._decode_many(values)
        good, results = [], []
        for v in values:
            try:
                b = self.decode(v)
            except DecodeError as exc:
                results.append(exc)
            else:
                good.append(b)
                results.append(b.n)
        return (concat_batches(good) if good else None), results

    def double_many(self, batch: ReportBatch, records: list, counts: list[int]) -> np.ndarray:
        """``X̃₂`` of a batch made of ``records`` (with ``counts`` reports each, in order): the
        rows of each record doubled with its own seed, as :attr:`double` does."""
        if self._double_many is not None:
            return self._double_many(batch, records, counts)
        if len(records) == 1:
            return self.double(batch, records[0])
        out, start = [], 0
        for rec, n in zip(records, counts, strict=True):
            out.append(self.double(slice_batch(batch, start, start + n), rec))
            start += n
        return np.concatenate(out, axis=0)

    @classmethod
    def from_config(cls, config) -> PipelineRuntime:
        """Build the runtime of a :class:`aggregator.config.PipelineConfig`.

        Uses ``ingest.codec.decode`` with the pipeline's schema as the only known schema,
        ``aggregator.state.build_state(query, schema)`` and the state classes' ``from_bytes``,
        and ``schema.zil_mechanism()``'s doubling with the draws of ``aggregator.state.doubling_draws``.

        Raises
        ------
        ConfigError
            If the configuration cannot be turned into states (propagated from the builders).
        """
        from aggregator import state as state_mod
        from ingest import codec

        schema = _config_schema(config)
        queries = _config_queries(config)
        fp = bytes(schema.fingerprint)
        known = {fp: schema}
        try:
            mech = schema.zil_mechanism()
        except Exception as exc:  # schemas without numeric fields have no ZIL vector
            log.debug("schema has no ZIL mechanism: %s", exc)
            mech = None

        # build once so configuration errors surface at construction
        prototypes = {name: state_mod.build_state(q, schema) for name, q in queries.items()}
        from ingest import _decode_kernel

        _decode_kernel.warm()  # compile or load decode_many's compiled pass now, not on the first poll

        def new_states() -> dict:
            return {name: state_mod.build_state(q, schema) for name, q in queries.items()}

        def restore_state(name: str, blob: bytes):
            q = queries[name]
            restore = getattr(state_mod, "state_from_bytes", None)
            if restore is not None:
                return restore(blob, q, schema)
            return type(prototypes[name]).from_bytes(blob, q, schema)

        sd_double = None if mech is None else np.sqrt(mech.zero_prob * mech.noise_variance)

        def double_many(batch: ReportBatch, records: list, counts: list[int]) -> np.ndarray:
            # X̃₂ = X̃₁ + sqrt(δ·noise_variance)·sqrt(W)·G: zil.double's S′ ~ SL_d(δλ² diag(range²))
            # with each record's draws from its own stream (independent of the batching)
            x1 = batch.numeric
            if mech is None or x1.shape[1] == 0 or batch.n == 0:
                return x1.copy()
            return state_mod.double_records(records, counts, x1, sd_double)

        def double(batch: ReportBatch, record: bytes) -> np.ndarray:
            return double_many(batch, [record], [batch.n])

        return cls(
            name=_config_pipeline_name(config),
            fingerprint=fp,
            decode=lambda data: codec.decode(data, known),
            decode_many=lambda values: codec.decode_many(values, known),
            double_many=double_many,
            new_states=new_states,
            restore_state=restore_state,
            double=double,
            queries=queries,
            schema=schema,
        )

    def __repr__(self) -> str:
        return f"PipelineRuntime(name={self.name!r}, queries={list(self.queries)})"


def _config_schema(config):
    for attr in ("telemetry_schema", "load_schema"):
        obj = getattr(config, attr, None)
        if callable(obj):
            return obj()
        if obj is not None:
            return obj
    pipe = getattr(config, "pipeline", None)
    schema = (getattr(config, "schema", None) or getattr(pipe, "schema", None)
              or getattr(pipe, "schema_path", None))
    if schema is None:
        raise ConfigError("pipeline config has no schema")
    if hasattr(schema, "fingerprint"):
        return schema
    from ingest.schema import TelemetrySchema

    return TelemetrySchema.load(schema)


def _config_queries(config) -> dict:
    qs = getattr(config, "queries", None)
    if qs is None:
        raise ConfigError("pipeline config has no queries")
    if isinstance(qs, Mapping):
        return dict(qs)
    return {q.name: q for q in qs}


def _config_pipeline_name(config) -> str:
    pipe = getattr(config, "pipeline", None)
    name = getattr(pipe, "name", None) or getattr(config, "name", None)
    return str(name or "pipeline")


# --------------------------------------------------------------------------------------------------
# batches
# --------------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------------
# per-partition state
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Mark:
    """A partition's ``next_offset`` with its report and record counts at that offset."""

    next_offset: int
    reports: int
    records: int


@dataclass
class PartitionState:
    """The state of one owned reports partition.

    Attributes
    ----------
    partition : int
    next_offset : int
        First offset not folded into ``states``.
    states : dict str → state
        One state per query.
    reports : int
        Reports folded in (all time, restored from the checkpoint).
    records : int
        Records folded in (all time).
    published_offset : int or None
        ``next_offset`` of the last checkpoint of this partition known to be durable (restored
        from, or acknowledged by the broker); ``None``: none yet.
    """

    partition: int
    next_offset: int
    states: dict = field(default_factory=dict)
    reports: int = 0
    records: int = 0
    published_offset: int | None = None

    @property
    def dirty(self) -> bool:
        """Whether the durable checkpoint is behind ``next_offset`` (or there is none)."""
        return self.next_offset != self.published_offset

    def mark(self) -> _Mark:
        """Where the partition stands now: ``next_offset`` and the counts that go with it."""
        return _Mark(self.next_offset, self.reports, self.records)

    def to_checkpoint(self, runtime: PipelineRuntime, mark: _Mark | None = None) -> Checkpoint:
        """Serialize into a :class:`Checkpoint` of ``runtime``'s pipeline: the states with
        ``mark``'s offset and counts (default: :meth:`mark` now). The caller makes sure the states
        hold exactly the records below ``mark.next_offset`` (the update thread, in order)."""
        m = self.mark() if mark is None else mark
        return Checkpoint(
            pipeline=runtime.name, partition=self.partition, next_offset=m.next_offset,
            reports=m.reports, records=m.records, fingerprint=runtime.fingerprint,
            states={name: st.to_bytes() for name, st in self.states.items()}, created=time.time(),
        )

    def __repr__(self) -> str:
        return (f"PartitionState(partition={self.partition}, next_offset={self.next_offset}, "
                f"reports={self.reports}, queries={list(self.states)})")


# --------------------------------------------------------------------------------------------------
# the worker
# --------------------------------------------------------------------------------------------------
def _listener_base():
    from kafka import ConsumerRebalanceListener

    return ConsumerRebalanceListener


class _Listener(_listener_base()):
    """Rebalance listener; runs on kafka-python's network loop, so it only does short work."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def on_partitions_assigned(self, assigned) -> None:
        self.worker._on_assigned(assigned)

    def on_partitions_revoked(self, revoked) -> None:
        self.worker._on_revoked(revoked)

    def on_partitions_lost(self, lost) -> None:
        self.worker._on_lost(lost)


class Worker:
    """Exactly-once consumer-group worker over one reports topic (DESIGN §5).

    Parameters
    ----------
    runtime : PipelineRuntime
        Decoder, doubling and state builders of the pipeline.
    client_config : mapping
        kafka-python client settings shared by the consumer and producers (at least
        ``bootstrap_servers``; e.g. ``KafkaSettings.consumer_config()``). Group-timing settings
        (``FAST_GROUP_SETTINGS``) go here too.
    reports_topic, state_topic, dead_letter_topic : str
        Topic names.
    group_id : str
        Consumer group.
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
        acknowledgement. A poll that returned
        ``max_poll_records`` records is folded in the main thread: kafka-python still holds
        records, so the next poll does not wait for the network, and many small records would
        otherwise cost GIL hand-offs between the two threads. Returning to
        ``poll`` at once matters because kafka-python 3.0 sends the next fetch request only when
        ``poll`` is called again if the previous call had to wait for its records; folding in the
        main thread delayed every fetch by the fold's time (docs/benchmarks.md).
    metrics : WorkerMetrics or None
        ``None`` creates one with a private registry.
    producer_config : mapping or None
        Extra kafka-python producer settings (``acks`` defaults to ``"all"``).

    Raises
    ------
    ConfigError
        If a parameter is out of range (the message names it).

    Notes
    -----
    Records of the dead-letter topic are at-least-once (a crash after producing them and before
    the next checkpoint re-sends them); states are exactly-once.
    """

    def __init__(self, runtime: PipelineRuntime, client_config: Mapping[str, Any], *,
                 reports_topic: str, state_topic: str, dead_letter_topic: str, group_id: str,
                 checkpoint_interval_s: float = 5.0, checkpoint_reports: int = 100_000,
                 max_record_bytes: int = 16 * 1024 * 1024, coalesce: bool = True,
                 max_poll_records: int = DEFAULT_MAX_POLL_RECORDS, overlap: bool = True,
                 metrics: WorkerMetrics | None = None,
                 producer_config: Mapping[str, Any] | None = None,
                 consumer_config: Mapping[str, Any] | None = None) -> None:
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
        if "bootstrap_servers" not in client_config:
            raise ConfigError("client_config must contain bootstrap_servers")
        self.runtime = runtime
        self.client_config = dict(client_config)
        self.reports_topic = reports_topic
        self.state_topic = state_topic
        self.dead_letter_topic = dead_letter_topic
        self.group_id = group_id
        self.checkpoint_interval_s = float(checkpoint_interval_s)
        self.checkpoint_reports = int(checkpoint_reports)
        self.max_record_bytes = int(max_record_bytes)
        self.coalesce = bool(coalesce)
        self.max_poll_records = int(max_poll_records)
        self.overlap = bool(overlap)
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self.producer_config = {"acks": "all", **dict(producer_config or {})}
        self.consumer_config = dict(consumer_config or {})

        self.owned: dict[int, PartitionState] = {}
        self.processed_reports = 0  # in this process
        self.processed_records = 0
        self._pending: set = set()  # TopicPartitions awaiting restore (paused)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._closing = False
        # an assignment is in force: set when a join completes (assigned), cleared when one starts
        # (revoked, lost) — a close in between sends no LeaveGroup (docs/kafka.md)
        self._stable = False
        #: set by the shutdown when the final checkpoint failed or could not be taken
        self.final_checkpoint_failed = False
        self.owned_at_stop: list[int] = []  # partitions owned when the loop ended (before leaving)
        self._since_ckpt_reports = 0
        self._last_ckpt = time.monotonic()
        self._last_data = time.monotonic()
        self._consumer = None
        self._producer = None
        self._reader: StateTopicReader | None = None
        self._updater: ThreadPoolExecutor | None = None
        self._inflight: deque[Future] = deque()  # guarded by self._lock
        self._folder: ThreadPoolExecutor | None = None
        self._fold_tasks: deque[Future] = deque()  # the fold thread's tasks (main thread only)
        self._ckpt_pending = False  # a checkpoint is being published (until its offsets are committed)
        self._ckpt_inflight: _InFlight | None = None  # run()'s checkpoint awaiting acks (main thread)
        self._failure: BaseException | None = None  # a failed update: no checkpoint may follow

    # ---------------------------------------------------------------------------------- clients
    def _client_kwargs(self, keys_to_drop: tuple[str, ...] = ()) -> dict:
        return {k: v for k, v in self.client_config.items() if k not in keys_to_drop}

    def _start_threads(self) -> None:
        if self.overlap:
            self._updater = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ldp-update")
            self._folder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ldp-fold")

    def _open(self) -> None:
        from kafka import KafkaConsumer, KafkaProducer

        self._start_threads()

        group_keys = ("session_timeout_ms", "heartbeat_interval_ms", "max_poll_interval_ms",
                      "group_id", "enable_auto_commit", "auto_offset_reset", "rebalance_timeout_ms",
                      "max_poll_records", "fetch_max_wait_ms", "client_id")
        producer_only = ("acks", "linger_ms", "batch_size", "compression_type", "max_request_size",
                         "retries", "buffer_memory")
        consumer_common = {k: v for k, v in self.client_config.items() if k not in producer_only}
        self._consumer = KafkaConsumer(
            **{**consumer_common, **self.consumer_config},
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.max_poll_records,
        )
        self._consumer.subscribe([self.reports_topic], listener=_Listener(self))
        plain = {k: v for k, v in self.client_config.items() if k not in group_keys}
        prod = {k: v for k, v in plain.items() if k in ("bootstrap_servers", "security_protocol",
                                                         "sasl_mechanism", "sasl_plain_username",
                                                         "sasl_plain_password", "ssl_cafile",
                                                         "ssl_certfile", "ssl_keyfile", "ssl_password",
                                                         "ssl_check_hostname",
                                                         "request_timeout_ms", "api_version")}
        prod.update(self.producer_config)
        prod.setdefault("max_request_size", max(self.max_record_bytes + 65536, 1048576))
        self._producer = KafkaProducer(**prod)
        reader_cfg = {k: v for k, v in plain.items() if k not in producer_only}
        self._reader = StateTopicReader(
            KafkaConsumer(**reader_cfg, group_id=None, enable_auto_commit=False,
                          auto_offset_reset="earliest"),
            self.state_topic, pipeline=self.runtime.name,
        )

    # -------------------------------------------------------------------------------- callbacks
    def _on_assigned(self, assigned) -> None:
        tps = [tp for tp in assigned if tp.topic == self.reports_topic]
        with self._lock:
            self._stable = True
            self.metrics.rebalances.inc()
            if tps:
                self._consumer.pause(*tps)
                self._pending.update(tps)
        log.info("assigned %s (restore pending)", sorted(tp.partition for tp in tps))

    def _on_revoked(self, revoked) -> None:
        with self._lock:
            self._stable = False  # a (re)join starts
            self.metrics.rebalances.inc()
            parts = [tp.partition for tp in revoked if tp.topic == self.reports_topic]
            self._pending.difference_update(revoked)
            todo = [self.owned[p] for p in parts if p in self.owned]
            if todo and not self._closing:
                # the producer is a separate client: publishing + flushing here is short and safe
                try:
                    self._drain()
                    self._publish(todo)
                except Exception:
                    log.exception("checkpoint on revoke failed; the next owner replays from the last one")
            for p in parts:
                self.owned.pop(p, None)
                if _has_label(self.metrics.lag, str(p)):
                    self.metrics.lag.remove(str(p))
            self.metrics.owned.set(len(self.owned))
        log.info("revoked %s", parts)

    def _on_lost(self, lost) -> None:
        with self._lock:
            self._stable = False
            self.metrics.rebalances.inc()
            self._pending.difference_update(lost)
            for tp in lost:
                self.owned.pop(tp.partition, None)
            self.metrics.owned.set(len(self.owned))
        # the group moved on without this member (a rebalance it missed, e.g. while another member
        # left at shutdown): no checkpoint can be published for them any more, but the last one is
        # durable, so the next owner resumes there — exactly once all the same
        log.warning("lost %s to a rebalance (no checkpoint can follow); their next owner resumes from "
                    "their last published checkpoint, so no report is lost or counted twice",
                    sorted(tp.partition for tp in lost))

    # ---------------------------------------------------------------------------------- restore
    def _restore_pending(self) -> None:
        # a poll still being folded may hold records of a partition restored (and seeked) below
        self._wait_fold()
        with self._lock:
            todo = [tp for tp in self._pending if tp in self._consumer.assignment()]
            self._pending.clear()
        if not todo:
            return
        self._reader.catch_up()
        starts = self._consumer.beginning_offsets(todo)
        for tp in sorted(todo):
            ps = self._restore_partition(tp.partition)
            start = int(starts.get(tp) or 0)
            if ps.next_offset < start:
                gap = start - ps.next_offset
                log.warning("partition %d: offsets [%d, %d) are gone from the log (retention); %d "
                            "records lost, resuming at %d", tp.partition, ps.next_offset, start, gap, start)
                self.metrics.offset_gap.labels(partition=str(tp.partition)).inc(gap)
                ps.next_offset = start
            with self._lock:
                if tp not in self._consumer.assignment():
                    continue
                self.owned[tp.partition] = ps
                self._consumer.seek(tp, ps.next_offset)
                self._consumer.resume(tp)
                self.metrics.owned.set(len(self.owned))
            log.info("partition %d restored: next_offset=%d reports=%d", tp.partition, ps.next_offset,
                     ps.reports)

    def _restore_partition(self, partition: int) -> PartitionState:
        key = checkpoint_key(self.runtime.name, partition)
        raw = self._reader.latest.get(key)
        if raw is not None:
            try:
                ck = Checkpoint.from_bytes(raw)
                if ck.fingerprint != self.runtime.fingerprint:
                    raise CheckpointError("checkpoint was built for another schema fingerprint")
                ck.require_queries(self.runtime.new_states())
                states = {n: self.runtime.restore_state(n, blob) for n, blob in ck.states.items()}
                return PartitionState(partition, ck.next_offset, states, ck.reports, ck.records,
                                      published_offset=ck.next_offset)
            except Exception as exc:  # any corrupt state: rebuild this partition from scratch
                self.metrics.state_invalid.inc()
                log.error("state record %r (offset %s) cannot be restored with this config (%s); "
                          "rebuilding partition %d from the earliest offset (if the queries were "
                          "edited, this is expected: docs/deploy.md, \"Changing the queries\")",
                          key, self._reader.offsets.get(key), exc, partition)
        return PartitionState(partition, 0, self.runtime.new_states(), 0, 0)  # dirty: none published

    # ------------------------------------------------------------------------------- processing
    def _dead_letter(self, rec, reason: str) -> None:
        headers = [("reason", reason.encode()), ("source_topic", rec.topic.encode()),
                   ("source_partition", str(rec.partition).encode()),
                   ("source_offset", str(rec.offset).encode())]
        value = rec.value or b""
        if len(value) > self.max_record_bytes:
            # an oversized record would exceed the producer's max_request_size and crash the worker
            # on every restart: dead-letter its first max_record_bytes bytes and the original size
            headers.append(("truncated_from", str(len(value)).encode()))
            value = value[:self.max_record_bytes]
        self._producer.send(self.dead_letter_topic, key=rec.key, value=value, headers=headers)
        self.metrics.dead_lettered.labels(reason=reason).inc()
        log.warning("record %s/%d@%d dead-lettered: %s", rec.topic, rec.partition, rec.offset, reason)

    def _process(self, partition: int, records: list) -> int:
        ps = self.owned.get(partition)
        if ps is None:
            return 0  # not restored yet (or revoked): the records will be fetched again
        if self.coalesce and records and records[0].offset == ps.next_offset \
                and records[-1].offset == ps.next_offset + len(records) - 1:
            # the usual poll: the next offsets, no gap, no duplicate (offsets increase)
            n_reports = self._fold_contiguous(ps, records)
            if n_reports is not None:
                self.metrics.last_processed.set(time.time())
                return n_reports
        todo = []  # (record, reason it is refused before decoding or None), in offset order
        n_reports = 0
        for rec in records:
            if rec.offset < ps.next_offset:
                self.metrics.duplicates.inc()
                continue
            if rec.offset > ps.next_offset:
                gap = rec.offset - ps.next_offset
                log.warning("partition %d: offsets [%d, %d) missing from the log", partition,
                            ps.next_offset, rec.offset)
                self.metrics.offset_gap.labels(partition=str(partition)).inc(gap)
            ps.next_offset = rec.offset + 1
            value = rec.value
            refused = ("empty" if value is None
                       else "oversized" if len(value) > self.max_record_bytes else None)
            todo.append((rec, refused))
            if not self.coalesce:
                n_reports += self._fold(ps, todo)
                todo = []
        if todo:
            n_reports += self._fold(ps, todo)
        if n_reports or records:
            self.metrics.last_processed.set(time.time())
        return n_reports

    def _fold_contiguous(self, ps: PartitionState, records: list) -> int | None:
        """:meth:`_fold` of records that follow ``next_offset`` without a gap, without a per-record
        Python loop; ``None`` (nothing done) unless every record is present, within
        ``max_record_bytes`` and decodes."""
        values = [rec.value for rec in records]
        if None in values or max(map(len, values)) > self.max_record_bytes:
            return None
        batch, results = self.runtime.decode_many(values)
        if batch is None or batch.fingerprint != self.runtime.fingerprint \
                or not all(type(r) is int for r in results):
            return None  # decode again in _fold, which dead-letters what fails
        ps.next_offset = records[-1].offset + 1
        return self._fold_decoded(ps, batch, values, results)

    def _fold(self, ps: PartitionState, todo: list) -> int:
        """Decode the records of ``todo`` as one batch, dead-letter the refused and undecodable
        ones (in offset order), double each record's rows with its own seed and hand the batch to
        :meth:`_update`; returns its report count."""
        values = [rec.value for rec, refused in todo if refused is None]
        batch, results = self.runtime.decode_many(values) if values else (None, [])
        if batch is not None and batch.fingerprint != self.runtime.fingerprint:
            results = [_Rejected("unknown_fingerprint") if isinstance(r, int) else r for r in results]
            batch = None
        decoded = iter(results)
        good, counts = [], []
        for rec, refused in todo:
            res = _Rejected(refused) if refused is not None else next(decoded)
            if isinstance(res, int):
                good.append(rec.value)
                counts.append(res)
            else:
                self._dead_letter(rec, getattr(res, "reason", "malformed"))
        if batch is None or not good:
            return 0
        return self._fold_decoded(ps, batch, good, counts)

    def _fold_decoded(self, ps: PartitionState, batch: ReportBatch, values: list, counts: list) -> int:
        """Double each record's rows of ``batch`` with its own seed, hand them to :meth:`_update`
        and count them; returns the batch's report count."""
        x2 = self.runtime.double_many(batch, values, counts)
        self._update(ps, batch, x2)
        ps.records += len(values)
        ps.reports += batch.n
        self.metrics.records.inc(len(values))
        self.metrics.reports.inc(batch.n)
        return batch.n

    def _update(self, ps: PartitionState, batch: ReportBatch, x2: np.ndarray) -> None:
        """Fold a batch into the partition's states: inline, or on the update thread with at most
        one update in flight (the caller holds ``self._lock``)."""
        if self._failure is not None:
            raise self._failure
        if self._updater is None:
            self._apply(ps.states, batch, x2)
            return
        self._inflight.append(self._updater.submit(self._apply, ps.states, batch, x2))
        while len(self._inflight) > 1:
            self._wait_one()

    def _apply(self, states: dict, batch: ReportBatch, x2: np.ndarray) -> None:
        try:
            for st in states.values():
                st.update(batch, x2)
        except BaseException as exc:
            # offsets already moved past this batch: publishing any later checkpoint would lose
            # it, so the worker must stop without one (its restart replays from the last)
            self._failure = exc
            raise

    def _wait_one(self) -> None:
        self._inflight.popleft().result()

    def _drain(self) -> None:
        """Wait until every submitted update is folded in (re-raising a failed one)."""
        while self._inflight:
            self._wait_one()
        if self._failure is not None:
            raise self._failure

    # ------------------------------------------------------------------------------ checkpoints
    def _publish(self, parts: list[PartitionState]) -> dict:
        """Send the checkpoints of ``parts`` and flush; returns the offsets to commit.

        Only the producer (a separate client) is used, so this is safe inside the rebalance
        callback and under ``self._lock``.
        """
        return self._settle(self._send([(ps, ps.mark()) for ps in parts]))

    def _send(self, marked: list[tuple[PartitionState, _Mark]]) -> list[tuple]:
        """Send the checkpoint of each ``(partition state, mark)``: its states with the mark's
        offset and counts (the caller makes sure the states hold exactly the records below it:
        under ``self._lock`` after :meth:`_drain`, or on the update thread); returns
        ``[(partition state, next_offset sent, send future)]`` for :meth:`_settle`."""
        if marked and self._failure is not None:
            raise AggregatorError(f"a state update failed ({self._failure!r}); no checkpoint is published "
                                  "after it") from self._failure
        sent = []
        for ps, mark in marked:
            ck = ps.to_checkpoint(self.runtime, mark)
            sent.append((ps, ck.next_offset,
                         self._producer.send(self.state_topic, key=ck.key, value=ck.to_bytes())))
        return sent

    def _settle(self, sent: list[tuple], flush: bool = True) -> dict:
        """Wait for the checkpoints :meth:`_send` sent (``flush``: flush the producer first; without,
        every future must be done) and return the offsets to commit; raises the send error of a
        refused record. Lock not needed: only the producer is used."""
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        if not sent:
            return {}
        if flush:
            self._producer.flush(timeout=30)
        for _, _, f in sent:  # flush() does not raise for a failed record: its future does
            f.get(timeout=1)
        # the state is durable: only now may the group offsets move
        for ps, offset, _ in sent:
            if ps.published_offset is None or offset > ps.published_offset:
                ps.published_offset = offset
        self.metrics.checkpoints.inc(len(sent))
        return {TopicPartition(self.reports_topic, ps.partition): OffsetAndMetadata(offset, "", -1)
                for ps, offset, _ in sent}

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
        """
        self._wait_fold()  # never under self._lock: the fold holds it while it runs
        self._check_checkpoint(block=True)
        published = self._publish_due(force)
        self._commit(published)
        return published.partitions

    def _publish_due(self, force: bool = False) -> _Published:
        """Wait for the updates in flight, then publish the checkpoints of the changed (``force``:
        all) owned partitions and flush (outside ``self._lock``); the offsets are committed by
        :meth:`_commit`. The synchronous checkpoint: :meth:`checkpoint`, and :meth:`run` without
        ``overlap`` (with ``overlap``, :meth:`_begin_checkpoint`)."""
        t0 = time.perf_counter()
        with self._lock:
            self._drain()
            sent = self._send([(ps, ps.mark()) for ps in self.owned.values() if force or ps.dirty])
        # the flush outside the lock: a rebalance callback waiting for it would hold up
        # kafka-python's network loop (heartbeats); a revoke's own checkpoint of the same partition
        # goes through the same producer after these records and is flushed by the callback
        offsets = self._settle(sent)
        self._since_ckpt_reports = 0
        self._last_ckpt = time.monotonic()
        return _Published(offsets, len(sent), t0, time.perf_counter())

    def _publish_due_or_broker_error(self) -> _Published | KafkaError:
        """:meth:`_publish_due` for :meth:`run` without ``overlap``; a broker error is returned
        for :meth:`_published` (the state stays in memory and is published later), anything else
        raised."""
        try:
            return self._publish_due()
        except KafkaError as exc:
            return exc

    def _begin_checkpoint(self) -> _InFlight | _Published:
        """A checkpoint of :meth:`run` with ``overlap``, on the fold thread after the folds before
        it: mark where each changed owned partition stands and queue the checkpoints' snapshot
        (:meth:`_snapshot`) on the update thread, behind the updates of those folds. Returns at
        once — the fold thread goes on with the next poll while the update thread catches up —
        with the snapshot's future; the main thread commits the offsets once the broker has
        acknowledged every record (:meth:`_check_checkpoint`)."""
        t0 = time.perf_counter()
        with self._lock:
            if self._failure is not None:
                raise self._failure
            marked = [(ps, ps.mark()) for ps in self.owned.values() if ps.dirty]
            self._since_ckpt_reports = 0
            self._last_ckpt = time.monotonic()
            if not marked:
                return _Published({}, 0, t0, time.perf_counter())
            # in _inflight: a revoke's (or the shutdown's) drain waits for it, so that its own
            # checkpoint of a partition is sent after this one
            snapshot = self._updater.submit(self._snapshot, marked)
            self._inflight.append(snapshot)
        return _InFlight(snapshot, t0)

    def _snapshot(self, marked: list[tuple[PartitionState, _Mark]]) -> list[tuple] | Exception:
        """Update thread: :meth:`_send` the marked checkpoints (their states now hold exactly the
        records below their marks: the updates before this task, and none after) of the
        partitions still owned by the same state — a revoke drains this task before it drops its
        partitions, a loss does not, and a lost partition's checkpoint must not be sent after its
        next owner's. An error of ``send`` (a broker error, e.g. no metadata within
        ``max_block_ms``, or anything else) is returned, not raised: the fold thread's waits for
        the update thread's tasks would take it for a failed update;
        :meth:`_check_checkpoint` retries the first and raises the rest."""
        if self._failure is not None:
            raise self._failure
        try:
            return self._send([(ps, m) for ps, m in marked if self.owned.get(ps.partition) is ps])
        except Exception as exc:
            return exc

    def _check_checkpoint(self, block: bool) -> None:
        """Main thread: finish the checkpoint :meth:`_begin_checkpoint` started once its records are
        acknowledged (``block``: wait for them) — commit its offsets, or after a broker error back
        off (nothing committed, its partitions stay dirty). A failed update is raised."""
        fl = self._ckpt_inflight
        if fl is None or not (block or fl.acknowledged()):
            return
        self._ckpt_inflight = None
        sent = fl.snapshot.result()  # raises only a failed update or fold (no checkpoint after it)
        if isinstance(sent, KafkaError):  # send refused: retried once the next one falls due
            self._published(sent)
            return
        if isinstance(sent, Exception):
            raise sent
        try:
            offsets = self._settle(sent, flush=block)
        except KafkaError as exc:  # a record refused by the broker
            self._published(exc)
            return
        # a partition revoked or lost meanwhile: its next owner commits (committing this older
        # offset would move the group's offset back)
        owned = {ps.partition for ps, _, _ in sent if self.owned.get(ps.partition) is ps}
        offsets = {tp: om for tp, om in offsets.items() if tp.partition in owned}
        self._published(_Published(offsets, len(offsets), fl.started, time.perf_counter()))

    def _commit(self, published: _Published) -> None:
        """Commit the offsets of published checkpoints (main thread: the consumer is not
        thread-safe) and record the checkpoint's duration."""
        if published.offsets:
            # outside the lock: commit runs on the consumer's network loop, which also runs the
            # rebalance callbacks that take the lock
            t0 = time.perf_counter()
            try:
                self._consumer.commit(published.offsets)
            except Exception as exc:  # committed offsets are advisory: positions come from checkpoints
                log.warning("offset commit failed (%s); checkpoints are already durable", exc)
            # publish + commit, without the wait between them (the fold thread's queue)
            self.metrics.checkpoint_duration.observe(published.published - published.started
                                                     + time.perf_counter() - t0)

    # -------------------------------------------------------------------------------- main loop
    def stop(self) -> None:
        """Ask the main loop to finish: final checkpoint, then ``consumer.close()``.

        Safe to call from a signal handler or another thread.
        """
        self._stop.set()

    def _update_lag(self) -> None:
        from kafka import TopicPartition

        total = 0
        for p, ps in list(self.owned.items()):
            hw = self._consumer.highwater(TopicPartition(self.reports_topic, p))
            if hw is not None:
                lag = max(0, int(hw) - ps.next_offset)
                total += lag
                self.metrics.lag.labels(partition=str(p)).set(lag)
        self._total_lag = total

    def caught_up(self) -> bool:
        """Whether the worker owns partitions, none awaits restore, and every owned partition's
        ``next_offset`` has reached the fetch high watermark."""
        from kafka import TopicPartition

        with self._lock:
            if self._pending or not self.owned:
                return False
            for p, ps in self.owned.items():
                hw = self._consumer.highwater(TopicPartition(self.reports_topic, p))
                if hw is None or ps.next_offset < hw:
                    return False
            return True

    def run(self, max_reports: int | None = None, exit_when_idle: float | None = None,
            poll_timeout_ms: int = 200) -> int:
        """Consume until :meth:`stop`, ``max_reports`` reports, or ``exit_when_idle`` seconds with
        nothing left to read.

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
        self._open()
        self._last_data = time.monotonic()
        try:
            while not self._stop.is_set():
                if self._pending:
                    self._restore_pending()
                try:
                    got = self._consumer.poll(timeout_ms=poll_timeout_ms, max_records=self.max_poll_records)
                except KafkaError as exc:  # broker gone or restarting: keep the state, retry
                    self._broker_trouble("poll", exc)
                    continue
                self._collect_fold(block=False)
                self._check_checkpoint(block=False)
                n_got = sum(len(recs) for tp, recs in got.items() if tp.topic == self.reports_topic)
                if n_got:
                    self._last_data = time.monotonic()
                    if self._folder is None:
                        self._fold_poll_locked(got)
                    elif n_got >= self.max_poll_records:
                        # a poll capped at max_records leaves records buffered in kafka-python: the
                        # next poll does not wait for the network, so folding here costs no fetch
                        # time and saves the GIL hand-offs of the fold thread (many small records)
                        self._wait_fold()
                        self._fold_poll_locked(got)
                    else:
                        self._wait_fold()  # one poll folded while the next is fetched
                        self._fold_tasks.append(self._folder.submit(self._fold_poll_locked, got))
                self._update_lag()
                due = (self._since_ckpt_reports >= self.checkpoint_reports
                       or time.monotonic() - self._last_ckpt >= self.checkpoint_interval_s)
                if due and self._folder is None:
                    self._published(self._publish_due_or_broker_error())
                elif due and not self._ckpt_pending:  # begun on the fold thread after the fold
                    self._ckpt_pending = True  # above, committed here once acknowledged
                    self._fold_tasks.append(self._folder.submit(self._begin_checkpoint))
                if max_reports is not None and self.processed_reports >= max_reports:
                    log.info("processed %d reports (max %d): stopping", self.processed_reports, max_reports)
                    break
                if (exit_when_idle is not None and time.monotonic() - self._last_data >= exit_when_idle
                        and self.caught_up()):
                    log.info("idle for %.1f s and caught up: stopping", exit_when_idle)
                    break
        finally:
            self._shutdown()
        return self.processed_reports

    def _fold_poll(self, got: Mapping) -> None:
        """Fold the records of one ``poll`` result (``{TopicPartition: [ConsumerRecord]}``) into
        their partitions' states and count them (the caller holds ``self._lock``)."""
        for tp, recs in got.items():
            if tp.topic == self.reports_topic:
                r = self._process(tp.partition, recs)
                self.processed_reports += r
                self._since_ckpt_reports += r
                self.processed_records += len(recs)

    def _fold_poll_locked(self, got: Mapping) -> None:
        """:meth:`_fold_poll` under ``self._lock`` (on the ``ldp-fold`` thread, or inline without
        overlap). A failure stops checkpoints as a failed update does: offsets may already have
        moved past records that are not in the states."""
        with self._lock:  # the failure is recorded before a rebalance callback can publish
            try:
                self._fold_poll(got)
            except BaseException as exc:
                if self._failure is None:
                    self._failure = exc
                raise

    def _wait_fold(self) -> None:
        """Wait until the tasks handed to the ``ldp-fold`` thread are done — a poll's fold
        (re-raising its failure), a checkpoint's start (:meth:`_begin_checkpoint`, which returns
        without waiting for its records); called by the main thread only, never under
        ``self._lock``."""
        self._collect_fold(block=True)

    def _collect_fold(self, block: bool) -> None:
        """Handle the fold thread's tasks in order: all of them (``block``), or those already done
        (each turn of the main loop, so that an idle worker still commits and retries)."""
        while self._fold_tasks and (block or self._fold_tasks[0].done()):
            out = self._fold_tasks.popleft().result()
            if isinstance(out, _InFlight):  # a checkpoint begun: its records are on their way
                self._ckpt_inflight = out
            elif out is not None:  # a checkpoint with nothing to publish (a fold returns None)
                self._published(out)

    def _published(self, out: _Published | KafkaError) -> None:
        """Main thread, after :meth:`_publish_due_or_broker_error`: commit the offsets, or back
        off after a broker error (nothing committed: the state stays in memory, retried once the
        next checkpoint falls due)."""
        self._ckpt_pending = False
        if isinstance(out, KafkaError):
            self._broker_trouble("checkpoint", out)
            self._last_ckpt = time.monotonic()
        else:
            self._commit(out)

    def _broker_trouble(self, what: str, exc: Exception) -> None:
        """Log a broker error of the main loop (at most every 10 s) and back off for a second."""
        now = time.monotonic()
        if now - getattr(self, "_last_trouble_log", 0.0) > 10:
            log.warning("%s failed (%s: %s); keeping state in memory and retrying",
                        what, type(exc).__name__, exc)
            self._last_trouble_log = now
        self._stop.wait(1.0)

    def _shutdown(self) -> None:
        self.owned_at_stop = sorted(self.owned)
        try:
            if self._failure is not None:
                self.final_checkpoint_failed = True
                log.error("no final checkpoint: a state update failed (%r); the next start replays "
                          "from the last checkpoint", self._failure)
            elif self._consumer is not None and self._producer is not None:
                self.checkpoint()
        except Exception:
            self.final_checkpoint_failed = True
            log.exception("final checkpoint failed; the next start replays from the last checkpoint")
        for attr in ("_folder", "_updater"):  # the fold thread first: it submits updates
            pool = getattr(self, attr)
            if pool is not None:
                pool.shutdown(wait=True)
                setattr(self, attr, None)
        self._closing = True
        ms = int(CLOSE_TIMEOUT_S * 1000)  # bounded closes: a hung broker must not hang the stop
        for client in (self._consumer, self._producer):
            if client is not None:
                try:
                    if client is self._producer:
                        client.close(timeout=CLOSE_TIMEOUT_S)
                    elif self._stable:
                        client.close(timeout_ms=ms)
                    else:  # stopped during a group join: leave by disconnecting (docs/kafka.md)
                        log.info("stopped during a group join: closing without LeaveGroup")
                        close_without_leaving(client, timeout_ms=ms)
                except Exception:
                    log.debug("closing client failed", exc_info=True)
        if self._reader is not None:
            self._reader.close()

    def __repr__(self) -> str:
        try:
            return (f"Worker(pipeline={self.runtime.name!r}, group={self.group_id!r}, "
                    f"owned={sorted(self.owned)}, reports={self.processed_reports})")
        except Exception:  # pragma: no cover - repr never raises
            return "Worker(?)"


@dataclass(frozen=True)
class _Published:
    """Checkpoints published and flushed: the offsets to commit, how many partitions, and when
    publishing started and ended (``time.perf_counter``)."""

    offsets: dict
    partitions: int
    started: float
    published: float


@dataclass(frozen=True)
class _InFlight:
    """A checkpoint :meth:`Worker._begin_checkpoint` queued: the update thread's snapshot (its
    result: ``[(partition state, next_offset, send future)]``) and when it began
    (``time.perf_counter``)."""

    snapshot: Future
    started: float

    def acknowledged(self) -> bool:
        """Whether the snapshot ran and the broker answered for each of its records (or the
        snapshot failed): :meth:`Worker._check_checkpoint` can finish it without waiting."""
        if not self.snapshot.done():
            return False
        if self.snapshot.exception() is not None or isinstance(self.snapshot.result(), Exception):
            return True
        return all(f.is_done for _, _, f in self.snapshot.result())


class _Rejected(AggregatorError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _has_label(metric, value: str) -> bool:
    try:
        return (value,) in metric._metrics  # prometheus_client keeps children by label tuple
    except AttributeError:
        return False


# --------------------------------------------------------------------------------------------------
# configuration helpers shared by the work / serve / analyze commands
# --------------------------------------------------------------------------------------------------
_DEFAULT_FAST_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000,
                       "max_poll_interval_ms": 10000}


def client_config(config) -> dict:
    """kafka-python settings common to every client of a pipeline (``[kafka]`` section).

    Uses ``KafkaSettings.consumer_config()`` when :mod:`ingest.kafka` provides it (group-specific
    keys removed), else the raw ``[kafka]`` mapping.

    Raises
    ------
    ConfigError
        If no ``bootstrap_servers`` is configured.
    """
    kafka = getattr(config, "kafka", None) or {}
    if hasattr(kafka, "consumer_config"):
        cfg = dict(kafka.consumer_config())
    elif hasattr(kafka, "model_dump"):
        cfg = dict(kafka.model_dump(exclude_none=True))
    else:
        cfg = dict(kafka)
    for k in ("group_id", "enable_auto_commit", "auto_offset_reset", "max_poll_records",
              *_DEFAULT_FAST_GROUP):
        cfg.pop(k, None)
    if not cfg.get("bootstrap_servers"):
        raise ConfigError("kafka.bootstrap_servers: required (e.g. \"127.0.0.1:9092\")")
    return cfg


def fast_group_settings() -> dict:
    """``ingest.kafka.FAST_GROUP_SETTINGS`` (session 6 s, heartbeat 1 s, max poll 10 s)."""
    try:
        from ingest.kafka import FAST_GROUP_SETTINGS
    except ImportError:
        return dict(_DEFAULT_FAST_GROUP)
    return dict(FAST_GROUP_SETTINGS)


def ensure_topics(config) -> None:
    """Create the pipeline's reports (``topics.partitions``), state and dead-letter topics if
    missing. The state topic is created with ``cleanup.policy=compact`` where the broker allows.
    """
    topics = config.topics
    try:
        from ingest.kafka import ensure_topic
    except ImportError:
        ensure_topic = None
    if ensure_topic is not None:
        settings = config.kafka
        ensure_topic(settings, topics.reports, topics.partitions)
        try:  # one checkpoint per key is all a reader needs: let the broker compact the state topic
            ensure_topic(settings, topics.state, 1, {"cleanup.policy": "compact"})
        except Exception as exc:
            log.info("state topic with cleanup.policy=compact refused (%s); creating it plain", exc)
            ensure_topic(settings, topics.state, 1)
        ensure_topic(settings, topics.dead_letter, 1)
        return
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=client_config(config)["bootstrap_servers"])
    try:
        existing = set(admin.list_topics())
        for name, parts in ((topics.reports, topics.partitions), (topics.state, 1), (topics.dead_letter, 1)):
            if name in existing:
                continue
            try:
                admin.create_topics([NewTopic(name, parts, 1)])
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()


def worker_from_config(config, *, group_id: str | None = None, metrics: WorkerMetrics | None = None,
                       coalesce: bool = True, max_poll_records: int = DEFAULT_MAX_POLL_RECORDS,
                       overlap: bool = True) -> Worker:
    """Build a :class:`Worker` from a :class:`aggregator.config.PipelineConfig`.

    Also applies ``[worker] malloc_trim_threshold_mib`` to this process's allocator
    (:func:`ingest.kafka.keep_freed_memory`): the consumer's fetch buffers are then reused rather
    than page-faulted in again for every fetch response.

    Raises
    ------
    ConfigError
        On any invalid setting (propagated).
    """
    from ingest.kafka import keep_freed_memory

    runtime = PipelineRuntime.from_config(config)
    w = config.worker
    keep_freed_memory(w.malloc_trim_threshold_mib << 20)
    return Worker(
        runtime, client_config(config),
        reports_topic=config.topics.reports, state_topic=config.topics.state,
        dead_letter_topic=config.topics.dead_letter, group_id=group_id or w.group_id,
        checkpoint_interval_s=w.checkpoint_interval_s, checkpoint_reports=w.checkpoint_reports,
        max_record_bytes=w.max_record_bytes, coalesce=coalesce, max_poll_records=max_poll_records,
        overlap=overlap,
        metrics=metrics, consumer_config=fast_group_settings(),
    )
