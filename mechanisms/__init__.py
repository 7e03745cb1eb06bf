"""Pure mathematics of ldp-stream: local-DP samplers and randomizers, corrected losses,
M-estimators and privacy accounting (docs/mechanisms.md, docs/frequency.md, docs/privacy.md).
No I/O; imports neither ``ingest`` nor ``aggregator``."""

from mechanisms.errors import ConfigError, ConvergenceWarning, LdpStreamError, MechanismError, ParameterError

__all__ = ["ConfigError", "ConvergenceWarning", "LdpStreamError", "MechanismError", "ParameterError"]
