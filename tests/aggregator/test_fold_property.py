"""Property: every body the decoder accepts folds into every state kind without raising
(docs/reliability.md §9). Hypothesis draws flights-schema bodies — numbers up to the edges of the
interval a report can take (docs/wire-format.md §4) and beyond, uRAP
bit vectors with 0 to 3 non-sensitive bits set (as index lists and as bitmaps), event times over
the whole wire range — encodes them, and folds whatever ``decode_many`` accepts into a fresh state
of every query kind, cumulative and windowed."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.client.batch import ReportBatch
from ingest.client.bounds import numeric_span
from ingest.client.codec import ImpossibleReportError, OutOfRangeError, encode
from ingest.client.event_time import MAX_EVENT_TIME
from mechanisms.uldp import SparseBits
from tests.integration import chaos_support as cs


def _runtime():
    """Every available query kind of the flights pipeline, plus windowed ones."""
    import tomllib

    from aggregator.config import PipelineConfig
    from aggregator.worker import PipelineRuntime
    from tests.integration import pipeline_support as ps

    text = (f'[pipeline]\nname = "flights"\nschema = "{ps.SCHEMA}"\n'
            '[kafka]\nbootstrap_servers = "127.0.0.1:9"\n' + ps.available_queries() + cs.WINDOWED_QUERIES)
    return PipelineRuntime.from_config(PipelineConfig.from_dict(tomllib.loads(text)))


RUNTIME = _runtime()
SCHEMA = RUNTIME.schema
LOW, HIGH = numeric_span(SCHEMA)  # per field: [low, high] ± 1000 noise standard deviations


def plausible(j: int):
    """Numbers field ``j`` can carry: anywhere in its span, its two edges, the signed zeros and
    the smallest subnormal."""
    return st.one_of(st.floats(min_value=LOW[j], max_value=HIGH[j], width=64),
                     st.sampled_from([LOW[j], HIGH[j], 0.0, -0.0, 5e-324, -5e-324]))


def extreme(j: int):
    """Finite numbers no privatized report of field ``j`` takes."""
    return st.sampled_from([1e308, -1e308, 1e200, -1e160, float(np.nextafter(HIGH[j], np.inf))])


@st.composite
def bodies(draw, outside: bool = False):
    n = draw(st.integers(1, 12))
    d = len(SCHEMA.numeric_names)
    numeric = np.array([[draw(plausible(j)) for j in range(d)] for _ in range(n)],
                       dtype=np.float64).reshape(n, d)
    if outside:  # one number beyond its field's span
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, d - 1))
        numeric[i, j] = draw(extreme(j))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cat, n_ns = {}, draw(st.integers(0, 3))
    for c in SCHEMA.categorical:
        k = len(c.categories)
        if c.mechanism == "urr":
            cat[c.name] = rng.integers(0, k, n).astype(np.int32)
            continue
        sens = np.zeros(k, dtype=bool)
        sens[list(c.sensitive_codes)] = True
        dense = (rng.random((n, k)) < draw(st.sampled_from([0.0, 0.05, 0.5, 1.0]))) & sens
        ns = np.flatnonzero(~sens)
        for i in range(n):  # 0–3 non-sensitive bits (the decoder refuses 2 and more)
            dense[i, rng.choice(ns, size=min(n_ns, ns.size), replace=False)] = True
        cat[c.name] = SparseBits.from_dense(dense)
    res = SCHEMA.time_resolution_s
    times = None
    if res is not None:
        top = MAX_EVENT_TIME // res
        t = draw(st.lists(st.sampled_from([0, 1, top // 2, top - 1, top]) | st.integers(0, top),
                          min_size=n, max_size=n))
        times = np.array(t, dtype=np.int64) * res
    batch = ReportBatch(SCHEMA.fingerprint, numeric, cat, event_time=times)
    return encode(batch, time_resolution=res), n_ns


def _fold(drawn) -> None:
    body, n_ns = drawn
    batch, results = RUNTIME.decode_many([body])
    if n_ns >= 2:
        assert isinstance(results[0], ImpossibleReportError)
        return
    assert isinstance(results[0], int), results[0]  # every other drawn body is a possible report
    x2 = RUNTIME.double_many(batch, [body], results)
    states = RUNTIME.new_states()
    for state in states.values():
        state.update(batch, x2)  # must not raise
    assert sum(1 for _ in states) == len(RUNTIME.query_names)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
def test_every_accepted_body_folds_into_every_state_kind(drawn):
    _fold(drawn)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies(outside=True))
def test_a_number_outside_its_span_is_refused_as_out_of_range(drawn):
    """1e308 would overflow the Gram and moment sums: the decoder refuses it (and anything past
    the span's edge), so no state ever sees it."""
    body, n_ns = drawn
    _, results = RUNTIME.decode_many([body])
    if n_ns >= 2:  # the uRAP check may name the record first
        assert isinstance(results[0], ImpossibleReportError | OutOfRangeError)
        return
    assert isinstance(results[0], OutOfRangeError), results[0]
    assert results[0].reason == "out_of_range" and "noise standard deviations" in str(results[0])


def test_the_runtime_covers_cumulative_and_windowed_kinds():
    kinds = {type(s).__name__ for s in RUNTIME.new_states().values()}
    assert {"CountsState", "MomentsState", "WindowedState"} <= kinds, kinds
    assert RUNTIME.windowed
