"""``[collector]`` of the pipeline config: the HTTP collector's listen address, token file, body
and rate limits, Kafka acknowledgement bounds and idempotency window (docs/collector.md §4).

The section is optional: a pipeline file without ``[collector]`` loads with the defaults, and
only ``ldp-stream collect`` needs ``token_file``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from aggregator.queries import finite_float
from ingest.model import StrictModel

__all__ = ["DEFAULT_MAX_BODY_BYTES", "CollectorSection", "event_time_skew_limit"]

#: ``max_body_bytes`` when the section does not set it (lowered to ``[worker] max_record_bytes``).
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024

#: seconds in (0, 1 hour]: body, acknowledgement and delivery timeouts
_TIMEOUT = finite_float(0.0, 3600.0)
#: seconds in (0, 1 week]: how long an accepted idempotency key is remembered
_WINDOW = finite_float(0.0, 86_400 * 7)
#: reports per second in (0, 10⁹]
_RATE = finite_float(0.0, 1e9)


class CollectorSection(StrictModel):
    """``[collector]`` (docs/collector.md §4).

    Attributes
    ----------
    host : str
        Listen address (default ``127.0.0.1``: loopback only).
    port : int
        TCP port in [0, 65535] (default 8090; 0 = a free port, printed at start).
    token_file : Path or None
        File of hashed bearer tokens (docs/collector.md §5), resolved relative to the pipeline
        file. Required by ``ldp-stream collect``; no default.
    tls_certfile, tls_keyfile : Path or None
        PEM certificate chain and key for HTTPS (both or neither; relative to the pipeline file).
    max_body_bytes : int
        Largest request body in bytes, in [1024, 1 GiB] and at most ``[worker]
        max_record_bytes`` (a larger record would be dead-lettered by the workers). Default
        8 MiB, lowered to ``max_record_bytes`` when that is smaller and the key is not set.
    max_reports_per_batch : int
        Largest report count of one body, in [1, 10⁶] (default 100 000).
    rate_limit_reports_per_s : float
        Sustained reports per second per token, in (0, 10⁹] (default 10 000).
    rate_limit_burst : int
        Token-bucket capacity in reports, ≥ 1 (default 100 000).
    body_timeout_s : float
        Seconds within which the whole body must arrive, in (0, 3600] (default 10).
    ack_timeout_s : float
        Seconds a request waits for Kafka's acknowledgement, in (0, 3600] (default 10).
    delivery_timeout_s : float
        Seconds after which the Kafka client gives up on an unacknowledged record
        (``delivery_timeout_ms``), in (0, 3600], smaller than ``idempotency_window_s``
        (default 30).
    max_inflight_bytes : int
        Body bytes awaiting acknowledgement, in [1024, 16 GiB] (default 64 MiB).
    idempotency_window_s : float
        Seconds an accepted key is remembered, in (0, 1 week] (default 900).
    idempotency_max_keys : int
        Accepted keys remembered at most (least recently used dropped first), in [1, 10⁸]
        (default 200 000, about 80 MB).

    Raises
    ------
    pydantic.ValidationError
        (wrapped as ``ConfigError`` by ``PipelineConfig``) naming the key and its range.

    Notes
    -----
    Source: docs/collector.md §4; the window and timeouts: §6; the limits: §7; TLS: §8.
    """

    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8090, ge=0, le=65_535)
    token_file: Path | None = Field(default=None, strict=False)
    tls_certfile: Path | None = Field(default=None, strict=False)
    tls_keyfile: Path | None = Field(default=None, strict=False)
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024, le=1 << 30)
    max_reports_per_batch: int = Field(default=100_000, ge=1, le=1_000_000)
    rate_limit_reports_per_s: _RATE = 10_000.0
    rate_limit_burst: int = Field(default=100_000, ge=1, le=10**12)
    body_timeout_s: _TIMEOUT = 10.0
    ack_timeout_s: _TIMEOUT = 10.0
    delivery_timeout_s: _TIMEOUT = 30.0
    max_inflight_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=16 << 30)
    idempotency_window_s: _WINDOW = 900.0
    idempotency_max_keys: int = Field(default=200_000, ge=1, le=100_000_000)

    @model_validator(mode="after")
    def _check(self) -> CollectorSection:
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("tls_certfile and tls_keyfile must be given together (or neither)")
        if not self.delivery_timeout_s < self.idempotency_window_s:
            # a record still retried by the Kafka client must not outlive the key that guards it
            raise ValueError(f"delivery_timeout_s ({self.delivery_timeout_s:g}) must be < "
                             f"idempotency_window_s ({self.idempotency_window_s:g})")
        if self.max_inflight_bytes < self.max_body_bytes:
            raise ValueError(f"max_inflight_bytes ({self.max_inflight_bytes}) must be >= "
                             f"max_body_bytes ({self.max_body_bytes}): one body must fit")
        return self

    def resolved(self, base_dir: Path) -> CollectorSection:
        """The section with its relative paths made relative to ``base_dir`` (the config's
        directory)."""
        update = {k: Path(base_dir) / v for k in ("token_file", "tls_certfile", "tls_keyfile")
                  if (v := getattr(self, k)) is not None and not v.is_absolute()}
        return self.model_copy(update=update) if update else self


def event_time_skew_limit(pipeline) -> float | None:
    """The event-time skew the collector refuses for ``pipeline``: ``[worker]
    max_event_time_skew_s`` when a query is windowed (the workers then dead-letter a record whose
    latest event time is further ahead of its Kafka timestamp), else None (no check).

    Parameters
    ----------
    pipeline : aggregator.config.PipelineConfig

    Returns
    -------
    float or None
        Seconds (docs/collector.md §3, docs/windows.md §3).
    """
    if any(getattr(q, "window", None) is not None for q in pipeline.queries):
        return float(pipeline.worker.max_event_time_skew_s)
    return None
