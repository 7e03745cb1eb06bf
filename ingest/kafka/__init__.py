"""Talking to a Kafka-protocol broker: client settings (:mod:`~ingest.kafka.settings`), the clients
built from them (:mod:`~ingest.kafka.clients`), topics, offsets, consumer groups, the producer's
transport and the report producer, and the allocator tuning of a consumer process. Every Kafka
client of the project goes through here, so security settings and the Tansu quirks of
docs/kafka.md §2 are handled in one place."""
