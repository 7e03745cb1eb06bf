"""Producer side of ldp-stream: telemetry schema, client-side privatizer, columnar wire codec,
Kafka producer, data sources and the embedded Tansu broker (DESIGN §4, §6, §7).
Imports ``mechanisms``; never ``aggregator``."""

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
