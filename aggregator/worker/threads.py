"""The worker's overlap threads: ``ldp-fold`` folds one poll while the main thread fetches the
next, ``ldp-update`` runs the state updates (one in flight) while the fold thread goes on.

A state that raises an ``Exception`` while updating a partition marks that partition
(:attr:`PartitionState.rejected`): its states are never checkpointed again and later updates of
it are skipped, while the other partitions go on; the worker folds its records again from the last
checkpoint (docs/reliability.md §9). Anything else (a ``BaseException`` that is not an
``Exception``, or a failure outside a partition's update) is kept as :attr:`OverlapThreads.failure`:
offsets have already moved past that batch, so no checkpoint may follow it (the worker stops and
its restart replays from the last checkpoint).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from aggregator.worker.partition import PartitionState
from ingest.client.batch import ReportBatch

__all__ = ["OverlapThreads"]


class OverlapThreads:
    """The fold and update threads of one worker, and the update queue between them.

    Parameters
    ----------
    enabled : bool
        Whether :meth:`start` starts the threads (``False``: everything runs inline in the
        calling thread).

    Attributes
    ----------
    failure : BaseException or None
        The first failure that is not a partition's rejected update: no checkpoint may be
        published after it.
    folder, updater : ThreadPoolExecutor or None
        The ``ldp-fold`` and ``ldp-update`` threads while started.

    Notes
    -----
    :meth:`apply` (on the update thread) and :meth:`wait_one` (the fold or main thread waiting
    for it) are looked up on the instance at each call, so a benchmark may wrap them to time the
    phases.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = bool(enabled)
        self.failure: BaseException | None = None
        self.folder: ThreadPoolExecutor | None = None
        self.updater: ThreadPoolExecutor | None = None
        self._inflight: deque[Future] = deque()  # guarded by the worker's lock
        self._fold_tasks: deque[Future] = deque()  # the fold thread's tasks (main thread only)

    def start(self) -> None:
        """Start both threads (if enabled and not started)."""
        if self.enabled and self.updater is None:
            self.updater = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ldp-update")
            self.folder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ldp-fold")

    def shutdown(self) -> None:
        """Wait for the threads' tasks and stop them: the fold thread first (it submits updates)."""
        for attr in ("folder", "updater"):
            pool = getattr(self, attr)
            if pool is not None:
                pool.shutdown(wait=True)
                setattr(self, attr, None)

    def record_failure(self, exc: BaseException) -> None:
        """Remember ``exc`` as the failure (the first one wins)."""
        if self.failure is None:
            self.failure = exc

    def raise_failure(self) -> None:
        """Raise the recorded failure, if any."""
        if self.failure is not None:
            raise self.failure

    # ----------------------------------------------------------------------------- updates
    def update(self, ps: PartitionState, batch: ReportBatch, x2: np.ndarray) -> None:
        """Fold a batch into the states of ``ps`` (whose ``next_offset`` is already past the
        batch's records): inline, or on the update thread with at most one update in flight
        (the caller holds the worker's lock)."""
        self.raise_failure()
        if self.updater is None:
            self.apply(ps, batch, x2, ps.next_offset)
            return
        self._inflight.append(self.updater.submit(self.apply, ps, batch, x2, ps.next_offset))
        while len(self._inflight) > 1:
            self.wait_one()

    def apply(self, ps: PartitionState, batch: ReportBatch, x2: np.ndarray, end: int) -> None:
        """Update every state of ``ps`` with the batch (the reports of records below offset
        ``end``). A state's ``Exception`` sets ``ps.rejected = (end, error)`` and returns; an
        update of a partition already rejected is skipped; any other failure is recorded
        (no checkpoint after it) and raised."""
        if ps.rejected is not None:
            return  # its states are discarded: the worker folds these records again
        try:
            for st in ps.states.values():
                st.update(batch, x2)
        except Exception as exc:
            ps.rejected = (end, f"{type(exc).__name__}: {exc}")
        except BaseException as exc:
            # offsets already moved past this batch: publishing any later checkpoint would lose
            # it, so the worker must stop without one (its restart replays from the last)
            self.failure = exc
            raise

    def submit_after_updates(self, fn: Callable, *args) -> Future:
        """Run ``fn(*args)`` on the update thread behind the updates submitted so far; a drain
        waits for it too (the caller holds the worker's lock)."""
        fut = self.updater.submit(fn, *args)
        self._inflight.append(fut)
        return fut

    def wait_one(self) -> None:
        """Wait for the oldest task on the update thread (re-raising its failure)."""
        self._inflight.popleft().result()

    def drain(self) -> None:
        """Wait until every submitted update is folded in (re-raising a failed one)."""
        while self._inflight:
            self.wait_one()
        self.raise_failure()

    # ------------------------------------------------------------------------------- folds
    def submit_fold(self, fn: Callable, *args) -> None:
        """Hand ``fn(*args)`` to the fold thread (main thread only)."""
        self._fold_tasks.append(self.folder.submit(fn, *args))

    def collect(self, block: bool, on_result: Callable) -> None:
        """Handle the fold thread's finished tasks in order — all of them (``block``), or those
        already done — calling ``on_result`` with each result (re-raising a failed task's
        error); main thread only, never under the worker's lock."""
        while self._fold_tasks and (block or self._fold_tasks[0].done()):
            on_result(self._fold_tasks.popleft().result())
