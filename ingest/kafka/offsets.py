"""Offsets: :func:`high_watermarks`, the end offsets of partitions, honouring Tansu's too-small
``end_offsets()`` (docs/kafka.md §2.2)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["high_watermarks"]


def high_watermarks(consumer: Any, partitions: Iterable[Any] | None = None, *,
                    timeout_ms: int = 5000) -> dict[Any, int]:
    """End offset (offset of the next record to be written) per partition, robust to Tansu.

    Tansu's ``ListOffsets(latest)`` — what ``consumer.end_offsets()`` asks — returns the last
    batch's base offset + 1, too small when the last produced batch held several records
    (docs/kafka.md §2.2). The high watermark carried in fetch responses (``consumer.highwater(tp)``, known
    after a ``poll()``/fetch of that partition) is right. This returns, per partition,
    ``max(highwater, end_offsets)`` — correct on Apache Kafka (where both agree) and a lower bound
    that becomes exact once the partition has been fetched on Tansu.

    Parameters
    ----------
    consumer : kafka.KafkaConsumer
        A consumer with the partitions assigned (``assign`` or group assignment).
    partitions : iterable of TopicPartition, optional
        Defaults to ``consumer.assignment()``.
    timeout_ms : int
        Timeout of the ``end_offsets`` request.

    Returns
    -------
    dict TopicPartition → int
        Offsets (>= 0). To "read to the end", poll until ``position(tp) >= high_watermarks()[tp]``
        *after* at least one fetch of ``tp`` returned (the fetch refreshes the watermark).
    """
    tps = list(consumer.assignment() if partitions is None else partitions)
    if not tps:
        return {}
    try:
        listed = consumer.end_offsets(tps, timeout_ms=timeout_ms)
    except TypeError:  # older kafka-python without timeout_ms
        listed = consumer.end_offsets(tps)
    out: dict[Any, int] = {}
    for tp in tps:
        hw = None
        try:
            hw = consumer.highwater(tp)
        except Exception:  # partition not assigned: only the listed offset is available
            hw = None
        out[tp] = max(int(listed.get(tp) or 0), int(hw or 0))
    return out
