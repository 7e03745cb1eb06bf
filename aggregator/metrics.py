"""Prometheus metrics of the worker and of serve (names as in docs/deploy.md, "Metrics": prefix
``ldp_``, base units, ``_total`` counters).

Every metrics object owns a private :class:`prometheus_client.CollectorRegistry` (never the global
one), so several workers or servers can live in one process (tests) and each exposes only its own
families. Workers export their operational metrics; serve exports the merged estimates.
:func:`read_metrics`, :func:`metric_value` and :func:`metric_totals` read an endpoint back (the
demo, the tests, the benchmarks).
"""

from __future__ import annotations

import errno
import logging
import math
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from aggregator.errors import ConfigError

__all__ = [
    "CONTENT_TYPE_LATEST",
    "METRIC_NAMES",
    "SERVE_METRIC_NAMES",
    "WORKER_METRIC_NAMES",
    "ServeMetrics",
    "WorkerMetrics",
    "metric_totals",
    "metric_value",
    "read_metrics",
    "start_metrics_server",
]

log = logging.getLogger(__name__)

#: Exposed family names of :class:`WorkerMetrics` (counters carry their ``_total`` suffix).
WORKER_METRIC_NAMES: tuple[str, ...] = (
    "ldp_reports_processed_total",
    "ldp_records_processed_total",
    "ldp_records_dead_lettered_total",
    "ldp_duplicates_skipped_total",
    "ldp_checkpoints_total",
    "ldp_checkpoint_duration_seconds",
    "ldp_rebalances_total",
    "ldp_consumer_lag_records",
    "ldp_last_processed_timestamp_seconds",
    "ldp_offset_gap_records_total",
    "ldp_state_records_invalid_total",
    "ldp_partition_recoveries_total",
    "ldp_owned_partitions",
    "ldp_reports_late_total",
    "ldp_window_pane_records_total",
)
#: Exposed family names of :class:`ServeMetrics`.
SERVE_METRIC_NAMES: tuple[str, ...] = (
    "ldp_estimate",
    "ldp_estimate_stderr",
    "ldp_estimate_ci_lower",
    "ldp_estimate_ci_upper",
    "ldp_estimate_reports",
    "ldp_estimate_hessian_guard",
    "ldp_window_estimate",
    "ldp_window_estimate_stderr",
    "ldp_window_estimate_ci_lower",
    "ldp_window_estimate_ci_upper",
    "ldp_window_reports",
    "ldp_window_end_timestamp_seconds",
    "ldp_state_records_invalid_total",
    "ldp_state_partitions",
    "ldp_state_topic_last_contact_timestamp_seconds",
)
#: Every family name registered by this module.
METRIC_NAMES: tuple[str, ...] = tuple(dict.fromkeys(WORKER_METRIC_NAMES + SERVE_METRIC_NAMES))


def _base(name: str) -> str:
    # prometheus_client appends ``_total`` to counters itself
    return name[: -len("_total")] if name.endswith("_total") else name


class WorkerMetrics:
    """Operational metrics of one worker process (docs/deploy.md, "Metrics").

    Parameters
    ----------
    registry : CollectorRegistry or None
        Registry to register in; ``None`` creates a private one (attribute ``registry``).

    Attributes
    ----------
    reports, records, duplicates, checkpoints, rebalances : Counter
        ``ldp_reports_processed_total`` (privatized reports folded into state),
        ``ldp_records_processed_total`` (Kafka records decoded), ``ldp_duplicates_skipped_total``
        (records below ``next_offset``), ``ldp_checkpoints_total``, ``ldp_rebalances_total``.
    dead_lettered : Counter, label ``reason``
        ``ldp_records_dead_lettered_total``: undecodable records sent to the dead-letter topic.
    offset_gap : Counter, label ``partition``
        ``ldp_offset_gap_records_total``: records skipped because they were gone from the log
        (retention) when the worker resumed.
    state_invalid : Counter
        ``ldp_state_records_invalid_total``: state-topic records that failed to decode.
    rejected_updates : Counter, label ``partition``
        ``ldp_partition_recoveries_total``: times a partition was restored from its last
        checkpoint because a state refused an update or a fold failed (docs/reliability.md §9).
    checkpoint_duration : Histogram
        ``ldp_checkpoint_duration_seconds``: seconds from a checkpoint's start (the partitions'
        offsets marked) to its offsets committed: sending the states, the broker's
        acknowledgement, the commit.
    lag : Gauge, label ``partition``
        ``ldp_consumer_lag_records``: fetch high watermark − next offset.
    last_processed : Gauge
        ``ldp_last_processed_timestamp_seconds``: Unix time of the last processed record.
    owned : Gauge
        ``ldp_owned_partitions``: partitions currently owned.
    late : Counter, label ``query``
        ``ldp_reports_late_total``: reports of a windowed query not folded in because their pane
        had closed (docs/windows.md §3).
    pane_records : Counter
        ``ldp_window_pane_records_total``: closed panes and tombstones sent to the state topic.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reports = Counter(_base("ldp_reports_processed_total"), "Privatized reports folded into state.",
                               registry=r)
        self.records = Counter(_base("ldp_records_processed_total"),
                               "Reports-topic records decoded and folded into state.", registry=r)
        self.dead_lettered = Counter(_base("ldp_records_dead_lettered_total"),
                                     "Undecodable records sent to the dead-letter topic.", ["reason"],
                                     registry=r)
        self.duplicates = Counter(_base("ldp_duplicates_skipped_total"),
                                  "Records below a partition's next_offset, skipped.", registry=r)
        self.checkpoints = Counter(_base("ldp_checkpoints_total"), "Partition checkpoints published.",
                                   registry=r)
        self.checkpoint_duration = Histogram(
            "ldp_checkpoint_duration_seconds",
            "Checkpoint time from its start to the offsets committed (send, broker ack, commit).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0), registry=r,
        )
        self.rebalances = Counter(_base("ldp_rebalances_total"), "Partition assignments and revocations.",
                                  registry=r)
        self.lag = Gauge("ldp_consumer_lag_records", "High watermark minus next offset.", ["partition"],
                         registry=r)
        self.last_processed = Gauge("ldp_last_processed_timestamp_seconds",
                                    "Unix time at which the last record was processed.", registry=r)
        self.offset_gap = Counter(_base("ldp_offset_gap_records_total"),
                                  "Records lost to retention before they were processed.", ["partition"],
                                  registry=r)
        self.state_invalid = Counter(_base("ldp_state_records_invalid_total"),
                                     "State-topic records that failed to decode.", registry=r)
        self.rejected_updates = Counter(_base("ldp_partition_recoveries_total"),
                                        "Partitions restored from their last checkpoint after a state "
                                        "refused an update.", ["partition"], registry=r)
        self.owned = Gauge("ldp_owned_partitions", "Partitions currently owned.", registry=r)
        self.late = Counter(_base("ldp_reports_late_total"),
                            "Reports of a windowed query that arrived after their pane closed.", ["query"],
                            registry=r)
        self.pane_records = Counter(_base("ldp_window_pane_records_total"),
                                    "Closed window panes and tombstones sent to the state topic.", registry=r)

    def exposition(self) -> bytes:
        """Prometheus text exposition of this registry."""
        return generate_latest(self.registry)

    def __repr__(self) -> str:
        return "WorkerMetrics()"


class ServeMetrics:
    """Merged-estimate gauges of serve (docs/deploy.md, "Metrics").

    Gauges ``ldp_estimate``, ``ldp_estimate_stderr``, ``ldp_estimate_ci_lower``,
    ``ldp_estimate_ci_upper`` carry labels ``query`` and ``param`` (one series per estimated
    parameter); ``ldp_estimate_reports{query}`` is the number of reports behind the estimate;
    ``ldp_estimate_hessian_guard{query}`` counts the renewable regressions' guard actions. A
    windowed query publishes its latest final window instead (:meth:`set_window`):
    ``ldp_window_estimate``, ``ldp_window_estimate_stderr``, ``ldp_window_estimate_ci_lower``,
    ``ldp_window_estimate_ci_upper`` {query, param}, ``ldp_window_reports{query}`` and
    ``ldp_window_end_timestamp_seconds{query}``.

    Parameters
    ----------
    registry : CollectorRegistry or None
        ``None`` creates a private registry.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        labels = ["query", "param"]
        self.value = Gauge("ldp_estimate", "Merged estimate.", labels, registry=r)
        self.stderr = Gauge("ldp_estimate_stderr", "Standard error of the merged estimate.", labels,
                            registry=r)
        self.ci_lower = Gauge("ldp_estimate_ci_lower", "Lower confidence bound.", labels, registry=r)
        self.ci_upper = Gauge("ldp_estimate_ci_upper", "Upper confidence bound.", labels, registry=r)
        self.reports = Gauge("ldp_estimate_reports", "Reports behind the merged estimate.", ["query"],
                             registry=r)
        self.state_invalid = Counter(_base("ldp_state_records_invalid_total"),
                                     "State-topic records that failed to decode.", registry=r)
        self.hessian_guard = Gauge("ldp_estimate_hessian_guard",
                                   "Times the positive-definiteness guard of a renewable "
                                   "regression's Hessian acted (docs/mechanisms.md §6.6).", ["query"],
                                   registry=r)
        self.partitions = Gauge("ldp_state_partitions", "Partition checkpoints merged per query.",
                                ["query"], registry=r)
        self.window_value = Gauge("ldp_window_estimate", "Estimate of the latest final window.", labels,
                                  registry=r)
        self.window_stderr = Gauge("ldp_window_estimate_stderr",
                                   "Standard error of the latest final window's estimate.", labels,
                                   registry=r)
        self.window_ci_lower = Gauge("ldp_window_estimate_ci_lower",
                                     "Lower confidence bound of the latest final window.", labels,
                                     registry=r)
        self.window_ci_upper = Gauge("ldp_window_estimate_ci_upper",
                                     "Upper confidence bound of the latest final window.", labels,
                                     registry=r)
        self.window_reports = Gauge("ldp_window_reports", "Reports in the latest final window.", ["query"],
                                    registry=r)
        self.window_end = Gauge("ldp_window_end_timestamp_seconds",
                                "End (Unix seconds) of the latest final window.", ["query"], registry=r)
        self.state_contact = Gauge("ldp_state_topic_last_contact_timestamp_seconds",
                                   "Unix time the broker last answered for the state topic (read to "
                                   "its end, or its end offsets returned); alert on its age.",
                                   registry=r)

    def set_window(self, query: str, window: Mapping) -> None:
        """Publish the latest final window of a windowed query (``ldp_window_estimate`` … with
        the labels of :meth:`set_estimate`, ``ldp_window_reports{query}`` and
        ``ldp_window_end_timestamp_seconds{query}``; docs/windows.md §4).

        Parameters
        ----------
        query : str
        window : mapping
            A row of ``GET /windows/{query}``: ``params``, ``value``, ``stderr``, ``ci_low``,
            ``ci_high``, ``n`` and ``end_s`` (Unix seconds).
        """
        self._set_params((self.window_value, self.window_stderr, self.window_ci_lower,
                          self.window_ci_upper), query, window)
        self.window_reports.labels(query=query).set(float(window.get("n") or 0))
        if window.get("end_s") is not None:
            self.window_end.labels(query=query).set(float(window["end_s"]))

    def clear_window(self, query: str) -> None:
        """Remove the ``ldp_window_*`` series of ``query`` (it has no final window any more, e.g.
        a partition became busy again): a dashboard then shows no value rather than a stale one."""
        for gauge in (self.window_value, self.window_stderr, self.window_ci_lower, self.window_ci_upper,
                      self.window_reports, self.window_end):
            for labels in [k for k in list(getattr(gauge, "_metrics", {})) if k and k[0] == query]:
                gauge.remove(*labels)

    def set_estimate(self, query: str, estimate: Mapping) -> None:
        """Publish one query's estimate.

        Parameters
        ----------
        query : str
            Query name.
        estimate : mapping
            ``Estimate.to_dict()``-like: ``value``, ``stderr``, ``ci_low``, ``ci_high`` (scalars
            or equal-length sequences), ``n`` and optional ``params`` (names of the entries;
            default ``"value"`` for a scalar, ``"0", "1", …`` otherwise). Non-finite entries are
            skipped (a gauge is never set to NaN).
        """
        if estimate.get("hessian_guard") is not None:
            self.hessian_guard.labels(query=query).set(int(estimate["hessian_guard"]))
        self._set_params((self.value, self.stderr, self.ci_lower, self.ci_upper), query, estimate)
        n = estimate.get("n")
        if n is not None:
            self.reports.labels(query=query).set(float(n))

    @staticmethod
    def _set_params(gauges: tuple, query: str, estimate: Mapping) -> None:
        """Set the value, stderr, ci_low and ci_high gauges of each parameter (non-finite
        entries skipped)."""
        vals = _as_list(estimate.get("value"))
        default = ["value"] if len(vals) == 1 else [str(i) for i in range(len(vals))]
        params = [str(p) for p in (estimate.get("params") or default)]
        for gauge, key in zip(gauges, ("value", "stderr", "ci_low", "ci_high"), strict=True):
            for p, v in zip(params, _as_list(estimate.get(key))):
                if v is not None and math.isfinite(v):
                    gauge.labels(query=query, param=p).set(v)

    def exposition(self) -> bytes:
        """Prometheus text exposition of this registry."""
        return generate_latest(self.registry)

    def __repr__(self) -> str:
        return "ServeMetrics()"


def _as_list(v) -> list:
    if v is None:
        return []
    if isinstance(v, Mapping):
        v = list(v.values())
    if isinstance(v, (list, tuple)):
        out = []
        for x in v:
            out.extend(_as_list(x) if isinstance(x, (list, tuple)) else [_num(x)])
        return out
    try:
        import numpy as np

        arr = np.asarray(v, dtype=float).ravel()
        return [float(x) for x in arr]
    except (TypeError, ValueError):
        return [_num(v)]


def _num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def start_metrics_server(registry: CollectorRegistry, port: int, host: str = "127.0.0.1"):
    """Expose ``registry`` on ``http://host:port/metrics`` in a daemon thread.

    Parameters
    ----------
    registry : CollectorRegistry
    port : int
        TCP port in [0, 65535]; 0 picks a free port (read it back from ``server.server_port``).
    host : str
        Bind address; ``127.0.0.1`` by default.

    Returns
    -------
    (server, thread)
        ``server.shutdown()`` stops it.

    Raises
    ------
    ConfigError
        If ``port`` is outside [0, 65535], or the address cannot be bound (port in use, not a
        local address) — the message names host and port.
    """
    from prometheus_client import start_http_server

    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"metrics port must be an integer in [0, 65535], got {port!r}")
    try:
        return start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        hint = (" (each worker needs its own --metrics-port)" if exc.errno == errno.EADDRINUSE
                else " (--metrics-host must be an address of this machine)"
                if exc.errno == errno.EADDRNOTAVAIL else "")
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}{hint}") from None


# ---------------------------------------------------------------------- reading an endpoint
def read_metrics(url: str, timeout: float = 2.0) -> str:
    """The text exposition served at ``url`` (e.g. ``http://127.0.0.1:9100/metrics``).

    Raises
    ------
    OSError
        ``urllib.error.URLError`` (an ``OSError``) if nothing answers within ``timeout`` seconds.
    """
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def metric_totals(text: str) -> dict[str, float]:
    """Every sample of a text exposition summed over its labels, by sample name
    (``ldp_reports_processed_total`` → the sum over partitions)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def metric_value(text: str, name: str, labels: str = "") -> float:
    """The value of one sample of a text exposition, 0.0 if it is absent.

    Parameters
    ----------
    text : str
        The exposition (:func:`read_metrics`).
    name : str
        Sample name, e.g. ``ldp_records_dead_lettered_total``.
    labels : str
        The sample's labels as exposed, e.g. ``'reason="bad_magic"'``; empty for none.
    """
    want = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, val = line.rpartition(" ")
        if key == want:
            return float(val)
    return 0.0
