"""Exception root of the ``mechanisms`` package."""


class MechanismError(Exception):
    """Root of every error raised by ``mechanisms``."""


class ParameterError(MechanismError, ValueError):
    """A parameter or an input array is outside its allowed range.

    The message names the argument and the allowed range, e.g.
    ``zero_prob must be in (0, 1), got 1.2``.
    """


class ConvergenceWarning(UserWarning):
    """An optimiser stopped without meeting its convergence criterion."""
