"""The HTTP collector: devices POST privatized wire records, the collector checks a bearer token,
the body and an idempotency key, and forwards each body once to the reports topic
(docs/collector.md).

* :mod:`~aggregator.collector.config` — ``[collector]`` of the pipeline config;
* :mod:`~aggregator.collector.tokens` — the hashed token file, minting, rotation;
* :mod:`~aggregator.collector.ratelimit` — a token bucket per token;
* :mod:`~aggregator.collector.idempotency` — keys in flight and accepted, per token;
* :mod:`~aggregator.collector.forward` — the Kafka side: one record per body, acks bridged into
  asyncio, bytes in flight;
* :mod:`~aggregator.collector.readback` — reading the reports topic back for a batch whose
  acknowledgement was lost;
* :mod:`~aggregator.collector.readiness` — ``/readyz``: a round trip to the broker on a thread;
* :mod:`~aggregator.collector.metrics` — the Prometheus families;
* :mod:`~aggregator.collector.protocol` — uvicorn's h11 protocol with JSON refusals of malformed
  requests;
* :mod:`~aggregator.collector.app` — the starlette application and its request pipeline.
"""
