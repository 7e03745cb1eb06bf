"""Windows of a windowed query across partitions: panes, finality and the served rows
(docs/windows.md §4).

Serve holds, per reports partition, the latest checkpoint (its open panes and the closed panes
not yet known durable) and the closed panes published under their own keys
(:func:`aggregator.checkpoint.pane_key`). :func:`merge_panes` merges them into one state per
pane; :func:`final_horizon` gives the time up to which windows are final — the smallest
watermark of the partitions that hold windows open (an idle partition does not);
:func:`window_rows` turns panes into the rows of ``GET /windows/{query}``. No Kafka here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aggregator.errors import AggregatorError
from ingest.client.event_time import iso_utc

__all__ = ["PartitionClock", "WindowView", "final_horizon", "latest_final", "merge_panes", "window_meta",
           "window_rows"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionClock:
    """Where one reports partition stands for a windowed query.

    Attributes
    ----------
    partition : int
    watermark : int or None
        Max event time − grace of its latest checkpoint (None: no report yet).
    idle : bool
        Caught up and without a new checkpoint for the idle timeout (or empty): it does not
        hold windows open.
    pane_end : int or None
        End of the pane of its latest event time (None: no report yet).
    """

    partition: int
    watermark: int | None
    idle: bool = False
    pane_end: int | None = None


def final_horizon(clocks: list[PartitionClock]) -> int | None:
    """The time up to which windows are final: the smallest watermark of the partitions that
    are not idle; when every partition is idle (none holds a window open), the end of the pane
    of the latest event time of any partition — every window of the data so far is final, a
    hopping window reaching past the data is not; ``None`` (no window is final) when a busy
    partition has no watermark yet, or there is no report.

    A window ``[start, end)`` is final when ``end ≤`` this horizon.
    """
    busy = [c for c in clocks if not c.idle]
    if not busy:
        ends = [c.pane_end for c in clocks if c.pane_end is not None]
        return max(ends) if ends else None
    if any(c.watermark is None for c in busy):
        return None
    return min(c.watermark for c in busy)


def merge_panes(held: Mapping[int, Mapping[int, object]],
                published: Mapping[tuple[int, int], object]) -> dict[int, object]:
    """One state per pane start over all partitions.

    Parameters
    ----------
    held : mapping partition → (pane start → state)
        The panes each partition's checkpoint holds (open and closed, not yet dropped).
    published : mapping (partition, pane start) → state
        Closed panes restored from their pane records. A pane a checkpoint still holds is the
        same pane: the checkpoint's copy is used, never both.

    Returns
    -------
    dict int → state
        Merged in ascending partition order (deterministic); the inputs are not modified.
    """
    per_part: dict[int, dict[int, object]] = {p: dict(panes) for p, panes in held.items()}
    for (p, start), st in published.items():
        per_part.setdefault(p, {}).setdefault(start, st)
    out: dict[int, object] = {}
    for p in sorted(per_part):
        for start, st in per_part[p].items():
            out[start] = st.copy() if start not in out else out[start].merge(st)
    return out


def window_meta(query) -> dict:
    """``{"size_s", "hop_s", "grace_s", "retention_s"}`` of a windowed query."""
    w = query.window
    return {"size_s": w.size_s, "hop_s": w.hop_s, "grace_s": w.grace_s, "retention_s": w.retention_s}


def _finite(values) -> list:
    return [float(v) if math.isfinite(v) else None for v in values]


def window_rows(template, panes: Mapping[int, object], horizon: int | None, *,
                cache: dict | None = None, tag: Callable[[int], object] | None = None) -> list[dict]:
    """The rows of ``GET /windows/{query}``: one per window that holds a pane, by start.

    Parameters
    ----------
    template : WindowedState
        A state of the query (window geometry and :meth:`WindowedState.window_state`).
    panes : mapping int → state
        Merged panes (:func:`merge_panes`).
    horizon : int or None
        :func:`final_horizon`.
    cache : dict or None
        Rows of final windows by start, reused while ``tag(start)`` is unchanged.
    tag : callable (window start) → hashable, optional
        What the window's panes were built from (e.g. the state-topic offsets of its records).

    Returns
    -------
    list of dict
        ``{"start", "end"`` (ISO-8601 UTC), ``"start_s", "end_s"`` (Unix seconds), ``"final",
        "n", "params", "value", "stderr", "ci_low", "ci_high"}``; a window that cannot be
        estimated yet has ``"error"`` and null values.
    """
    rows = []
    size = template.size_s
    for start in template.window_starts(panes):
        end = start + size
        final = horizon is not None and end <= horizon
        key = tag(start) if (cache is not None and tag is not None and final) else None
        if key is not None and start in cache and cache[start][0] == key:
            rows.append(cache[start][1])
            continue
        row = {"start": iso_utc(start), "end": iso_utc(end), "start_s": start, "end_s": end,
               "final": final}
        st = template.window_state(start, panes)
        try:
            est = st.estimate()
            row.update(n=est.n, params=list(est.params), value=_finite(est.value),
                       stderr=_finite(est.stderr), ci_low=_finite(est.ci_low), ci_high=_finite(est.ci_high),
                       level=est.level, estimator=est.estimator)
        except (AggregatorError, ValueError, ArithmeticError) as exc:
            row.update(n=int(st.n), params=[], value=None, stderr=None, ci_low=None, ci_high=None,
                       error=str(exc))
        except Exception as exc:  # a bug in one state (or a user's loss) must not stop the others
            log.exception("query %r: window %s failed", template.name, row["start"])
            row.update(n=int(st.n), params=[], value=None, stderr=None, ci_low=None, ci_high=None,
                       error=f"internal error: {type(exc).__name__}: {exc}")
        rows.append(row)
        if key is not None:
            cache[start] = (key, row)
    return rows


class WindowView:
    """The windows of a pipeline's windowed queries, recomputed from the state topic by serve.

    Parameters
    ----------
    runtime : aggregator.plan.PipelineRuntime
        Its ``windowed`` query names, ``queries`` and ``restore_state``.
    idle_timeout_s : float
        A partition caught up (its checkpoint's ``next_offset`` at the reports partition's end)
        whose latest checkpoint is older than this many seconds is idle (> 0).

    Notes
    -----
    Pane records are restored once per state-topic offset, and the rows of final windows are
    reused while the records behind them are unchanged.
    """

    def __init__(self, runtime, idle_timeout_s: float = 300.0) -> None:
        from aggregator.errors import ConfigError

        if not (isinstance(idle_timeout_s, int | float) and idle_timeout_s > 0):
            raise ConfigError(f"window_idle_timeout_s must be > 0 seconds, got {idle_timeout_s!r}")
        self.runtime = runtime
        self.idle_timeout_s = float(idle_timeout_s)
        self._panes: dict[bytes, tuple[int, object]] = {}  # pane key → (offset, restored state)
        self._rows: dict[str, dict] = {name: {} for name in runtime.windowed}
        self._horizons: dict[str, int] = {}  # the largest horizon served per query
        self._templates = {}

    def _pane(self, key: bytes, blob: bytes, offset: int, name: str):
        hit = self._panes.get(key)
        if hit is not None and hit[0] == offset:
            return hit[1]
        template = self.template(name)
        from aggregator.state.serialize import state_from_bytes

        st = state_from_bytes(blob, template.query, template.schema, expected=template.inner_class,
                              loss=template._resolved_loss())
        self._panes[key] = (offset, st)
        return st

    def template(self, name: str):
        """An empty state of windowed query ``name``."""
        if name not in self._templates:
            self._templates[name] = self.runtime.new_states()[name]
        return self._templates[name]

    def compute(self, restored: Mapping[int, Mapping[str, object]], checkpoints: Mapping[int, object],
                panes: Mapping[tuple[str, int, int], tuple[bytes, bytes, int]],
                ends: Mapping[int, int] | None, now: float) -> dict[str, dict]:
        """The windows of every windowed query.

        Parameters
        ----------
        restored : mapping partition → (query → state)
            The states of each usable checkpoint.
        checkpoints : mapping partition → Checkpoint
            Those checkpoints (``next_offset``, ``created``, ``key``).
        panes : mapping (query, partition, pane start) → (key, record value, offset)
            The pane records of the state topic.
        ends : mapping partition → end offset of the reports partition, or None
            ``None``: every partition with a checkpoint holds windows open, none is idle.
        now : float
            Unix time (for the idle timeout).

        Returns
        -------
        dict query → dict
            ``{"query", "window": window_meta, "windows": [row, …], "horizon", "late"}``
            (``late``: reports not folded because their pane had closed, summed over partitions).
        """
        parts = set(restored) | set(ends or ())
        live_keys = set()
        out = {}
        for name in self.runtime.windowed:
            template = self.template(name)
            held, src = {}, {}
            for p, states in restored.items():
                ck = checkpoints[p]
                held[p] = states[name].pane_states()
                for start in held[p]:
                    src.setdefault(start, []).append(("ck", p, ck.next_offset))
            published = {}
            for (q, p, start), (key, blob, offset) in panes.items():
                if q != name or start in held.get(p, {}):
                    continue
                try:
                    published[(p, start)] = self._pane(key, blob, offset, name)
                except AggregatorError as exc:
                    log.error("pane record %r cannot be restored: %s", key, exc)
                    continue
                live_keys.add(key)
                src.setdefault(start, []).append(("rec", p, offset))
            clocks = []
            for p in sorted(parts):
                ck = checkpoints.get(p)
                end = None if ends is None else ends.get(p)
                if ck is None:  # no checkpoint: holds windows open unless its partition is empty
                    clocks.append(PartitionClock(p, None, idle=end is not None and end <= 0))
                    continue
                caught_up = end is not None and ck.next_offset >= end
                idle = caught_up and now - ck.created >= self.idle_timeout_s
                st = restored[p][name]
                met = st.max_event_time
                pane_end = None if met is None else met - met % st.hop_s + st.hop_s
                clocks.append(PartitionClock(p, st.watermark, idle, pane_end))
            # finality only moves forward: a partition that wakes up does not take it back
            new = final_horizon(clocks)
            old = self._horizons.get(name)
            horizon = old if new is None or (old is not None and old > new) else new
            if horizon is not None:
                self._horizons[name] = horizon
            merged = merge_panes(held, published)
            size, hop = template.size_s, template.hop_s

            def tag(start, src=src, size=size, hop=hop):
                return tuple(sorted(t for s in range(start, start + size, hop) for t in src.get(s, ())))

            cache = self._rows[name]
            rows = window_rows(template, merged, horizon, cache=cache, tag=tag)
            # past the retention of the most advanced partition a window may have lost panes to
            # tombstones in some partitions only: not served
            marks = [c.watermark for c in clocks if c.watermark is not None]
            if marks:
                cut = max(marks) - template.retention_s
                rows = [r for r in rows if r["start_s"] + hop > cut]
            starts = {r["start_s"] for r in rows}
            for s in [s for s in cache if s not in starts]:
                del cache[s]
            out[name] = {"query": name, "window": window_meta(template.query), "windows": rows,
                         "horizon": None if horizon is None else iso_utc(horizon),
                         "late": int(sum(states[name].late for states in restored.values()))}
        for key in [k for k in self._panes if k not in live_keys]:
            del self._panes[key]
        return out


def latest_final(payload: Mapping) -> dict:
    """``GET /estimates/{query}`` of a windowed query: the latest final window's estimate with
    ``start``/``end`` and the window geometry, or ``{"query", "n": 0, "error"}`` while no window
    is final."""
    rows = [r for r in payload.get("windows", ()) if r.get("final") and "error" not in r]
    if not rows:
        return {"query": payload["query"], "n": 0, "window": payload.get("window"),
                "error": "no final window yet (every partition's watermark must pass a window's end)"}
    r = rows[-1]
    return {"query": payload["query"], "window": payload.get("window"), **{k: v for k, v in r.items()}}
