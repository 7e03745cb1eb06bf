"""Consumer side of ldp-stream: per-partition state, online estimators, exactly-once workers, checkpoints,
merge/serve, metrics and the CLI (docs/architecture.md; docs/mechanisms.md §6, docs/reliability.md §1,
docs/deploy.md). Imports ``mechanisms`` and ``ingest``."""

from aggregator.errors import AggregatorError, ConfigError, LdpStreamError, StateError

__all__ = ["AggregatorError", "ConfigError", "LdpStreamError", "StateError"]
