"""The pipeline's topics: reports, state (compacted where the broker allows) and dead-letter."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ingest.kafka.topics import ensure_topic

if TYPE_CHECKING:
    from aggregator.config import PipelineConfig

__all__ = ["STATE_TOPIC_CONFIG", "ensure_topics"]

log = logging.getLogger(__name__)


#: Configuration of a state topic the pipeline creates.
STATE_TOPIC_CONFIG = {"cleanup.policy": "compact", "max.message.bytes": str(16 * 1024 * 1024)}


def ensure_topics(config: PipelineConfig) -> None:
    """Create the pipeline's reports (``topics.partitions``), state and dead-letter topics if
    missing (:func:`ingest.kafka.topics.ensure_topic`, with the ``[kafka]`` settings). The state topic is
    created with :data:`STATE_TOPIC_CONFIG` where the broker allows: ``cleanup.policy=compact`` (one
    checkpoint per key is all a reader needs) and ``max.message.bytes`` of 16 MiB (a checkpoint holds
    the regressions' warm-up reports, up to a few MiB; Kafka's default limit is 1 MB).

    Raises
    ------
    ingest.errors.IngestError
        If the broker is unreachable or a topic does not appear in time.
    """
    topics, settings = config.topics, config.kafka
    ensure_topic(settings, topics.reports, topics.partitions)
    try:
        ensure_topic(settings, topics.state, 1, STATE_TOPIC_CONFIG)
    except Exception as exc:
        log.info("state topic with cleanup.policy=compact refused (%s); creating it plain", exc)
        ensure_topic(settings, topics.state, 1)
    ensure_topic(settings, topics.dead_letter, 1)
