"""Reading the reports topic back: did a record whose send failed reach the topic anyway?
(docs/collector.md §6.)

When the broker dies or a connection drops after a produce request left the collector, the Kafka
client fails the record without knowing whether the broker wrote it. The collector does not send
such a batch again blindly. It tagged the record with a **batch id** header — the first 16 bytes
of SHA-256 over the token id and the ``Idempotency-Key``, which names the batch without naming the
device — and sent it to a partition chosen from that id. When the device retries, the collector
reads that partition from an offset at or below the record's, up to its current end, and looks
for the id: found → the batch is in the topic (202 duplicate); absent → it is sent again.

:class:`TopicReadBack` does the reading with one kafka-python consumer without a group;
:func:`batch_id` and :func:`partition_of` are the naming rules.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Protocol, runtime_checkable

from ingest.kafka.settings import KafkaSettings

__all__ = ["BATCH_ID_HEADER", "ReadBack", "TopicConsumer", "TopicReadBack", "batch_id", "partition_of"]

#: Kafka record header carrying the batch id (16 bytes).
BATCH_ID_HEADER = "ldp-batch-id"


def batch_id(scope: str, key: str) -> bytes:
    """The 16-byte batch id of ``(token id, Idempotency-Key)``: SHA-256 of both, NUL-separated
    (a token id cannot contain NUL), truncated. Without the key the id tells nothing of the token."""
    return hashlib.sha256(scope.encode() + b"\x00" + key.encode()).digest()[:16]


def partition_of(bid: bytes, partitions) -> int:
    """The partition of the record with batch id ``bid``: the id's first 4 bytes (big-endian)
    modulo the partition count, over the sorted partition ids. A retry lands where its first
    copy went as long as the partition count does not change.

    Raises
    ------
    ValueError
        ``partitions`` is empty.
    """
    parts = sorted(partitions)
    if not parts:
        raise ValueError("the topic has no partitions")
    return parts[int.from_bytes(bid[:4], "big") % len(parts)]


@runtime_checkable
class ReadBack(Protocol):
    """What the forwarder reads the topic with (a fake in tests)."""

    def end_offsets(self) -> dict[int, int]:
        """``{partition: end offset}`` of the reports topic now (a lower bound is enough)."""

    def find(self, partition: int, start: int, ids: set[bytes], timeout_s: float) -> set[bytes]:
        """The ids of ``ids`` carried by records of ``partition`` from offset ``start`` to the
        partition's current end.

        Raises
        ------
        Exception
            The end was not reached within ``timeout_s`` (broker down) or the read failed.
        """

    def close(self) -> None:
        """Release the connection."""


class TopicConsumer:
    """One kafka-python consumer of a topic, without a group, built on first use and kept, with
    the lock its users serialise their calls with (the consumer is not thread-safe). The base of
    :class:`TopicReadBack` and of the readiness probe (``readiness.BrokerProbe``).

    Parameters
    ----------
    settings : KafkaSettings or str
        Client settings or bootstrap servers.
    topic : str
        The reports topic.
    """

    def __init__(self, settings: KafkaSettings | str, topic: str) -> None:
        self.settings, self.topic = KafkaSettings.coerce(settings), topic
        self._consumer = None
        self._lock = threading.Lock()

    def _client(self):
        from ingest.kafka.clients import reader_client

        if self._consumer is None:
            self._consumer = reader_client(self.settings)
        return self._consumer

    def _drop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # pragma: no cover - best effort on a broken client
                pass

    def close(self) -> None:
        """Close the consumer (best effort)."""
        with self._lock:
            self._drop()


class TopicReadBack(TopicConsumer):
    """:class:`ReadBack` over one :class:`TopicConsumer`; reads are serialised.

    Parameters
    ----------
    settings : KafkaSettings or str
        Client settings or bootstrap servers.
    topic : str
        The reports topic.
    """

    def end_offsets(self) -> dict[int, int]:
        """See :class:`ReadBack`; ``{}`` when the topic's partitions are not known yet."""
        from kafka import TopicPartition

        from ingest.kafka.offsets import high_watermarks

        with self._lock:
            consumer = self._client()
            parts = consumer.partitions_for_topic(self.topic) or set()
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            if not tps:
                return {}
            return {tp.partition: int(off) for tp, off in high_watermarks(consumer, tps).items()}

    def find(self, partition: int, start: int, ids: set[bytes], timeout_s: float) -> set[bytes]:
        """See :class:`ReadBack`. A failed read drops the consumer (the next read builds a new one)."""
        from kafka import TopicPartition

        from ingest.kafka.clients import read_to_end

        tp = TopicPartition(self.topic, int(partition))
        found: set[bytes] = set()

        def scan(_tp, records) -> None:
            for r in records:
                for name, value in r.headers or ():
                    if name == BATCH_ID_HEADER and value in ids:
                        found.add(bytes(value))

        with self._lock:
            try:
                consumer = self._client()
                consumer.assign([tp])
                consumer.seek(tp, max(0, int(start)))
                why = f"partition {partition} of {self.topic!r} not read to its end in {timeout_s:g} s"
                read_to_end(consumer, [tp], scan, timeout_s=timeout_s, on_timeout=lambda: TimeoutError(why))
            except BaseException:
                self._drop()
                raise
        return found
