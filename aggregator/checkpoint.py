"""Checkpoint blobs and the state-topic reader (docs/reliability.md §1, exactly-once without
transactions).

A *checkpoint* is the complete state of one partition of the reports topic: the serialized
state of every query, the number of reports folded in, and ``next_offset`` — the first offset of
the reports partition that is **not** yet in the state. Because state and offset travel in one
record, every checkpoint is self-consistent: restoring any of them and seeking to its
``next_offset`` continues the stream without loss or double counting.

Wire layout of one checkpoint (the value of one state-topic record)::

    magic  b"LDPC"                       4 bytes
    format version                       uint16 big-endian (currently 2)
    header length H                      uint32 big-endian
    header                               H bytes of UTF-8 JSON (sorted keys)
    state blobs                          concatenated, lengths given in the header

The record key is ``"<pipeline>/<partition>"`` (UTF-8), so a compacted state topic keeps exactly
one checkpoint per partition.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from aggregator.errors import CheckpointError, StateError
from ingest.kafka.clients import read_to_end, reader_client
from ingest.kafka.settings import CLOSE_TIMEOUT_S, KafkaSettings

__all__ = [
    "CHECKPOINT_MAGIC",
    "CHECKPOINT_VERSION",
    "RETIRED_VERSIONS",
    "Checkpoint",
    "CheckpointError",
    "StateTopicReader",
    "checkpoint_key",
    "pane_key",
    "parse_checkpoint_key",
    "parse_state_key",
]

log = logging.getLogger(__name__)

CHECKPOINT_MAGIC = b"LDPC"
CHECKPOINT_VERSION = 2
#: Format versions this code refuses with a reason (the worker then rebuilds the partition from
#: the earliest retained report, as for a changed query).
RETIRED_VERSIONS = {
    1: "it holds averaged-SGD regression states, which renewable estimation replaced",
}
_PREFIX = struct.Struct(">4sHI")
_MAX_HEADER = 16 * 1024 * 1024


def checkpoint_key(pipeline: str, partition: int) -> bytes:
    """Return the state-topic key ``b"<pipeline>/<partition>"``.

    Parameters
    ----------
    pipeline : str
        Pipeline (query-set) name; must be non-empty and must not contain ``/``.
    partition : int
        Reports-topic partition, ≥ 0.

    Raises
    ------
    CheckpointError
        If ``pipeline`` is empty or contains ``/``, or ``partition < 0``.
    """
    if not pipeline or "/" in pipeline:
        raise CheckpointError(f"pipeline must be a non-empty name without '/', got {pipeline!r}")
    if int(partition) < 0:
        raise CheckpointError(f"partition must be >= 0, got {partition}")
    return f"{pipeline}/{int(partition)}".encode()


def parse_checkpoint_key(key: bytes | None) -> tuple[str, int]:
    """Inverse of :func:`checkpoint_key`; raises :class:`CheckpointError` on any other key
    (a pane key of :func:`pane_key` included)."""
    pipeline, partition, query, _ = parse_state_key(key)
    if query is not None:
        raise CheckpointError(f"state-topic key {key!r} is a window pane's, not '<pipeline>/<partition>'")
    return pipeline, partition


def pane_key(pipeline: str, partition: int, query: str, start: int) -> bytes:
    """State-topic key of a closed window pane: ``b"<pipeline>/<partition>/<query>/<start>"``
    (``start``: the pane's start, Unix seconds; docs/windows.md §3).

    Raises
    ------
    CheckpointError
        As :func:`checkpoint_key`, or if ``query`` is empty or contains ``/``.
    """
    if not query or "/" in query:
        raise CheckpointError(f"query must be a non-empty name without '/', got {query!r}")
    return checkpoint_key(pipeline, partition) + f"/{query}/{int(start)}".encode()


def parse_state_key(key: bytes | None) -> tuple[str, int, str | None, int | None]:
    """``(pipeline, partition, query, start)`` of a checkpoint key (``query`` and ``start`` None)
    or of a pane key.

    Raises
    ------
    CheckpointError
        If ``key`` is neither.
    """
    try:
        parts = (key or b"").decode().split("/")
        if len(parts) not in (2, 4) or not parts[0] or not parts[1].isdigit():
            raise ValueError
        if len(parts) == 2:
            return parts[0], int(parts[1]), None, None
        if not parts[2] or not parts[3].lstrip("-").isdigit():
            raise ValueError
        return parts[0], int(parts[1]), parts[2], int(parts[3])
    except ValueError:
        raise CheckpointError(f"state-topic key {key!r} is not '<pipeline>/<partition>' nor "
                              "'<pipeline>/<partition>/<query>/<pane start>'") from None


@dataclass(frozen=True)
class Checkpoint:
    """The state of one reports partition at one offset.

    Attributes
    ----------
    pipeline : str
        Pipeline (query-set) name; the key prefix.
    partition : int
        Reports-topic partition.
    next_offset : int
        First reports-topic offset not folded into ``states`` (≥ 0).
    reports : int
        Number of reports (not records) folded into the states.
    records : int
        Number of reports-topic records folded in (dead-lettered ones excluded).
    fingerprint : bytes
        16-byte schema fingerprint the states were built with.
    states : mapping str → bytes
        ``state.to_bytes()`` per query name.
    created : float
        Wall-clock time of the checkpoint (Unix seconds); informational only.
    version : int
        Format version (:data:`CHECKPOINT_VERSION`).

    Source: docs/reliability.md §1.1; the layout: docs/wire-format.md §6.
    """

    pipeline: str
    partition: int
    next_offset: int
    reports: int
    fingerprint: bytes
    states: Mapping[str, bytes] = field(default_factory=dict)
    records: int = 0
    created: float = 0.0
    version: int = CHECKPOINT_VERSION

    @property
    def key(self) -> bytes:
        """State-topic key of this checkpoint."""
        return checkpoint_key(self.pipeline, self.partition)

    def to_bytes(self) -> bytes:
        """Serialize to the wire layout described in the module docstring."""
        names = list(self.states)
        header = {
            "pipeline": self.pipeline,
            "partition": int(self.partition),
            "next_offset": int(self.next_offset),
            "reports": int(self.reports),
            "records": int(self.records),
            "fingerprint": bytes(self.fingerprint).hex(),
            "created": float(self.created or time.time()),
            "queries": [[name, len(self.states[name])] for name in names],
        }
        hdr = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        blobs = b"".join(bytes(self.states[name]) for name in names)
        return _PREFIX.pack(CHECKPOINT_MAGIC, CHECKPOINT_VERSION, len(hdr)) + hdr + blobs

    @classmethod
    def from_bytes(cls, data: bytes) -> Checkpoint:
        """Parse a checkpoint blob.

        Raises
        ------
        CheckpointError
            On a wrong magic, an unknown version, a truncated or over-long record, or a header
            with missing or ill-typed fields.
        """
        if data is None or len(data) < _PREFIX.size:
            raise CheckpointError(f"checkpoint too short ({0 if data is None else len(data)} bytes)")
        magic, version, hlen = _PREFIX.unpack_from(data, 0)
        if magic != CHECKPOINT_MAGIC:
            raise CheckpointError(f"bad checkpoint magic {magic!r}")
        if version in RETIRED_VERSIONS:
            raise CheckpointError(f"checkpoint format version {version} is no longer read: "
                                  f"{RETIRED_VERSIONS[version]} (this version writes {CHECKPOINT_VERSION})")
        if version != CHECKPOINT_VERSION:
            raise CheckpointError(f"unsupported checkpoint version {version} (known: {CHECKPOINT_VERSION})")
        if hlen > _MAX_HEADER or _PREFIX.size + hlen > len(data):
            raise CheckpointError("checkpoint header length exceeds the record")
        try:
            header = json.loads(bytes(data[_PREFIX.size : _PREFIX.size + hlen]))
            queries = [(str(q), int(n)) for q, n in header["queries"]]
            fp = bytes.fromhex(header["fingerprint"])
            meta = {
                "pipeline": str(header["pipeline"]),
                "partition": int(header["partition"]),
                "next_offset": int(header["next_offset"]),
                "reports": int(header["reports"]),
                "records": int(header.get("records", 0)),
                "created": float(header.get("created", 0.0)),
            }
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"bad checkpoint header: {exc}") from None
        if meta["next_offset"] < 0 or meta["reports"] < 0 or any(n < 0 for _, n in queries):
            raise CheckpointError("checkpoint header holds a negative count")
        pos = _PREFIX.size + hlen
        states: dict[str, bytes] = {}
        for name, n in queries:
            if pos + n > len(data):
                raise CheckpointError(f"checkpoint truncated inside the state of query {name!r}")
            states[name] = bytes(data[pos : pos + n])
            pos += n
        if pos != len(data):
            raise CheckpointError(f"checkpoint has {len(data) - pos} trailing bytes")
        return cls(fingerprint=fp, states=states, version=version, **meta)

    def require_queries(self, names) -> None:
        """Refuse a checkpoint whose queries are not exactly ``names`` (the config's).

        A query added, removed or renamed in the config makes the checkpoint unusable as a
        whole: its ``next_offset`` is shared by all its queries (docs/deploy.md, "Changing the
        queries"). Workers then rebuild the partition; serve reports why it has no estimate.

        Raises
        ------
        CheckpointError
            ``checkpoint of partition P holds queries [...], the config has [...]``.
        """
        want = sorted(names)
        if sorted(self.states) != want:
            raise CheckpointError(f"checkpoint of partition {self.partition} holds queries "
                                  f"{sorted(self.states)}, the config has {want}")

    def __repr__(self) -> str:
        try:
            return (
                f"Checkpoint(key={self.pipeline}/{self.partition}, next_offset={self.next_offset}, "
                f"reports={self.reports}, queries={list(self.states)})"
            )
        except Exception:  # pragma: no cover - repr never raises
            return "Checkpoint(<unprintable>)"


class StateTopicReader:
    """Keep the latest checkpoint per key of a state topic, reading it to its end on demand.

    A consumer without a group is assigned every partition of the topic and reads from the
    beginning; :meth:`catch_up` polls until each partition's position reaches its end. The end is
    the larger of ``end_offsets()`` taken at the start of the call and the high watermark carried
    by fetch responses (``consumer.highwater``; :func:`ingest.kafka.clients.read_to_end`) — Tansu's
    ``end_offsets`` can be too small (docs/kafka.md §2.2), the fetch high watermark is right;
    tolerating both works on either broker.

    Parameters
    ----------
    consumer : kafka.KafkaConsumer
        A consumer created **without** ``group_id`` (``enable_auto_commit=False``). The reader owns
        it from now on and closes it in :meth:`close`.
    topic : str
        State-topic name.
    pipeline : str or None
        Keep only keys of this pipeline (``None``: every key).
    panes : bool
        With ``pipeline``: also keep its closed window panes (:func:`pane_key`; serve needs
        them, a worker does not). A tombstone (a record without a value) deletes its key.

    Attributes
    ----------
    latest : dict bytes → bytes
        Latest raw value per key (undecoded, so that a decode failure can be handled by the
        caller: rebuild for a worker, skip for serve).
    offsets : dict bytes → int
        State-topic offset of that latest value.

    Raises
    ------
    aggregator.errors.AggregatorError
        From :meth:`catch_up` if the topic has no partitions or the end is not reached in time.

    See Also
    --------
    StateTopicReader.connect : a reader with its own consumer, built from ``KafkaSettings``.
    """

    def __init__(self, consumer, topic: str, pipeline: str | None = None, panes: bool = False) -> None:
        from kafka import TopicPartition

        if not topic:
            raise CheckpointError("topic must be a non-empty topic name")
        self.consumer = consumer
        self.topic = topic
        self.pipeline = pipeline
        self.panes = bool(panes)
        self.latest: dict[bytes, bytes] = {}
        self.offsets: dict[bytes, int] = {}
        self._tp_cls = TopicPartition
        self._tps: list = []
        self.records_read = 0

    @classmethod
    def connect(cls, settings: KafkaSettings, topic: str, pipeline: str | None = None,
                panes: bool = False) -> StateTopicReader:
        """A reader of ``topic`` over a new consumer without a group
        (:func:`ingest.kafka.clients.reader_client`: the TLS/SASL settings of ``settings``)."""
        return cls(reader_client(settings), topic, pipeline, panes)

    def _assign(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        parts = self.consumer.partitions_for_topic(self.topic)
        while not parts and time.monotonic() < deadline:
            time.sleep(0.1)
            parts = self.consumer.partitions_for_topic(self.topic)
        if not parts:
            raise StateError(f"state topic {self.topic!r} has no partitions (does it exist?)")
        tps = sorted(self._tp_cls(self.topic, p) for p in parts)
        if tps != self._tps:
            self.consumer.assign(tps)
            for tp in tps:
                if tp not in self._tps:
                    self.consumer.seek_to_beginning(tp)
            self._tps = tps

    def _ingest(self, records: Iterable) -> int:
        n = 0
        for rec in records:
            n += 1
            key = rec.key
            if key is None:
                continue
            if self.pipeline is not None:
                try:
                    pipeline, _, query, _ = parse_state_key(key)
                except CheckpointError:
                    continue
                if pipeline != self.pipeline or (query is not None and not self.panes):
                    continue
            if rec.value is None:  # a tombstone: the key is deleted
                self.latest.pop(key, None)
                self.offsets.pop(key, None)
                continue
            self.latest[key] = rec.value
            self.offsets[key] = rec.offset
        self.records_read += n
        return n

    def poll(self, timeout_ms: int = 200) -> int:
        """Poll once and fold new records in; returns the number of records read."""
        if not self._tps:
            self._assign(5.0)
        got = self.consumer.poll(timeout_ms=timeout_ms)
        return sum(self._ingest(recs) for recs in got.values())

    def catch_up(self, timeout_s: float = 30.0) -> int:
        """Read every partition to its current end; returns the number of records read.

        Raises
        ------
        StateError
            If the end is not reached within ``timeout_s`` seconds.
        """
        self._assign(timeout_s)
        total = 0

        def ingest(tp, recs) -> None:
            nonlocal total
            total += self._ingest(recs)

        read_to_end(self.consumer, self._tps, ingest, timeout_s=timeout_s, on_timeout=lambda: StateError(
            f"could not read state topic {self.topic!r} to its end in {timeout_s}s"))
        return total

    def probe(self, timeout_s: float = 10.0) -> dict:
        """Ask the broker for the end offsets of the state topic's partitions: a round trip that
        fails when the broker does not answer (``poll`` does not: it retries in the background).

        Returns
        -------
        dict TopicPartition → int
            End offset per partition.

        Raises
        ------
        StateError
            If the topic has no partitions.
        kafka.errors.KafkaError
            (``KafkaTimeoutError`` …) if the broker does not answer within ``timeout_s`` seconds.
        """
        self._assign(min(timeout_s, 5.0))
        return self.consumer.end_offsets(self._tps, timeout_ms=int(timeout_s * 1000))

    def end_offsets_of(self, topic: str, timeout_s: float = 10.0) -> dict[int, int]:
        """End offset of every partition of another ``topic`` (serve asks for the reports
        topic's: which partitions are caught up), through this reader's consumer.

        Raises
        ------
        kafka.errors.KafkaError
            If the broker does not answer within ``timeout_s`` seconds.
        """
        parts = self.consumer.partitions_for_topic(topic) or set()
        tps = [self._tp_cls(topic, p) for p in sorted(parts)]
        if not tps:
            return {}
        ends = self.consumer.end_offsets(tps, timeout_ms=int(timeout_s * 1000))
        return {tp.partition: int(off) for tp, off in ends.items()}

    def close(self) -> None:
        """Close the underlying consumer (idempotent)."""
        try:
            # bounded: a hung broker must not hang a shutdown
            self.consumer.close(timeout_ms=int(CLOSE_TIMEOUT_S * 1000))
        except Exception:  # closing is best effort
            log.debug("closing state-topic consumer failed", exc_info=True)

    def __repr__(self) -> str:
        return f"StateTopicReader(topic={self.topic!r}, keys={len(self.latest)})"
