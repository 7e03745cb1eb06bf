"""Exactly-once consumer-group worker (docs/reliability.md §1), in parts with one job each.

* :mod:`aggregator.plan` — :class:`PipelineRuntime`, the query plan (decode, double, build and
  restore states), re-exported here;
* :mod:`~aggregator.worker.partition` — :class:`PartitionState`, per-partition state and marks;
* :mod:`~aggregator.worker.fold` — :class:`Folder`: dedupe, dead-letter, decode, double, update;
* :mod:`~aggregator.worker.threads` — :class:`OverlapThreads`, the fold and update threads;
* :mod:`~aggregator.worker.checkpointing` — :class:`Checkpointer`, publish → acknowledge →
  commit;
* :mod:`~aggregator.worker.loop` — :class:`Worker`, the run loop and rebalance handling;
* :mod:`~aggregator.worker.build` — :func:`worker_from_config`, the worker and its Kafka clients;
* :mod:`aggregator.topics` — :func:`ensure_topics`, re-exported here.
"""

from aggregator.plan import PipelineRuntime
from aggregator.topics import ensure_topics
from aggregator.worker.build import worker_from_config
from aggregator.worker.checkpointing import Checkpointer, InFlight, Published, SendOutcome
from aggregator.worker.fold import Folder
from aggregator.worker.loop import DEFAULT_MAX_POLL_RECORDS, KafkaClients, Worker
from aggregator.worker.partition import Mark, PartitionState
from aggregator.worker.threads import OverlapThreads
from ingest.client.batch import concat_batches

__all__ = [
    "DEFAULT_MAX_POLL_RECORDS",
    "Checkpointer",
    "Folder",
    "InFlight",
    "KafkaClients",
    "Mark",
    "OverlapThreads",
    "PartitionState",
    "PipelineRuntime",
    "Published",
    "SendOutcome",
    "Worker",
    "concat_batches",
    "ensure_topics",
    "worker_from_config",
]
