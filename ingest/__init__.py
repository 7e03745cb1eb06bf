"""Producer side of ldp-stream: telemetry schema, client-side privatizer, columnar wire codec,
Kafka producer, data sources and the embedded Tansu broker (docs/schema.md, docs/wire-format.md,
docs/kafka.md). Imports ``mechanisms``; never ``aggregator``."""

from ingest.errors import (
    BrokerError,
    ConfigError,
    DecodeError,
    IngestError,
    LdpStreamError,
    ProducerError,
    SchemaError,
)

__all__ = ["BrokerError", "ConfigError", "DecodeError", "IngestError", "LdpStreamError", "ProducerError",
           "SchemaError"]
