"""Helpers shared by the tests of windowed queries (not a test module): a hand-built runtime over
the small state-test schema, batches with event times, and plain reference states."""

from __future__ import annotations

import numpy as np

from aggregator.plan import PipelineRuntime
from aggregator.queries import parse_query
from aggregator.state import build_state, state_from_bytes
from aggregator.state.registry import state_class
from ingest.client.batch import ReportBatch, with_event_time
from mechanisms.uldp.sparse import SparseBits
from tests.aggregator._state_support import make_batch, make_schema

T0 = 1_356_998_400  # 2013-01-01T00:00:00Z
HOUR, DAY = 3600, 86400


def windowed_runtime(specs: list[dict], name: str = "p") -> PipelineRuntime:
    """A pipeline over the state-test schema with the queries ``specs`` (no decoder: the tests
    fold batches into states themselves)."""
    schema = make_schema()
    queries = {d["name"]: parse_query(d) for d in specs}

    def new_states():
        return {n: build_state(q, schema) for n, q in queries.items()}

    def restore_state(n, blob):
        return state_from_bytes(blob, queries[n], schema, expected=state_class(queries[n]))

    return PipelineRuntime(name, bytes(schema.fingerprint), decode=None, new_states=new_states,
                           restore_state=restore_state, double=None, queries=queries, schema=schema)


def timed(schema, times, seed):
    """A privatized batch with event times ``times`` and its x2."""
    t = np.asarray(times, dtype=np.int64)
    batch, x2, _ = make_batch(schema, t.size, np.random.default_rng(seed))
    return with_event_time(batch, t), x2


def take(batch: ReportBatch, idx) -> ReportBatch:
    """The reports ``idx`` of ``batch``."""
    idx = np.asarray(idx, dtype=np.int64)
    cats = {k: (col.take(idx) if isinstance(col, SparseBits) else np.asarray(col)[idx])
            for k, col in batch.categorical.items()}
    t = None if batch.event_time is None else batch.event_time[idx]
    return ReportBatch(batch.fingerprint, batch.numeric[idx], cats, t)


def plain_state(runtime, name, parts, lo, hi):
    """The unwindowed state of query ``name`` fed every report with ``lo ≤ event time < hi`` of
    ``parts`` (``[(batch, x2)]``, in order); None if there is none."""
    q = runtime.queries[name]
    spec = {k: v for k, v in q.model_dump(mode="json").items() if k != "window"}
    st = None
    for batch, x2 in parts:
        idx = np.flatnonzero((batch.event_time >= lo) & (batch.event_time < hi))
        if idx.size:
            st = st or build_state(spec, runtime.schema)
            st.update(take(batch, idx), x2[idx])
    return st
