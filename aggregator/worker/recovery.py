"""The worker's two ways of folding a partition again (docs/reliability.md §2, §9): a partition
whose update a state refused is restored from its last durable checkpoint and its records are
folded one at a time (:meth:`Recovery.recover_rejected`); a partition whose fetch left out
offsets is fetched once more from the first of them (:meth:`Recovery.refetch_gaps`). Both run on
the main thread, after the fold in flight, as methods of :class:`aggregator.worker.loop.Worker`.
"""

from __future__ import annotations

import logging

log = logging.getLogger("aggregator.worker")


class Recovery:
    """Mixin of :class:`~aggregator.worker.loop.Worker` (uses its ``owned``, ``folder``,
    ``consumer``, ``lock``, ``threads``, ``pending``, ``metrics`` and ``reports_topic``)."""

    def recover_rejected(self) -> int:
        """Replace every owned partition whose update was rejected (a state raised on its
        data, :attr:`PartitionState.rejected`): wait for the fold and update threads and the
        checkpoint on its way, drop the partition, pause it and restore it from its last
        durable checkpoint at the next :meth:`restore_pending`; its records up to the rejected
        batch's end are then folded one at a time and the one a state refuses is dead-lettered
        (:meth:`Folder.fold_carefully`, docs/reliability.md §9). Main thread; returns the
        number of partitions dropped."""
        if not any(ps.rejected is not None for ps in list(self.owned.values())):
            return 0
        from kafka import TopicPartition

        self._wait_fold()
        with self.lock:
            self.threads.drain()
        self._check_checkpoint(block=True)  # its offsets are committed before the restore reads it
        dropped = 0
        with self.lock:
            for p, ps in list(self.owned.items()):
                if ps.rejected is None:
                    continue
                end, error = ps.rejected
                del self.owned[p]
                self.folder.careful[p] = max(end, self.folder.careful.get(p, 0))
                tp = TopicPartition(self.reports_topic, p)
                if tp in self.consumer.assignment():
                    self.consumer.pause(tp)
                    self.pending.add(tp)
                self.metrics.rejected_updates.labels(partition=str(p)).inc()
                dropped += 1
                log.error("partition %d: a state refused an update (%s); restoring it from its last "
                          "checkpoint (offset %s) and folding its records up to offset %d one at a "
                          "time, the refused record goes to the dead-letter topic", p, error,
                          ps.published_offset if ps.published_offset is not None else 0, end)
            self.metrics.owned.set(len(self.owned))
        return dropped

    def refetch_gaps(self) -> None:
        """Seek every owned partition whose last fold met a gap (:attr:`Folder.refetch`) back to
        the gap's first offset, once (main thread): the fold that noted it is waited for first,
        so every record folded after this was fetched after the seek."""
        folder = self.folder
        if folder is None or all(seeked for _, seeked in folder.refetch.values()):
            return
        from kafka import TopicPartition

        self._wait_fold()
        with self.lock:
            for p, entry in list(folder.refetch.items()):
                if entry[1]:
                    continue
                tp = TopicPartition(self.reports_topic, p)
                if p not in self.owned or tp not in self.consumer.assignment():
                    del folder.refetch[p]  # its next owner restores and seeks
                    continue
                self.consumer.seek(tp, entry[0])
                entry[1] = True
