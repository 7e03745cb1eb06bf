"""The pipeline's topics: reports, state (compacted where the broker allows) and dead-letter."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ingest.kafka import ensure_topic

if TYPE_CHECKING:
    from aggregator.config import PipelineConfig

__all__ = ["ensure_topics"]

log = logging.getLogger(__name__)


def ensure_topics(config: PipelineConfig) -> None:
    """Create the pipeline's reports (``topics.partitions``), state and dead-letter topics if
    missing (:func:`ingest.kafka.ensure_topic`, with the ``[kafka]`` settings). The state topic is
    created with ``cleanup.policy=compact`` where the broker allows: one checkpoint per key is all
    a reader needs.

    Raises
    ------
    ingest.errors.IngestError
        If the broker is unreachable or a topic does not appear in time.
    """
    topics, settings = config.topics, config.kafka
    ensure_topic(settings, topics.reports, topics.partitions)
    try:
        ensure_topic(settings, topics.state, 1, {"cleanup.policy": "compact"})
    except Exception as exc:
        log.info("state topic with cleanup.policy=compact refused (%s); creating it plain", exc)
        ensure_topic(settings, topics.state, 1)
    ensure_topic(settings, topics.dead_letter, 1)
