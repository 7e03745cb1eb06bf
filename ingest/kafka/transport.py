"""The producer's transport: the client-library surface :class:`ingest.kafka.producer.ReportProducer`
and the collector send through, and its kafka-python implementation (docs/kafka.md §3)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ingest.errors import ConfigError
from ingest.kafka.clients import producer_client
from ingest.kafka.settings import KafkaSettings

logger = logging.getLogger(__name__)

__all__ = ["DeliveryFuture", "KafkaPythonTransport", "Transport"]


@runtime_checkable
class DeliveryFuture(Protocol):
    """What :meth:`Transport.send` returns: a future resolved on broker ack or failure (the
    surface of kafka-python's ``FutureRecordMetadata`` used here).
    :class:`ingest.kafka.producer.ReportProducer` reads ``is_done``/``exception``; the collector's
    forwarder registers callbacks.

    Attributes
    ----------
    is_done : bool
        True once the record is acknowledged or has definitely failed.
    exception : BaseException or None
        The failure, or None (acknowledged, or not done yet).
    """

    is_done: bool
    exception: BaseException | None

    def add_callback(self, fn: Callable[[Any], Any]) -> Any:
        """Call ``fn(record_metadata)`` once the record is acknowledged."""

    def add_errback(self, fn: Callable[[BaseException], Any]) -> Any:
        """Call ``fn(exception)`` once the record has definitely failed."""


@runtime_checkable
class Transport(Protocol):
    """The client-library surface :class:`ingest.kafka.producer.ReportProducer` uses.

    Every ``send`` returns a :class:`DeliveryFuture` that the client resolves, possibly on another
    thread; ``flush`` returns once every earlier ``send`` is resolved (or raises on timeout).
    Implementations: :class:`KafkaPythonTransport` (default); a confluent-kafka one can be added
    without touching callers (docs/kafka.md §3).
    """

    def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None,
             headers: list[tuple[str, bytes]] | None = None) -> DeliveryFuture:
        """Queue one record (``headers``: Kafka record headers); return its delivery future."""

    def flush(self, timeout: float | None = None) -> None:
        """Block until all queued records are resolved or ``timeout`` seconds pass."""

    def close(self, timeout: float | None = None) -> None:
        """Flush and release connections."""


class KafkaPythonTransport:
    """:class:`Transport` over kafka-python's ``KafkaProducer``.

    Parameters
    ----------
    settings : KafkaSettings or str
        Client settings or bootstrap servers.
    linger_s : float
        Seconds (>= 0) kafka-python waits to batch records per partition (``linger_ms``).
    delivery_timeout_s : float
        Seconds (> 0) after which an unacknowledged record fails (``delivery_timeout_ms``).
    max_request_size : int
        Largest record batch in bytes (``max_request_size``); must exceed the largest record.
    **overrides
        Further ``KafkaProducer`` kwargs.

    Raises
    ------
    ConfigError
        Out-of-range ``linger_s`` / ``delivery_timeout_s`` / ``max_request_size``.
    kafka.errors.KafkaError
        From ``KafkaProducer`` if the cluster cannot be bootstrapped (``bootstrap_timeout_ms``).
    """

    def __init__(self, settings: KafkaSettings | str, *, linger_s: float = 0.05,
                 delivery_timeout_s: float = 30.0, max_request_size: int = 16 * 1024 * 1024,
                 **overrides: Any) -> None:
        if not linger_s >= 0:
            raise ConfigError(f"linger_s must be >= 0 seconds, got {linger_s!r}")
        if not delivery_timeout_s > 0:
            raise ConfigError(f"delivery_timeout_s must be > 0 seconds, got {delivery_timeout_s!r}")
        if not max_request_size >= 1024:
            raise ConfigError(f"max_request_size must be >= 1024 bytes, got {max_request_size!r}")
        s = KafkaSettings.coerce(settings)
        request_timeout_ms = min(s.request_timeout_ms, int(delivery_timeout_s * 1000))
        linger_ms = int(linger_s * 1000)
        options = dict(
            linger_ms=linger_ms,
            # kafka-python requires delivery_timeout_ms >= linger_ms + request_timeout_ms
            delivery_timeout_ms=max(int(delivery_timeout_s * 1000), linger_ms + request_timeout_ms),
            request_timeout_ms=request_timeout_ms,
            max_request_size=max_request_size,
            batch_size=max(16384, min(max_request_size, 1 << 20)),
            bootstrap_timeout_ms=min(30000, int(delivery_timeout_s * 1000)),
        )
        self._producer = producer_client(s, **{**options, **overrides})

    def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None,
             headers: list[tuple[str, bytes]] | None = None) -> DeliveryFuture:
        """Queue a record (see :class:`Transport`); kafka-python's ``FutureRecordMetadata``."""
        return self._producer.send(topic, value=value, key=key, partition=partition, headers=headers)

    def flush(self, timeout: float | None = None) -> None:
        """Block until queued records are resolved; raises ``KafkaTimeoutError`` on timeout."""
        self._producer.flush(timeout=timeout)

    def partitions_for(self, topic: str) -> set[int] | None:
        """Partition ids of ``topic`` known to the client (may fetch metadata)."""
        return self._producer.partitions_for(topic)

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` s) and close the producer.

        kafka-python's ``close`` raises ``KafkaTimeoutError`` from its flush while records are
        still unresolved, and leaves the client open (its ``__del__`` then raises again at
        exit). Here the client is then closed without waiting: its sender thread is stopped,
        which fails the unresolved records, and ``close`` is repeated; the timeout is raised.
        """
        from kafka.errors import KafkaTimeoutError

        try:
            self._producer.close(timeout=timeout)
        except KafkaTimeoutError:
            sender = getattr(self._producer, "_sender", None)  # no public force-close in kafka-python
            if sender is not None:
                sender.force_close()
                sender.join(5.0)
            try:
                self._producer.close(timeout=0)
            except KafkaTimeoutError:  # pragma: no cover - the sender is stopped: nothing pending
                logger.warning("kafka-python producer did not close after its sender was stopped")
            raise
