"""Event-time windows of any query: one state per pane, watermark, late reports (docs/windows.md §2–§3).

A windowed query keeps, per partition, one state of its kind per *pane* — the interval
``[start, start + hop)`` with ``start`` a multiple of ``hop`` seconds since the Unix epoch, UTC.
A window ``[w, w + size)`` is the merge of its ``size/hop`` panes, so hopping windows cost no more
state than tumbling ones.

The partition's *watermark* is the largest event time seen minus ``grace``. Reports are taken in
offset order: report *i* is **late** when its pane's end is ≤ the watermark of the reports before
it, so whether a report is late depends on the reports alone, not on how they were batched (a
replay is bit-identical). A late report is counted (:attr:`WindowedState.late`, checkpointed) and
not folded in. A pane whose end is ≤ the watermark is **closed**: it moves to
:attr:`WindowedState.closed` until the worker has published it under its own state-topic key
(:func:`aggregator.windows.pane_key`) and the broker acknowledged that record; the checkpoint
after that drops it (:meth:`WindowedState.settle`). Closed panes past the retention are deleted
from the state topic by tombstones.
"""

from __future__ import annotations

import numpy as np

from aggregator.errors import EmptyStateError, StateError
from aggregator.state.base import Estimate, State
from ingest.client.batch import ReportBatch, concat_batches, slice_batch
from ingest.client.event_time import floor_to

__all__ = ["WindowedState", "split_rows", "window_starts"]

#: The max event time before the first report: far below any event time (no overflow − grace).
_NEVER = -(1 << 62)


def window_starts(panes, size_s: int, hop_s: int) -> list[int]:
    """Starts of the windows of length ``size_s`` (a multiple of ``hop_s``) that contain any of
    the pane starts ``panes`` (multiples of ``hop_s``), ascending."""
    return sorted({int(p) - j * hop_s for p in panes for j in range(size_s // hop_s)})


def _run(idx: np.ndarray) -> slice | None:
    """``idx`` (increasing positions) as a slice when it is one run of consecutive positions."""
    if idx.size and idx[-1] - idx[0] + 1 == idx.size:
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return None


def split_rows(batch: ReportBatch, idx: np.ndarray) -> ReportBatch:
    """The reports ``idx`` (increasing positions) of ``batch``, as slices of its runs of
    consecutive positions (one slice when ``idx`` is one run: the usual case of reports in
    event-time order)."""
    if idx.size == batch.n:
        return batch
    run = _run(idx)
    if run is not None:
        return slice_batch(batch, run.start, run.stop)
    cuts = np.flatnonzero(np.diff(idx) != 1) + 1
    runs = np.split(idx, cuts)
    return concat_batches([slice_batch(batch, int(r[0]), int(r[-1]) + 1) for r in runs])


def _by_pane(panes: np.ndarray, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``[(pane start, its rows)]`` of ``rows`` (increasing) by ``panes`` (their pane starts),
    panes ascending, each pane's rows increasing; one pass over runs when the panes are in
    order (reports in event-time order), a stable sort otherwise."""
    if rows.size == 0:
        return []
    if panes[0] == panes[-1] and (panes.size < 3 or (panes == panes[0]).all()):
        return [(int(panes[0]), rows)]
    if not (panes[1:] >= panes[:-1]).all():
        order = np.argsort(panes, kind="stable")
        panes, rows = panes[order], rows[order]
    cuts = np.flatnonzero(panes[1:] != panes[:-1]) + 1
    firsts = np.concatenate(([0], cuts))
    return list(zip(panes[firsts].tolist(), np.split(rows, cuts), strict=True))


class WindowedState(State):
    """Per-pane states of a query with ``window`` (docs/windows.md §2–§3).

    Parameters
    ----------
    query : Query
        Any query kind with a :class:`aggregator.queries.WindowSpec` ``window``.
    schema : TelemetrySchema
    loss : loss object, optional
        A custom query's resolved loss (passed to every pane state).

    Attributes
    ----------
    panes : dict int → State
        Open panes by start (Unix seconds).
    closed : dict int → State
        Closed panes whose pane record is not yet known to be durable.
    retained : set of int
        Starts of panes with a durable pane record that are not yet deleted (tombstoned).
    tombstones : set of int
        Pane records due for deletion whose tombstone is not yet known to be durable.
    max_event_time : int or None
        Largest event time folded or seen (late reports count: they are in the stream).
    late : int
        Reports not folded because their pane was closed (all time, checkpointed).
    late_listener : callable (int) → None or None
        Called with the number of late reports of each update (the worker's
        ``ldp_reports_late_total{query}``); not serialized.

    Raises
    ------
    ConfigError
        If the query has no window or does not fit the schema.
    StateError
        From :meth:`update`, if the batch has no event times.
    """

    kinds = ()  # built for any kind that has a window (aggregator.state.registry.state_class)

    def __init__(self, query, schema, *, loss=None) -> None:
        from aggregator.errors import ConfigError
        from aggregator.state.registry import STATE_CLASSES, construct

        super().__init__(query, schema)
        spec = self.query.window
        if spec is None:
            raise ConfigError(f"queries.{self.query.name}: a WindowedState needs a query with a window")
        self.size_s, self.hop_s = spec.size_s, spec.hop_s
        self.grace_s, self.retention_s = spec.grace_s, spec.retention_s
        self.inner_class = STATE_CLASSES[self.query.kind]
        self._loss = loss
        self.panes: dict[int, State] = {}
        self.closed: dict[int, State] = {}
        self._blobs: dict[int, bytes] = {}  # serialized closed panes (they change only by merges)
        self.retained: set[int] = set()
        self.tombstones: set[int] = set()
        self.max_event_time: int | None = None
        self.late = 0
        self.late_listener = None
        self._sent: dict[tuple[str, int], int] = {}  # (kind, start) → next_offset of its send
        # the query must fit the schema (fails here); new panes are empty copies of this one
        self._blank = construct(self.inner_class, self.query, self.schema, self._loss)

    # ------------------------------------------------------------------------------ panes
    def new_pane(self) -> State:
        """An empty state of the query's kind (one pane)."""
        return self._blank.empty_copy()

    @property
    def watermark(self) -> int | None:
        """``max_event_time − grace`` (None before the first report)."""
        return None if self.max_event_time is None else self.max_event_time - self.grace_s

    def _update(self, batch, x2) -> None:
        t = batch.event_time
        if t is None:
            raise StateError(f"windowed query {self.name!r} needs event times (ReportBatch.event_time)")
        hop, n = self.hop_s, batch.n
        prev = _NEVER if self.max_event_time is None else self.max_event_time
        # the watermark before each report: the max event time of the reports before it
        seen = np.maximum.accumulate(t)
        before = np.empty(n, dtype=np.int64)
        before[0] = prev
        np.maximum(seen[:-1], prev, out=before[1:])
        pane = floor_to(t, hop)
        late = pane + hop <= before - self.grace_s
        n_late = int(late.sum())
        self.max_event_time = int(max(prev, int(seen[-1])))
        keep = np.flatnonzero(~late)
        for start, rows in _by_pane(pane[keep], keep):
            st = self.panes.get(start)
            if st is None:
                st = self.panes[start] = self.new_pane()
            if x2 is not None:  # a view of one run of rows (reports in event-time order), else a copy
                run = _run(rows)
                sub2 = x2[rows] if run is None else x2[run]
            st.update(split_rows(batch, rows), None if x2 is None else sub2)
        self._close()
        if n_late:
            self.late += n_late
            self._n -= n_late  # State.update adds batch.n: late reports are not folded in
            if self.late_listener is not None:
                self.late_listener(n_late)

    def _close(self) -> None:
        """Move panes whose end is ≤ the watermark to :attr:`closed`; mark the retained ones past
        the retention for deletion."""
        wm = self.watermark
        if wm is None:
            return
        for start in [s for s in self.panes if s + self.hop_s <= wm]:
            pane = self.panes.pop(start)
            if start in self.closed:  # (after a merge) one pane, never two copies
                self.closed[start].merge(pane)
                self._blobs.pop(start, None)
            else:
                self.closed[start] = pane
        horizon = wm - self.retention_s
        for start in [s for s in self.retained if s + self.hop_s <= horizon]:
            self.retained.discard(start)
            self.tombstones.add(start)

    # --------------------------------------------------------------------------- publishing
    def settle(self, durable_offset: int | None) -> None:
        """Forget the pane records and tombstones sent with a checkpoint whose ``next_offset`` is
        ≤ ``durable_offset`` (the partition's last acknowledged checkpoint): their records are
        durable, so closed panes leave the state and deleted panes leave :attr:`retained`."""
        if durable_offset is None:
            return
        for (kind, start), at in list(self._sent.items()):
            if at > durable_offset:
                continue
            del self._sent[(kind, start)]
            if kind == "pane" and start in self.closed:
                del self.closed[start]
                self._blobs.pop(start, None)
                self.retained.add(start)
            elif kind == "tombstone":
                self.tombstones.discard(start)
        self._close()

    def outbox(self, next_offset: int) -> list[tuple[int, bytes | None]]:
        """The pane records to send with the checkpoint at ``next_offset``: ``(start, state
        bytes)`` of every closed pane and ``(start, None)`` (a tombstone) of every pane due for
        deletion, each remembered as sent at ``next_offset`` (see :meth:`settle`)."""
        out: list[tuple[int, bytes | None]] = []
        for start in sorted(self.closed):
            out.append((start, self._blob(start)))
            self._sent[("pane", start)] = next_offset
        for start in sorted(self.tombstones):
            out.append((start, None))
            self._sent[("tombstone", start)] = next_offset
        return out

    def _blob(self, start: int) -> bytes:
        """``to_bytes()`` of closed pane ``start``, computed once (the pane record and every
        checkpoint until it is dropped carry the same bytes)."""
        blob = self._blobs.get(start)
        if blob is None:
            blob = self._blobs[start] = self.closed[start].to_bytes()
        return blob

    # ----------------------------------------------------------------------------- windows
    def pane_states(self) -> dict[int, State]:
        """Every pane this state holds (open and closed), by start."""
        return {**self.closed, **self.panes}

    def window_starts(self, panes) -> list[int]:
        """Starts of the windows that contain any of the pane starts ``panes``, ascending."""
        return window_starts(panes, self.size_s, self.hop_s)

    def window_state(self, start: int, panes: dict[int, State]) -> State | None:
        """The merge of the panes of window ``[start, start + size)`` found in ``panes`` (None
        if there is none)."""
        out = None
        for p in range(start, start + self.size_s, self.hop_s):
            st = panes.get(p)
            if st is not None:
                out = st.copy() if out is None else out.merge(st)
        return out

    def estimate(self) -> Estimate:
        """Estimate of the latest window whose end is ≤ the watermark, from the panes held here
        (``serve`` assembles windows across partitions and published panes:
        :mod:`aggregator.windows`).

        Raises
        ------
        EmptyStateError
            If no window has closed yet, or its panes are not held here any more.
        """
        wm = self.watermark
        panes = self.pane_states()
        done = [w for w in self.window_starts(panes) if wm is not None and w + self.size_s <= wm]
        if not done:
            raise EmptyStateError(f"query {self.name!r}: no window has closed yet")
        return self.window_state(done[-1], panes).estimate()

    # ------------------------------------------------------------------------------- merge
    def _merge(self, other: WindowedState) -> None:
        """Pane by pane: a pane held by both (open or closed in either) becomes one; then panes
        past the merged watermark close."""
        for start, st in other.pane_states().items():
            mine = self.closed.get(start) or self.panes.get(start)
            if mine is not None:
                mine.merge(st)
                self._blobs.pop(start, None)
            else:
                (self.closed if start in other.closed else self.panes)[start] = st.copy()
        self.retained |= other.retained
        self.tombstones |= other.tombstones
        if other.max_event_time is not None:
            self.max_event_time = (other.max_event_time if self.max_event_time is None
                                   else max(self.max_event_time, other.max_event_time))
        self.late += other.late
        self._close()

    # ------------------------------------------------------------------------ serialization
    def _get_data(self) -> dict:
        def dump(panes: dict) -> list:
            return [[start, st._n, st._get_data()] for start, st in sorted(panes.items())]

        closed = [[start, np.frombuffer(self._blob(start), dtype=np.uint8)] for start in sorted(self.closed)]
        return {"panes": dump(self.panes), "closed": closed,
                "retained": sorted(self.retained), "tombstones": sorted(self.tombstones),
                "max_event_time": self.max_event_time, "late": self.late}

    def _set_data(self, data: dict) -> None:
        def load(items) -> dict:
            out = {}
            for start, n, inner in items:
                st = self.new_pane()
                st._set_data(inner)
                st._n = int(n)
                out[int(start)] = st
            return out

        from aggregator.state.serialize import state_from_bytes

        self.panes = load(data["panes"])
        self.closed, self._blobs = {}, {}
        for start, blob in data["closed"]:
            raw = np.asarray(blob, dtype=np.uint8).tobytes()
            self.closed[int(start)] = state_from_bytes(raw, self.query, self.schema,
                                                       expected=self.inner_class, loss=self._loss)
            self._blobs[int(start)] = raw
        self.retained = {int(s) for s in data["retained"]}
        self.tombstones = {int(s) for s in data["tombstones"]}
        met = data["max_event_time"]
        self.max_event_time = None if met is None else int(met)
        self.late = int(data["late"])
        for start in list(self.panes) + list(self.closed):
            if start % self.hop_s:
                raise StateError(f"pane start {start} is not a multiple of the hop {self.hop_s} s")

    def _resolved_loss(self):
        return self._loss

    def __repr__(self) -> str:
        try:
            return (f"WindowedState(query={self.name!r}, kind={self.query.kind}, n={self._n}, "
                    f"open={len(self.panes)}, closed={len(self.closed)}, late={self.late})")
        except Exception:
            return "<WindowedState (unprintable)>"
