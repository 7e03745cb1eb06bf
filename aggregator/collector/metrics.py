"""Prometheus metrics of the collector (docs/collector.md §9), in a private registry.

Families: ``ldp_collector_reports_accepted_total``, ``ldp_collector_batches_total{outcome}``
(``accepted``, ``duplicate``, ``refused``), ``ldp_collector_refused_total{reason}`` (the error
code), ``ldp_collector_request_seconds`` (histogram of ``POST /v1/reports``),
``ldp_collector_inflight_bytes``, ``ldp_collector_idempotency_keys{state}``,
``ldp_collector_idempotency_evictions_total``, ``ldp_collector_readbacks_total{outcome}``
(``found``, ``absent``, ``failed``), ``ldp_collector_token_reloads_total{outcome}`` (``ok``,
``failed``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["COLLECTOR_METRIC_NAMES", "CollectorMetrics"]

#: Exposed family names (counters with their ``_total`` suffix).
COLLECTOR_METRIC_NAMES: tuple[str, ...] = (
    "ldp_collector_reports_accepted_total",
    "ldp_collector_batches_total",
    "ldp_collector_refused_total",
    "ldp_collector_request_seconds",
    "ldp_collector_inflight_bytes",
    "ldp_collector_idempotency_keys",
    "ldp_collector_idempotency_evictions_total",
    "ldp_collector_readbacks_total",
    "ldp_collector_token_reloads_total",
)

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class CollectorMetrics:
    """The collector's counters, gauges and histogram.

    Parameters
    ----------
    registry : CollectorRegistry or None
        ``None`` creates a private registry (never the global one).

    Notes
    -----
    Source: docs/collector.md §9. Gauges of the idempotency table and of the bytes in flight are
    read when scraped (:meth:`bind`).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reports_accepted = Counter("ldp_collector_reports_accepted", "Reports of the batches known "
                                        "to be in the reports topic, each batch once: acknowledged "
                                        "by Kafka or found by a read-back.", registry=r)
        self.batches = Counter("ldp_collector_batches", "POST /v1/reports answered, by outcome.",
                               ["outcome"], registry=r)
        self.refused = Counter("ldp_collector_refused", "Requests refused, by error code.", ["reason"],
                               registry=r)
        self.request_seconds = Histogram("ldp_collector_request_seconds",
                                         "Time to answer POST /v1/reports.", buckets=_BUCKETS, registry=r)
        self.inflight_bytes = Gauge("ldp_collector_inflight_bytes",
                                    "Body bytes sent to Kafka and not yet resolved.", registry=r)
        self.keys = Gauge("ldp_collector_idempotency_keys", "Idempotency keys held, by state.",
                          ["state"], registry=r)
        self.evictions = Counter("ldp_collector_idempotency_evictions",
                                 "Accepted keys dropped before their window ended (idempotency_max_keys).",
                                 registry=r)
        self.readbacks = Counter("ldp_collector_readbacks", "Unconfirmed batches settled by reading "
                                 "the reports topic back (found, absent), and failed read-backs.",
                                 ["outcome"], registry=r)
        self.token_reloads = Counter("ldp_collector_token_reloads", "Token-file reloads, by outcome.",
                                     ["outcome"], registry=r)
        for outcome in ("accepted", "duplicate", "refused"):
            self.batches.labels(outcome=outcome)
        for outcome in ("ok", "failed"):
            self.token_reloads.labels(outcome=outcome)
        for outcome in ("found", "absent", "failed"):
            self.readbacks.labels(outcome=outcome)

    def bind(self, table) -> None:
        """Read the gauges from an :class:`~aggregator.collector.idempotency.IdempotencyTable`
        when scraped, and count its evictions and the reports of every entry that becomes
        accepted (``ldp_collector_reports_accepted_total``: each batch in the topic once, also
        one acknowledged after its request was answered 503 or found by a read-back)."""
        self.inflight_bytes.set_function(lambda: table.inflight_bytes)
        self.keys.labels(state="in_flight").set_function(lambda: table.inflight)
        self.keys.labels(state="accepted").set_function(lambda: table.accepted)
        self.keys.labels(state="unconfirmed").set_function(lambda: table.unconfirmed)
        table.on_evict = self.evictions.inc
        table.on_accept = lambda entry: self.reports_accepted.inc(entry.reports)

    def refuse(self, code: str) -> None:
        """Count a refused request with error ``code``."""
        self.refused.labels(reason=code).inc()
        self.batches.labels(outcome="refused").inc()

    def readback(self, outcome: str) -> None:
        """Count a read-back outcome (``found``, ``absent``, ``failed``)."""
        self.readbacks.labels(outcome=outcome).inc()

    def token_reload(self, ok: bool) -> None:
        """Count a token-file reload attempt."""
        self.token_reloads.labels(outcome="ok" if ok else "failed").inc()

    def exposition(self) -> bytes:
        """Prometheus text format of the registry."""
        return generate_latest(self.registry)
