"""Producer side of ldp-stream: telemetry schema, client-side privatizer, columnar wire codec,
Kafka producer, data sources and the embedded Tansu broker (DESIGN §4, §6, §7).
Imports ``mechanisms``; never ``aggregator``."""

from ingest.errors import BrokerError, DecodeError, IngestError, ProducerError, SchemaError

__all__ = ["BrokerError", "DecodeError", "IngestError", "ProducerError", "SchemaError"]
