"""Exception root of ldp-stream and of the ``mechanisms`` package.

Every error the project raises derives from :class:`LdpStreamError`; each package has its own
subclass (``MechanismError`` here, ``ingest.errors.IngestError``,
``aggregator.errors.AggregatorError``). :class:`ConfigError` is the one configuration error of all
three packages: ``ingest.errors.ConfigError`` and ``aggregator.errors.ConfigError`` are this class.
"""


class LdpStreamError(Exception):
    """Root of every error raised by ldp-stream (``mechanisms``, ``ingest`` and ``aggregator``)."""


class ConfigError(LdpStreamError, ValueError):
    """A configuration value, client, producer, broker or query parameter is invalid.

    The message names the offending key or argument. Re-exported as ``ingest.errors.ConfigError``
    and ``aggregator.errors.ConfigError``, so one ``except ConfigError`` catches every package's.
    """


class MechanismError(LdpStreamError):
    """Root of every error raised by ``mechanisms``."""


class ParameterError(MechanismError, ValueError):
    """A parameter or an input array is outside its allowed range.

    The message names the argument and the allowed range, e.g.
    ``zero_prob must be in (0, 1), got 1.2``.
    """


class ConvergenceWarning(UserWarning):
    """An optimiser stopped without meeting its convergence criterion."""
