"""Exception root of the ``aggregator`` package."""


class AggregatorError(Exception):
    """Root of every error raised by ``aggregator``."""


class ConfigError(AggregatorError, ValueError):
    """A pipeline configuration or query is invalid; the message names the offending key."""


class StateError(AggregatorError, ValueError):
    """A serialized state could not be restored or two states cannot be merged."""


class CLIError(AggregatorError):
    """A command-line usage error; printed as one line, exit status 2."""
