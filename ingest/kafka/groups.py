"""Consumer groups: :func:`close_without_leaving` closes a group consumer without sending
``LeaveGroup`` (a leave while the member's join is pending wedges the group on Tansu,
docs/kafka.md §2.3)."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["close_without_leaving"]


def close_without_leaving(consumer: Any, timeout_ms: int | None = None) -> bool:
    """Close a group consumer without sending ``LeaveGroup``; for a member stopped during a group
    join (its first, or a rejoin after its partitions were revoked).

    On Tansu 0.6.0 a ``LeaveGroup`` sent while the member's ``JoinGroup`` is pending leaves the
    group looping in ``SyncGroup … coordinator rebalance`` for good: every other member of that
    group stays without partitions (docs/kafka.md §2.3). A member that
    just disconnects is dropped by the broker after ``session_timeout_ms``, as after a crash, and
    the group recovers. On Apache Kafka the cost is that the rebalance waits up to
    ``session_timeout_ms`` longer for the departed member; it owned no partitions (they were
    revoked), so nothing else changes.

    kafka-python 3.0's ``close()`` has no option to skip the leave. It skips it for a member whose
    generation has no member id, so this clears the coordinator's generation
    (``reset_generation``, its own API for a member that fell out of the group) first, then calls
    ``consumer.close(autocommit=False, timeout_ms=timeout_ms)``.

    Parameters
    ----------
    consumer : kafka.KafkaConsumer
        A subscribed consumer (any other object: only ``close(autocommit=False, …)`` is called).
    timeout_ms : int or None
        Passed to ``close``: how long it may wait for the broker (None: kafka-python's default).

    Returns
    -------
    bool
        Whether the generation could be cleared (False: this kafka-python has no coordinator
        attribute or ``reset_generation``; ``close`` then sends ``LeaveGroup`` as usual).

    Raises
    ------
    Exception
        Whatever ``consumer.close`` raises.
    """
    cleared = False
    reset = getattr(getattr(consumer, "_coordinator", None), "reset_generation", None)
    if callable(reset):
        try:
            reset()
            cleared = True
        except Exception:  # pragma: no cover - defensive: fall back to a normal close
            logger.debug("reset_generation failed; closing with LeaveGroup", exc_info=True)
    consumer.close(autocommit=False, timeout_ms=timeout_ms)
    return cleared
