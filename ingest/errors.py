"""Errors of the ``ingest`` package; its root :class:`IngestError` derives from the project's root
:class:`mechanisms.errors.LdpStreamError`."""

from mechanisms.errors import ConfigError as ConfigError  # the one ConfigError, re-exported
from mechanisms.errors import LdpStreamError as LdpStreamError


class IngestError(LdpStreamError):
    """Root of every error raised by ``ingest``."""


class SchemaError(IngestError, ValueError):
    """A schema is invalid, or an event does not fit its schema. The message names the field."""


class DecodeError(IngestError, ValueError):
    """A wire record could not be decoded; subclasses say why (see ``ingest.codec``).

    ``reason`` is a short machine-readable label used for dead-letter metrics.
    """

    reason = "malformed"


class ProducerError(IngestError):
    """Reports could not be delivered to the broker; ``undelivered`` counts them."""

    def __init__(self, message: str, undelivered: int = 0) -> None:
        super().__init__(message)
        self.undelivered = undelivered


class BrokerError(IngestError):
    """The embedded broker could not be started or did not answer."""
