"""Exception root of the ``ingest`` package."""


class IngestError(Exception):
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


class ConfigError(IngestError, ValueError):
    """A client, producer or broker parameter is out of range; the message names the argument."""
