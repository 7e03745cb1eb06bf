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


class CLIError(AggregatorError):
    """A command-line usage error; printed as one line, exit status 2."""


class DemoError(AggregatorError):
    """The demo could not run (a child process died, the broker did not start, …)."""


class CheckpointError(StateError):
    """A state-topic record is not a valid checkpoint (bad magic, version, lengths or header), or
    a checkpoint does not fit the pipeline (another schema fingerprint or query set)."""


class StoppedDuringStartup(AggregatorError):
    """SIGTERM or SIGINT before ``ldp-stream work`` consumes (imports, compiling, topic set-up):
    nothing to checkpoint; ``args[0]`` is the signal number."""
