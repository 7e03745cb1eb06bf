"""Producer side of ldp-stream, in four rooms: ``ingest.client`` (schema, privatizer, wire codec,
sources, paced sending), ``ingest.device`` (the device runtime: ledger, outbox, HTTP sender),
``ingest.kafka`` (client settings, clients, topics, the report producer) and ``ingest.local`` (the
embedded Tansu broker, process helpers); ``errors``, ``model``, ``files`` and ``jit`` serve them
all (docs/architecture.md). Imports ``mechanisms``; never ``aggregator``."""

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
