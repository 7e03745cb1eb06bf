"""Errors of the ``aggregator`` package; its root :class:`AggregatorError` derives from the
project's root :class:`mechanisms.errors.LdpStreamError`."""

from mechanisms.errors import ConfigError as ConfigError  # the one ConfigError, re-exported
from mechanisms.errors import LdpStreamError as LdpStreamError


class AggregatorError(LdpStreamError):
    """Root of every error raised by ``aggregator``."""


class StateError(AggregatorError, ValueError):
    """A serialized state could not be restored or two states cannot be merged."""


class EmptyStateError(StateError):
    """``estimate()`` was called on a state that has not seen enough reports."""


class UpdateRejectedError(StateError):
    """A state raised while a record's reports were folded in; the record is dead-lettered with
    reason ``state_rejected`` and the states are rolled back (docs/reliability.md §9)."""


class CLIError(AggregatorError):
    """A command-line usage error; printed as one line, exit status 2."""


class DemoError(AggregatorError):
    """The demo could not run (a child process died, the broker did not start, …)."""


class ChildExited(DemoError):
    """A child exited while the demo needed it; the message has its status and log tail.

    ``child`` is an :class:`aggregator.demo.children.Child` (``name``, ``proc``, ``log_path``,
    ``tail()``), kept as the attribute ``child``.
    """

    def __init__(self, child) -> None:
        self.child = child
        tail = child.tail()
        super().__init__(f"{child.name} exited with status {child.proc.returncode}; "
                         + (f"last lines of {child.log_path}:\n{tail}" if tail else
                            f"its log {child.log_path} is empty"))


class CheckpointError(StateError):
    """A state-topic record is not a valid checkpoint (bad magic, version, lengths or header), or
    a checkpoint does not fit the pipeline (another schema fingerprint or query set)."""


class StoppedDuringStartup(AggregatorError):
    """SIGTERM or SIGINT before ``ldp-stream work`` consumes (imports, compiling, topic set-up):
    nothing to checkpoint; ``args[0]`` is the signal number."""


class CollectorError(AggregatorError):
    """Root of the HTTP collector's errors (``ldp-stream collect``, docs/collector.md)."""


class RequestRefused(CollectorError):
    """A collector request is answered with an error: ``code`` (a key of
    ``ingest.device.http_protocol.ERROR_CODES`` or a decoder reason), HTTP ``status``, the ``reason``
    sent to the client and, for 429/503, ``retry_after`` whole seconds (docs/collector.md §2)."""

    def __init__(self, code: str, reason: str, *, status: int | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(f"{code}: {reason}")
        from ingest.device.http_protocol import ERROR_CODES

        self.code = code
        self.reason = reason
        self.status = status if status is not None else ERROR_CODES[code]
        self.retry_after = retry_after
