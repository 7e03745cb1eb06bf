"""Building a :class:`~aggregator.worker.loop.Worker` from a pipeline config: its plan and its
Kafka clients (:mod:`ingest.kafka.clients`, with the ``[kafka]`` settings)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregator.checkpoint import StateTopicReader
from aggregator.metrics import WorkerMetrics
from aggregator.plan import PipelineRuntime
from aggregator.worker.loop import DEFAULT_MAX_POLL_RECORDS, KafkaClients, Worker
from ingest.kafka.clients import consumer_client, producer_client

if TYPE_CHECKING:
    from aggregator.config import PipelineConfig

__all__ = ["worker_from_config"]


def worker_from_config(config: PipelineConfig, *, group_id: str | None = None,
                       metrics: WorkerMetrics | None = None, coalesce: bool = True,
                       max_poll_records: int = DEFAULT_MAX_POLL_RECORDS, overlap: bool = True) -> Worker:
    """Build a :class:`Worker` and its clients from a :class:`aggregator.config.PipelineConfig`.

    The group consumer (``group_id``, :data:`ingest.kafka.settings.FAST_GROUP_SETTINGS`, no auto-commit,
    from the earliest offset, ``max_poll_records``), the producer of checkpoints and dead letters
    (``acks="all"``, requests large enough for ``[worker] max_record_bytes``, ``linger_ms`` 5
    and 1 MiB batches) and the state-topic
    reader all carry the ``[kafka]`` settings (TLS, SASL). Also applies ``[worker]
    malloc_trim_threshold_mib`` to this process's allocator
    (:func:`ingest.kafka.allocator.keep_freed_memory`):
    the consumer's fetch buffers are then reused rather than page-faulted in again for every
    fetch response.

    The clients are built when the worker opens (:meth:`Worker.open`, at the start of
    :meth:`Worker.run`): kafka-python clients connect when they are built.

    Raises
    ------
    ConfigError
        On any invalid setting (propagated).
    """
    from ingest.kafka.allocator import keep_freed_memory

    runtime = PipelineRuntime.from_config(config)
    w = config.worker
    keep_freed_memory(w.malloc_trim_threshold_mib << 20)
    group = group_id or w.group_id
    settings, state_topic = config.kafka, config.topics.state

    def clients() -> KafkaClients:
        return KafkaClients(
            consumer=consumer_client(settings, group_id=group, fast_group=True, enable_auto_commit=False,
                                     auto_offset_reset="earliest", max_poll_records=max_poll_records),
            # linger 5 ms: the pane records of windowed queries go out in a few batches, not one
            # wake-up of kafka-python's sender per record
            producer=producer_client(settings, max_request_size=max(w.max_record_bytes + 65536, 1048576),
                                     linger_ms=5, batch_size=1 << 20),
            reader=StateTopicReader.connect(settings, state_topic, runtime.name),
        )

    return Worker(
        runtime, clients,
        reports_topic=config.topics.reports, state_topic=config.topics.state,
        dead_letter_topic=config.topics.dead_letter, group_id=group,
        checkpoint_interval_s=w.checkpoint_interval_s, checkpoint_reports=w.checkpoint_reports,
        max_record_bytes=w.max_record_bytes, coalesce=coalesce, max_poll_records=max_poll_records,
        overlap=overlap, metrics=metrics, max_event_time_skew_s=w.max_event_time_skew_s,
    )
