"""Errors of the ``ingest`` package; its root :class:`IngestError` derives from the project's root
:class:`mechanisms.errors.LdpStreamError`."""

from mechanisms.errors import ConfigError as ConfigError  # the one ConfigError, re-exported
from mechanisms.errors import LdpStreamError as LdpStreamError


class IngestError(LdpStreamError):
    """Root of every error raised by ``ingest``."""


class SchemaError(IngestError, ValueError):
    """A schema is invalid, or an event does not fit its schema. The message names the field."""


class EventTimeError(SchemaError):
    """A value of an event-time column that cannot be read as an event time
    (``ingest.client.event_time``); the message names the column and the row (``time column
    'time_hour', row 17: cannot parse '2013-13-01' as an ISO-8601 time``)."""


class DecodeError(IngestError, ValueError):
    """A wire record could not be decoded; the subclasses below say why (``ingest.client.codec``).

    ``reason`` is a short machine-readable label used for dead-letter metrics.
    """

    reason = "malformed"


class TruncatedError(DecodeError):
    """The record ends before a declared block does."""

    reason = "truncated"


class BadMagicError(DecodeError):
    """The record does not start with ``MAGIC``."""

    reason = "bad_magic"


class UnsupportedVersionError(DecodeError):
    """The format version is not one this decoder reads."""

    reason = "unsupported_version"


class UnknownFingerprintError(DecodeError):
    """The schema fingerprint is not among the known schemas."""

    reason = "unknown_fingerprint"


class SchemaMismatchError(DecodeError):
    """The record's shape (d, number/kind of blocks, k) disagrees with its schema."""

    reason = "schema_mismatch"


class BadLengthError(DecodeError):
    """A block's declared length is inconsistent with its content."""

    reason = "bad_length"


class NonFiniteError(DecodeError):
    """A numeric value is NaN or infinite."""

    reason = "non_finite"


class OutOfRangeError(DecodeError):
    """A category code or bit position is ≥ k (or a bitmap padding bit is set)."""

    reason = "out_of_range"


class ImpossibleReportError(DecodeError):
    """A report that the field's mechanism cannot produce: a uRAP report with more than one
    non-sensitive bit set (docs/frequency.md §3). The states rely on this, so the decoder refuses
    it before any state sees it."""

    reason = "impossible_report"


class TooLargeError(DecodeError):
    """The record exceeds ``max_bytes`` or declares more than ``max_reports`` reports."""

    reason = "too_large"


class TrailingBytesError(DecodeError):
    """Bytes remain after the last declared block."""

    reason = "trailing_bytes"


class MalformedError(DecodeError):
    """Any other structural error (reserved bits set, unknown block kind or width, unsorted
    positions, not bytes)."""

    reason = "malformed"


class InternalDecodeError(DecodeError):
    """An unexpected exception inside the decoder (a bug); the record is treated as undecodable."""

    reason = "internal_error"


class ProducerError(IngestError):
    """Reports could not be delivered to the broker; ``undelivered`` counts them."""

    def __init__(self, message: str, undelivered: int = 0) -> None:
        super().__init__(message)
        self.undelivered = undelivered


class BrokerError(IngestError):
    """The embedded broker could not be started or did not answer."""


class SourceError(IngestError, ValueError):
    """A source spec, file or line could not be read; the message names the file/line."""


class LedgerError(IngestError):
    """A device ledger (``ingest.device.ledger``) cannot be opened or used: not an SQLite file, another
    application's database, corrupt, or unreadable. ``path`` is the ledger file; nothing was
    sent."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


class BudgetExceeded(IngestError):
    """The device has spent its ``[privacy] reports_per_period`` in the current period
    (``ingest.device.ledger.DeviceLedger.spend``); nothing was sent and nothing was spent.

    Attributes
    ----------
    period_start : str
        Start of the period, ISO-8601 UTC (``"2026-12-02T00:00:00Z"``).
    count : int
        Fresh reports already spent in the period.
    budget : int
        ``reports_per_period``.
    needed : int
        Fresh reports the refused call would have spent.
    """

    def __init__(self, message: str, *, period_start: str, count: int, budget: int, needed: int) -> None:
        super().__init__(message)
        self.period_start = period_start
        self.count = count
        self.budget = budget
        self.needed = needed


class DeviceSecretError(IngestError):
    """A device secret file (``ingest.device.runtime.DeviceSecret``) is missing, unreadable, readable by
    group or others, or not 32 bytes of hex. ``path`` is the file; nothing was sent."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


class OutboxError(IngestError):
    """An outbox file (``ingest.device.outbox.Outbox``) cannot be opened or used: not an SQLite file,
    another application's database, corrupt, or unreadable. ``path`` is the file (``":memory:"``
    for an in-memory outbox)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


class OutboxFull(OutboxError):
    """``Outbox.put`` refused batches that would take the outbox beyond ``max_batches`` or
    ``max_bytes`` (queued plus rejected batches); nothing of the call was stored.

    Attributes
    ----------
    batches, bytes : int
        Batches and body bytes held (queued plus rejected) when the call was refused.
    max_batches, max_bytes : int
        The bounds.
    """

    def __init__(self, message: str, path: str, *, batches: int, bytes: int, max_batches: int,
                 max_bytes: int) -> None:
        super().__init__(message, path)
        self.batches = batches
        self.bytes = bytes
        self.max_batches = max_batches
        self.max_bytes = max_bytes


class SenderError(IngestError):
    """A :class:`ingest.device.sender.CollectorSender` could not deliver everything: the flush timed out,
    delivery stopped (the collector refused the token, 401), or batches were refused for good.

    Attributes
    ----------
    queued, queued_reports : int
        Batches and reports still in the outbox (they stay there; a later sender on the same
        outbox file delivers them with the same idempotency keys).
    rejected, rejected_reports : int
        Batches and reports this sender moved to the outbox's ``rejected`` table.
    """

    def __init__(self, message: str, *, queued: int = 0, queued_reports: int = 0, rejected: int = 0,
                 rejected_reports: int = 0) -> None:
        super().__init__(message)
        self.queued = queued
        self.queued_reports = queued_reports
        self.rejected = rejected
        self.rejected_reports = rejected_reports

    @property
    def undelivered(self) -> int:
        """Reports not delivered: ``queued_reports + rejected_reports``."""
        return self.queued_reports + self.rejected_reports


class TokenFileError(IngestError, ValueError):
    """A token file is missing, unreadable, readable by group or others, or malformed; the message
    names the file (and the line). Two files share it: a device's bearer token
    (``ingest.device.sender.read_token_file``: empty, or more than one token) and the collector's
    token list (``aggregator.collector.tokens``, docs/collector.md §5: a malformed line). ``path``
    is the file where the raiser names it, else None."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path
