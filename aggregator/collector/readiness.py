"""Whether the collector can take batches: ``GET /readyz`` (docs/collector.md §10).

:class:`Readiness` probes on a thread every ``interval_s`` seconds: a bootstrap server accepts a
TCP connection, the Kafka client knows the reports topic's partitions, and the broker answers a
request within ``timeout_s`` (the collector's ``ack_timeout_s``). Cached metadata and an open
port are not enough: a frozen broker keeps both. The request is :class:`BrokerProbe`'s, the end
offsets of the topic's partitions (one ``ListOffsets`` round trip).
"""

from __future__ import annotations

import threading

from aggregator.collector.readback import TopicConsumer

__all__ = ["BrokerProbe", "Readiness"]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class BrokerProbe(TopicConsumer):
    """A round trip to the broker: the end offsets of the reports topic's partitions, asked
    through one :class:`~aggregator.collector.readback.TopicConsumer`.

    Parameters
    ----------
    settings : KafkaSettings or str
        Client settings or bootstrap servers.
    topic : str
        The reports topic.

    Notes
    -----
    Source: docs/collector.md §10. Called on the readiness thread only.
    """

    def __call__(self, partitions, timeout_s: float) -> None:
        """Ask the broker for the end offsets of ``partitions`` of the topic.

        Parameters
        ----------
        partitions : iterable of int
        timeout_s : float
            Seconds to wait for the answer.

        Raises
        ------
        kafka.errors.KafkaError
            (``KafkaTimeoutError`` …) the broker did not answer within ``timeout_s``, or the
            consumer could not be built.
        """
        from kafka import TopicPartition

        tps = [TopicPartition(self.topic, int(p)) for p in sorted(partitions)]
        with self._lock:
            self._client().end_offsets(tps, timeout_ms=max(1, int(timeout_s * 1000)))


class Readiness:
    """Whether the collector can take batches, checked on a thread every ``interval_s`` seconds.

    Ready while (with ``settings``) a bootstrap server accepts a TCP connection, the Kafka client
    knows the reports topic's partitions (``partitions_for``) and ``probe`` returns within
    ``timeout_s``.

    Parameters
    ----------
    transport : ingest.kafka.transport.Transport
        Should have ``partitions_for(topic)``; without it the topic counts as partition 0.
    topic : str
    settings : ingest.kafka.settings.KafkaSettings or None
        For :func:`ingest.kafka.clients.reachable`; None skips the TCP check (tests).
    interval_s : float
        Seconds between probes.
    probe : callable (partitions: set[int], timeout_s: float) → None, or None
        A round trip to the broker that raises when it does not answer within ``timeout_s``
        (:class:`BrokerProbe`); None: no round trip (only the metadata counts).
    timeout_s : float
        The probe's timeout (the collector passes ``ack_timeout_s``).

    Notes
    -----
    Source: docs/collector.md §10.
    """

    def __init__(self, transport, topic: str, settings=None, interval_s: float = 2.0, *,
                 probe=None, timeout_s: float = 10.0) -> None:
        self.transport, self.topic, self.settings = transport, topic, settings
        self.interval_s, self.timeout_s = float(interval_s), float(timeout_s)
        self.probe = probe
        self.ready = False
        self.reason = "not checked yet"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> bool:
        """One probe; sets :attr:`ready` and :attr:`reason`."""
        from ingest.kafka.clients import reachable

        try:
            if self.settings is not None and not reachable(self.settings):
                self.ready, self.reason = False, "no bootstrap server accepts a connection"
                return False
            known = getattr(self.transport, "partitions_for", None)
            parts = known(self.topic) if known is not None else {0}
        except Exception as exc:
            self.ready, self.reason = False, f"no metadata for {self.topic!r}: {_one_line(exc)}"
            return False
        if not parts:
            self.ready, self.reason = False, f"no partitions known for {self.topic!r}"
            return False
        if self.probe is not None:
            try:
                self.probe(set(parts), self.timeout_s)
            except Exception as exc:
                self.ready, self.reason = False, (
                    f"the broker did not answer a request for the end offsets of {self.topic!r} "
                    f"within {self.timeout_s:g} s: {_one_line(exc)}")
                return False
        self.ready, self.reason = True, "ok"
        return True

    def start(self) -> Readiness:
        """Probe now, then on a daemon thread until :meth:`stop`."""
        self.check()

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                self.check()
            self.ready, self.reason = False, "stopping"

        self._thread = threading.Thread(target=loop, name="collector-readiness", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the probe thread (waiting at most ``timeout_s`` for a probe under way), then close
        the probe if it has ``close`` and the thread ended."""
        self._stop.set()
        self.ready, self.reason = False, "stopping"
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        if (thread is None or not thread.is_alive()) and hasattr(self.probe, "close"):
            self.probe.close()
