"""Per-partition state of the worker: the query states with ``next_offset`` and the marks a
checkpoint is taken at (docs/reliability.md §1.1)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aggregator.checkpoint import Checkpoint
from aggregator.plan import PipelineRuntime

__all__ = ["Mark", "PartitionState"]


@dataclass(frozen=True)
class Mark:
    """A partition's ``next_offset`` with its report and record counts at that offset."""

    next_offset: int
    reports: int
    records: int


@dataclass
class PartitionState:
    """The state of one owned reports partition.

    Attributes
    ----------
    partition : int
    next_offset : int
        First offset not folded into ``states``.
    states : dict str → state
        One state per query.
    reports : int
        Reports folded in (all time, restored from the checkpoint).
    records : int
        Records folded in (all time).
    published_offset : int or None
        ``next_offset`` of the last checkpoint of this partition known to be durable (restored
        from, or acknowledged by the broker); ``None``: none yet.
    rejected : tuple of (int, str) or None
        Set when a state refused an update or a fold failed (docs/reliability.md §9):
        ``(end, error)`` — the records below offset ``end`` must be folded again one at a time
        from the last durable checkpoint, and ``error`` is what was raised. Such a state is never
        checkpointed again; the worker replaces it (:meth:`Worker.recover_rejected`).
    """

    partition: int
    next_offset: int
    states: dict = field(default_factory=dict)
    reports: int = 0
    records: int = 0
    published_offset: int | None = None
    rejected: tuple[int, str] | None = None

    @property
    def dirty(self) -> bool:
        """Whether the durable checkpoint is behind ``next_offset`` (or there is none)."""
        return self.next_offset != self.published_offset

    def mark(self) -> Mark:
        """Where the partition stands now: ``next_offset`` and the counts that go with it."""
        return Mark(self.next_offset, self.reports, self.records)

    def to_checkpoint(self, runtime: PipelineRuntime, mark: Mark | None = None) -> Checkpoint:
        """Serialize into a :class:`Checkpoint` of ``runtime``'s pipeline: the states with
        ``mark``'s offset and counts (default: :meth:`mark` now). The caller makes sure the states
        hold exactly the records below ``mark.next_offset`` (the update thread, in order)."""
        m = self.mark() if mark is None else mark
        return Checkpoint(
            pipeline=runtime.name, partition=self.partition, next_offset=m.next_offset,
            reports=m.reports, records=m.records, fingerprint=runtime.fingerprint,
            states={name: st.to_bytes() for name, st in self.states.items()}, created=time.time(),
        )

    def __repr__(self) -> str:
        return (f"PartitionState(partition={self.partition}, next_offset={self.next_offset}, "
                f"reports={self.reports}, queries={list(self.states)})")
