"""Every Kafka client of the project, built from one typed :class:`~ingest.kafka.settings.KafkaSettings`,
and the one way to read a topic to its end.

* :func:`consumer_client`, :func:`producer_client`, :func:`admin_client` — kafka-python's
  ``KafkaConsumer``, ``KafkaProducer`` and ``KafkaAdminClient`` with the connection and security
  settings (TLS, SASL) of ``settings`` (:meth:`KafkaSettings.consumer_config` …) and the
  caller's options on top;
* :func:`reader_client` — a consumer without a group that reads from the beginning (state-topic
  readers, ``analyze``'s replay);
* :func:`reachable` — whether a bootstrap server accepts a TCP connection, asked before a
  client is built;
* :func:`read_to_end` — poll assigned partitions until each has reached the end it had when the
  call began, honouring Tansu's too-small ``end_offsets()`` (docs/kafka.md §2.2).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

from ingest.kafka.offsets import high_watermarks
from ingest.kafka.settings import KafkaSettings

__all__ = ["admin_client", "consumer_client", "producer_client", "reachable", "read_to_end", "reader_client",
           "topic_records", "topic_values"]


def reachable(settings: KafkaSettings, timeout: float = 1.0) -> bool:
    """Whether at least one bootstrap server accepts a TCP connection (no Kafka request is made).

    Used before constructing kafka-python clients, whose 3.0.12 connection code leaks a socket for
    every refused connection attempt.

    Parameters
    ----------
    settings : KafkaSettings
    timeout : float
        Seconds per connection attempt.
    """
    for server in settings.bootstrap_servers:
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return True
        except OSError:
            continue
    return False

def consumer_client(settings: KafkaSettings, *, group_id: str | None = None, fast_group: bool = False,
                    **options: Any):
    """A ``kafka.KafkaConsumer`` for ``settings``.

    Parameters
    ----------
    settings : KafkaSettings
    group_id : str or None
        Consumer group; ``None`` for manual assignment.
    fast_group : bool
        Apply :data:`ingest.kafka.settings.FAST_GROUP_SETTINGS` (~3 s joins).
    **options
        Further ``KafkaConsumer`` options (``enable_auto_commit``, ``max_poll_records`` …).

    Raises
    ------
    ConfigError
        If a TLS file of ``settings`` cannot be read.
    """
    from kafka import KafkaConsumer

    return KafkaConsumer(**settings.consumer_config(group_id, fast_group=fast_group, **options))


def reader_client(settings: KafkaSettings):
    """A consumer without a group, without auto-commit, from the earliest offset: for reading a
    topic (or its assigned partitions) to the end with :func:`read_to_end`."""
    return consumer_client(settings, enable_auto_commit=False, auto_offset_reset="earliest")


def producer_client(settings: KafkaSettings, **options: Any):
    """A ``kafka.KafkaProducer`` for ``settings`` (``acks="all"`` unless ``options`` say otherwise).

    Raises
    ------
    ConfigError
        If a TLS file of ``settings`` cannot be read.
    kafka.errors.KafkaError
        If the cluster cannot be bootstrapped.
    """
    from kafka import KafkaProducer

    return KafkaProducer(**settings.producer_config(**options))


def admin_client(settings: KafkaSettings, **options: Any):
    """A ``kafka.KafkaAdminClient`` for ``settings``.

    Raises
    ------
    ConfigError
        If a TLS file of ``settings`` cannot be read.
    kafka.errors.KafkaError
        If the broker cannot be reached.
    """
    from kafka import KafkaAdminClient

    return KafkaAdminClient(**settings.admin_config(**options))


def read_to_end(consumer, partitions: Iterable, on_records: Callable[[Any, list], None], *,
                timeout_s: float, on_timeout: Callable[[], BaseException],
                poll_timeout_ms: int = 100) -> None:
    """Poll ``consumer`` until each of ``partitions`` has reached the end it had at the start.

    The end of a partition is the larger of ``end_offsets()`` taken at the start
    (:func:`ingest.kafka.offsets.high_watermarks`, a lower bound on Tansu, whose ``ListOffsets`` can be
    too small) and the high watermark of the latest fetch response (``consumer.highwater``, which
    is right on both brokers); a partition counts as read only once a fetch has answered for it.

    Parameters
    ----------
    consumer : kafka.KafkaConsumer
        With ``partitions`` assigned and positioned where reading starts.
    partitions : iterable of TopicPartition
    on_records : callable (TopicPartition, list of ConsumerRecord) → None
        Called with the records of each partition of each poll, in order.
    timeout_s : float
        Give up after this many seconds.
    on_timeout : callable () → exception
        Builds the error raised when the end is not reached within ``timeout_s``.
    poll_timeout_ms : int
        ``poll`` timeout.

    Raises
    ------
    Exception
        ``on_timeout()``'s error if the end is not reached in time.
    """
    tps = list(partitions)
    deadline = time.monotonic() + timeout_s
    try:
        floor = high_watermarks(consumer, tps)
    except Exception:  # an optional lower bound only: the fetch high watermark decides
        floor = {}
    fresh: set = set()
    while True:
        for tp, recs in consumer.poll(timeout_ms=poll_timeout_ms).items():
            on_records(tp, recs)
        done = True
        for tp in tps:
            hw = consumer.highwater(tp)
            if hw is not None:
                fresh.add(tp)
            if tp not in fresh or consumer.position(tp) < max(int(floor.get(tp) or 0), int(hw or 0)):
                done = False
        if done:
            return
        if time.monotonic() > deadline:
            raise on_timeout()


def topic_records(settings: KafkaSettings | str, topic: str, *, timeout_s: float = 60.0) -> list:
    """Every record of ``topic`` (kafka-python ``ConsumerRecord``: value, headers, partition,
    offset …), partition by partition from the beginning to the end.

    Parameters
    ----------
    settings : KafkaSettings or str
        Client settings, or bootstrap servers.
    topic : str
    timeout_s : float
        Seconds to reach the end of every partition.

    Returns
    -------
    list of ConsumerRecord
        Each partition's records in offset order.

    Raises
    ------
    TimeoutError
        The end was not reached within ``timeout_s``.
    """
    from kafka import TopicPartition

    consumer = reader_client(KafkaSettings.coerce(settings))
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        records: list = []
        read_to_end(consumer, tps, lambda tp, recs: records.extend(recs),
                    timeout_s=timeout_s, on_timeout=lambda: TimeoutError(f"{topic} not read to its end"))
        return records
    finally:
        consumer.close()


def topic_values(settings: KafkaSettings | str, topic: str, *, timeout_s: float = 60.0) -> list[bytes]:
    """The values of :func:`topic_records` (same parameters and errors)."""
    return [r.value for r in topic_records(settings, topic, timeout_s=timeout_s)]
