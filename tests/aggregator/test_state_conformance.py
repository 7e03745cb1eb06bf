"""Conformance of every registered state class (River style): update / merge / estimate,
serialization round trip, merge of halves == one pass, repr, pickle, empty states."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from aggregator.errors import ConfigError, StateError
from aggregator.queries import parse_query
from aggregator.state import STATE_CLASSES, EmptyStateError, Estimate, State, build_state, doubling_draws
from aggregator.state.serialize import FORMAT_MAGIC
from tests.aggregator._state_support import make_batch, make_schema, split

_RENEW = {"warm_up": 1000, "batch_size": 200}  # 4000 reports: a warm-up fit, then renewals
QUERIES = [
    {"kind": "frequency", "name": "f_urr", "field": "c"},
    {"kind": "frequency", "name": "f_urap_em", "field": "d", "method": "em"},
    {"kind": "frequency", "name": "f_urap_proj", "field": "d", "method": "projected"},
    {"kind": "mean", "name": "m_sdr", "field": "a"},
    {"kind": "mean", "name": "m_dr", "field": "a", "estimator": "dr"},
    {"kind": "mean", "name": "m_sl", "field": "b", "estimator": "sl"},
    {"kind": "mean", "name": "m_naive", "field": "b", "estimator": "naive"},
    {"kind": "variance", "name": "v_sdr", "field": "a"},
    {"kind": "variance", "name": "v_dr", "field": "b", "estimator": "dr"},
    {"kind": "quantiles", "name": "q", "field": "b", "q": [0.1, 0.5, 0.9], "bins": 500},
    {"kind": "linear_regression", "name": "lr", "response": "b", "covariates": ["a"]},
    {"kind": "linear_regression", "name": "lr0", "response": "b", "covariates": ["a", "y"],
     "intercept": False},
    {"kind": "logistic_regression", "name": "lg_thr", "covariates": ["a"], "label": "b", "threshold": -1.5,
     "renewable": _RENEW},
    {"kind": "logistic_regression", "name": "lg_sdr", "covariates": ["a"], "label": "y", "estimator": "sdr",
     "renewable": _RENEW},
    {"kind": "quantile_regression", "name": "qr", "response": "b", "covariates": ["a"], "tau": 0.5,
     "renewable": _RENEW},
    {"kind": "custom", "name": "cu", "loss": "benchmarks.paper_losses:relu_loss", "fields": ["b"],
     "renewable": _RENEW},
    {"kind": "kmeans", "name": "km", "fields": ["a", "b"], "k": 2, "renewable": _RENEW},
    {"kind": "gaussian_mixture", "name": "gm", "fields": ["a", "b"], "k": 2, "renewable": _RENEW},
]
EXACT_KINDS = {"frequency", "mean", "variance", "quantiles", "linear_regression"}
IDS = [q["name"] for q in QUERIES]


@pytest.fixture(scope="module")
def schema():
    return make_schema()


@pytest.fixture(scope="module")
def data(schema):
    return make_batch(schema, 4000, np.random.default_rng(20240601))


def test_every_registered_kind_is_exercised():
    kinds = {q["kind"] for q in QUERIES}
    assert kinds == set(STATE_CLASSES)
    assert {c.__name__ for c in STATE_CLASSES.values()} == {
        "CountsState", "MomentsState", "HistogramState", "GramState", "RenewableState", "MixtureState"}


@pytest.mark.parametrize("qd", QUERIES, ids=IDS)
def test_update_estimate(qd, schema, data):
    batch, x2, _ = data
    st = build_state(qd, schema)
    assert st.n == 0
    assert st.update(batch, x2) is st
    assert st.n == batch.n
    est = st.estimate()
    assert isinstance(est, Estimate)
    k = len(est.params)
    assert k >= 1 and est.query == qd["name"] and est.n == batch.n
    for arr in (est.value, est.stderr, est.ci_low, est.ci_high):
        assert arr.shape == (k,) and np.all(np.isfinite(arr))
    assert np.all(est.stderr > 0)
    assert np.all(est.ci_low <= est.value) and np.all(est.value <= est.ci_high)
    d = est.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["params"] == list(est.params)


@pytest.mark.parametrize("qd", QUERIES, ids=IDS)
def test_bytes_round_trip(qd, schema, data):
    batch, x2, _ = data
    st = build_state(qd, schema).update(batch, x2)
    blob = st.to_bytes()
    assert blob.startswith(FORMAT_MAGIC)
    back = State.from_bytes(blob, parse_query(qd), schema)
    assert type(back) is type(st) and back.n == st.n
    assert back.to_bytes() == blob
    assert back.estimate() == st.estimate()
    # the restored state keeps streaming identically
    b2, x22, _ = make_batch(schema, 300, np.random.default_rng(7))
    assert st.update(b2, x22).to_bytes() == back.update(b2, x22).to_bytes()


@pytest.mark.parametrize("qd", QUERIES, ids=IDS)
def test_merge_of_halves(qd, schema, data):
    batch, x2, _ = data
    one = build_state(qd, schema).update(batch, x2)
    (b1, x21), (b2, x22) = split(batch, x2, 1700)
    left = build_state(qd, schema).update(b1, x21)
    right = build_state(qd, schema).update(b2, x22)
    summed = left + right
    assert left.n == 1700 and summed.n == one.n  # `+` does not mutate
    left += right
    assert left.n == one.n
    e1, e2 = one.estimate(), left.estimate()
    assert e1.params == e2.params and e2.n == e1.n
    if qd["kind"] in EXACT_KINDS:
        for a in ("value", "stderr", "ci_low", "ci_high"):
            np.testing.assert_allclose(getattr(e2, a), getattr(e1, a), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(summed.estimate().value, e1.value, rtol=1e-9, atol=1e-12)
    else:
        # renewable fits pool exactly, but two halves renewed apart are not one pass over all the
        # reports: the estimates agree within a small fraction of the interval
        half = (e1.ci_high - e1.ci_low) / 2
        assert np.all(np.abs(e2.value - e1.value) < 0.5 * half)
        assert left.fit is not None and left.fit.n + left.buf1.shape[0] == one.n


@pytest.mark.parametrize("qd", QUERIES, ids=IDS)
def test_repr_pickle_and_empty(qd, schema, data):
    batch, x2, _ = data
    empty = build_state(qd, schema)
    assert qd["name"] in repr(empty)
    with pytest.raises(EmptyStateError, match=qd["name"]):
        empty.estimate()
    assert empty.n == 0
    empty2 = State.from_bytes(empty.to_bytes(), empty.query, schema)
    assert empty2.n == 0
    st = build_state(qd, schema).update(batch, x2)
    clone = pickle.loads(pickle.dumps(st))
    assert clone.estimate() == st.estimate()
    # repr never raises, even on a damaged object
    for attr in list(vars(st)):
        setattr(clone, attr, None)
    assert isinstance(repr(clone), str)
    # merging an empty state changes nothing
    before = st.estimate()
    st.merge(build_state(qd, schema))
    assert st.n == before.n
    if qd["kind"] in EXACT_KINDS:
        np.testing.assert_allclose(st.estimate().value, before.value, rtol=1e-12)


def test_update_with_empty_batch_is_a_no_op(schema, data):
    batch, x2, _ = data
    st = build_state(QUERIES[4], schema).update(batch, x2)
    blob = st.to_bytes()
    (empty, ex2), _ = split(batch, x2, 0)
    st.update(empty, ex2)
    assert st.to_bytes() == blob


def test_incompatible_merges_and_restores_raise(schema, data):
    batch, x2, _ = data
    m = build_state(QUERIES[3], schema).update(batch, x2)
    v = build_state(QUERIES[7], schema).update(batch, x2)
    with pytest.raises(StateError, match="cannot merge"):
        m.merge(v)
    other_spec = build_state({**QUERIES[3], "level": 0.9}, schema)
    with pytest.raises(StateError, match="different queries"):
        m.merge(other_spec)
    with pytest.raises(StateError, match="another spec"):
        State.from_bytes(m.to_bytes(), parse_query({**QUERIES[3], "level": 0.9}), schema)
    with pytest.raises(StateError, match="magic"):
        State.from_bytes(b"garbage", m.query, schema)
    with pytest.raises(StateError, match="JSON"):
        State.from_bytes(FORMAT_MAGIC + b"{not json", m.query, schema)
    with pytest.raises(StateError, match="not a"):
        type(v).from_bytes(build_state(QUERIES[0], schema).to_bytes(), parse_query(QUERIES[0]), schema)


def test_batch_checks(schema, data):
    batch, x2, _ = data
    st = build_state(QUERIES[4], schema)  # DR mean needs x2
    with pytest.raises(StateError, match="needs x2"):
        st.update(batch)
    with pytest.raises(StateError, match="shape"):
        st.update(batch, x2[:10])
    from ingest.client.batch import ReportBatch

    alien = ReportBatch(b"\x00" * 16, batch.numeric, dict(batch.categorical))
    with pytest.raises(StateError, match="fingerprint"):
        st.update(alien, x2)
    # SDR mean works without x2
    assert build_state(QUERIES[3], schema).update(batch).n == batch.n


@pytest.mark.parametrize(
    ("qd", "match"),
    [
        ({"kind": "mean", "name": "m", "field": "c"}, "queries.m.field"),
        ({"kind": "frequency", "name": "f", "field": "a"}, "categorical"),
        ({"kind": "linear_regression", "name": "l", "response": "zz", "covariates": ["a"]}, "response"),
        ({"kind": "custom", "name": "c", "loss": "benchmarks.paper_losses:relu_loss", "fields": ["a"],
          "estimator": "sdr"}, "estimator"),
    ],
)
def test_build_state_rejects_bad_queries(qd, match, schema):
    with pytest.raises(ConfigError, match=match):
        build_state(qd, schema)


def test_doubling_draws_are_deterministic_per_record():
    a = doubling_draws([b"record-1"], [5], 1)
    b = doubling_draws([b"record-1"], [5], 1)
    c = doubling_draws([b"record-2"], [5], 1)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.array_equal(doubling_draws([bytearray(b"record-1")], [5], 1), a)


def test_replay_with_doubling_draws_is_bit_identical(schema, data):
    batch, _, _ = data
    zil = schema.zil_mechanism()
    record = batch.numeric.tobytes()
    sd = np.sqrt(zil.zero_prob * zil.noise_variance)
    states = []
    for _ in range(2):
        x2 = batch.numeric + sd * doubling_draws([record], [batch.n], zil.dim)
        states.append(build_state(QUERIES[9], schema).update(batch, x2))
    assert states[0].to_bytes() == states[1].to_bytes()


def test_estimate_validation_and_dict():
    e = Estimate("q", ("a", "b"), [1, 2], [0.1, np.inf], [0.8, -np.inf], [1.2, np.inf], 5, 0.95, "sdr")
    d = e.to_dict()
    assert d["stderr"] == [0.1, None] and d["ci_low"][1] is None
    json.dumps(d, allow_nan=False)
    assert e["a"] == (1.0, 0.1, 0.8, 1.2)
    with pytest.raises(StateError, match="value"):
        Estimate("q", ("a",), [1, 2], [0.1], [0.8], [1.2], 5, 0.95, "sdr")
    assert "q" in repr(e)
    with pytest.raises(ValueError):
        e.value[0] = 3.0  # read-only


def _losses(st) -> list:
    """The loss objects a custom state holds: its own, or each of its panes'."""
    return [p.loss for p in st.pane_states().values()] if hasattr(st, "pane_states") else [st.loss]


@pytest.mark.parametrize("windowed", [False, True])
def test_a_resolved_custom_loss_is_used_and_restoring_imports_no_user_code(schema, data, windowed,
                                                                            request, monkeypatch):
    """``build_state``/``state_from_bytes``/``copy`` with the loss object the config resolved give
    the same state as importing the spec, and never import it (a windowed query passes it to
    every pane); a loss is only for custom queries."""
    from aggregator import custom_loss
    from aggregator.state import state_from_bytes

    if windowed:
        batch, x2 = request.getfixturevalue("timed")
        spec = next(q for q in WINDOWED if q["kind"] == "custom")
    else:
        batch, x2, _ = data
        spec = next(q for q in QUERIES if q["kind"] == "custom")
    assert spec["kind"] == "custom"
    loss = custom_loss.load_custom_loss(spec["loss"])
    want = build_state(spec, schema).update(batch, x2).to_bytes()

    def refuse(*args, **kwargs):
        raise AssertionError("user code imported")

    monkeypatch.setattr(custom_loss, "load_custom_loss", refuse)
    st = build_state(spec, schema, loss=loss).update(batch, x2)
    assert st.to_bytes() == want and all(x is loss for x in _losses(st))
    back = state_from_bytes(want, parse_query(spec), schema, loss=loss)
    assert back.to_bytes() == want and all(x is loss for x in _losses(back))
    assert State.from_bytes(want, back.query, schema, loss=loss).to_bytes() == want
    assert st.copy().to_bytes() == want
    with pytest.raises(ConfigError, match="only for custom queries"):
        build_state(QUERIES[3], schema, loss=loss)


# ------------------------------------------------------------------ windowed variants
# Every kind also runs with a window (aggregator.state.windowed.WindowedState: one state of the
# kind per pane). The reports get event times over 4 days in time order (no late report), so the
# 2-day windows hopping by a day hold ~2000 reports and the latest closed one is [T0+1d, T0+3d).
_DAY = 86400
_T0 = 1_356_998_400  # 2013-01-01T00:00:00Z, a multiple of the hop
_WINDOW = {"size": "2d", "hop": "1d", "grace": "1h"}
WINDOWED = [{**q, "name": f"{q['name']}_w", "window": _WINDOW} for q in QUERIES]
WIDS = [q["name"] for q in WINDOWED]


@pytest.fixture(scope="module")
def timed(data):
    from ingest.client.batch import with_event_time

    batch, x2, _ = data
    t = np.sort(np.random.default_rng(20240602).integers(_T0, _T0 + 4 * _DAY, batch.n)).astype(np.int64)
    return with_event_time(batch, t), x2


def _rows(batch, x2, idx):
    """The reports ``idx`` (ascending) of ``batch`` and their x2, with event times."""
    from ingest.client.batch import ReportBatch

    cat = {k: (col.take(idx) if hasattr(col, "take") else col[idx]) for k, col in batch.categorical.items()}
    return ReportBatch(batch.fingerprint, batch.numeric[idx], cat, batch.event_time[idx]), x2[idx]


def _unwindowed(qd):
    return {k: v for k, v in qd.items() if k != "window"}


def _close_enough(got, want, kind):
    assert got.params == want.params and got.n == want.n
    if kind in EXACT_KINDS:
        for a in ("value", "stderr", "ci_low", "ci_high"):
            np.testing.assert_allclose(getattr(got, a), getattr(want, a), rtol=1e-9, atol=1e-12)
    else:  # renewable panes pool their fits: within a small fraction of the interval of one pass
        half = (want.ci_high - want.ci_low) / 2
        assert np.all(np.abs(got.value - want.value) < 0.5 * half)


def test_every_registered_kind_is_exercised_with_a_window():
    from aggregator.state.registry import known_classes, state_class
    from aggregator.state.windowed import WindowedState

    assert {q["kind"] for q in WINDOWED} == set(STATE_CLASSES)
    assert set(known_classes()) == {*STATE_CLASSES.values(), WindowedState}
    schema = make_schema()
    for qd in WINDOWED:
        q = parse_query(qd)
        assert state_class(q) is WindowedState
        st = build_state(qd, schema)
        assert type(st) is WindowedState and st.inner_class is STATE_CLASSES[qd["kind"]]
        assert type(st.new_pane()) is STATE_CLASSES[qd["kind"]]


@pytest.mark.parametrize("qd", WINDOWED, ids=WIDS)
def test_windowed_update_estimate(qd, schema, timed):
    batch, x2 = timed
    st = build_state(qd, schema)
    assert st.n == 0
    assert st.update(batch, x2) is st
    assert st.n == batch.n and st.late == 0
    assert sum(p.n for p in st.pane_states().values()) == batch.n
    assert sorted(st.pane_states()) == [_T0 + k * _DAY for k in range(4)]
    assert sorted(st.closed) == [_T0, _T0 + _DAY, _T0 + 2 * _DAY] and sorted(st.panes) == [_T0 + 3 * _DAY]
    est = st.estimate()  # the latest window whose end is ≤ the watermark
    t = batch.event_time
    idx = np.flatnonzero((t >= _T0 + _DAY) & (t < _T0 + 3 * _DAY))
    assert est.n == idx.size and est.query == qd["name"]
    k = len(est.params)
    for arr in (est.value, est.stderr, est.ci_low, est.ci_high):
        assert arr.shape == (k,) and np.all(np.isfinite(arr))
    assert np.all(est.stderr > 0) and np.all(est.ci_low <= est.value) and np.all(est.value <= est.ci_high)
    json.dumps(est.to_dict(), allow_nan=False)
    want = build_state(_unwindowed(qd), schema).update(*_rows(batch, x2, idx)).estimate()
    _close_enough(est, want, qd["kind"])


@pytest.mark.parametrize("qd", WINDOWED, ids=WIDS)
def test_windowed_bytes_round_trip(qd, schema, timed):
    from aggregator.state.windowed import WindowedState
    from ingest.client.batch import with_event_time

    batch, x2 = timed
    st = build_state(qd, schema).update(batch, x2)
    st.outbox(10)
    st.settle(10)  # closed panes published: retained
    blob = st.to_bytes()
    assert blob.startswith(FORMAT_MAGIC)
    back = State.from_bytes(blob, parse_query(qd), schema)
    assert type(back) is WindowedState and back.n == st.n
    assert back.to_bytes() == blob
    assert (back.retained, back.max_event_time, back.late) == (st.retained, st.max_event_time, st.late)
    assert set(back.panes) == set(st.panes) == {_T0 + 3 * _DAY} and not back.closed
    # the restored state keeps streaming identically
    b2, x22, _ = make_batch(schema, 300, np.random.default_rng(7))
    t2 = np.sort(np.random.default_rng(8).integers(_T0 + 4 * _DAY, _T0 + 5 * _DAY, b2.n)).astype(np.int64)
    t2[:5] = _T0  # late: pane T0 has closed
    more = with_event_time(b2, t2)
    assert st.update(more, x22).to_bytes() == back.update(more, x22).to_bytes()
    assert back.late == 5 and back.n == batch.n + 295
    assert back.estimate() == st.estimate()


@pytest.mark.parametrize("qd", WINDOWED, ids=WIDS)
def test_windowed_merge_of_halves(qd, schema, timed):
    """Two partitions over the same time range (alternate reports) merge into one pass over
    all of them, pane by pane."""
    batch, x2 = timed
    one = build_state(qd, schema).update(batch, x2)
    halves = [build_state(qd, schema).update(*_rows(batch, x2, np.arange(r, batch.n, 2))) for r in (0, 1)]
    merged = halves[0] + halves[1]
    assert halves[0].n == batch.n // 2 and merged.n == one.n  # `+` does not mutate
    assert set(merged.panes) == set(one.panes) and set(merged.closed) == set(one.closed)
    for start, pane in one.pane_states().items():
        got = merged.pane_states()[start]
        assert got.n == pane.n
        if got.n >= 1000 or qd["kind"] in EXACT_KINDS:
            _close_enough(got.estimate(), pane.estimate(), qd["kind"])
    _close_enough(merged.estimate(), one.estimate(), qd["kind"])


@pytest.mark.parametrize("qd", WINDOWED, ids=WIDS)
def test_windowed_repr_pickle_empty_and_no_event_times(qd, schema, data, timed):
    batch, x2 = timed
    empty = build_state(qd, schema)
    assert qd["name"] in repr(empty)
    with pytest.raises(EmptyStateError, match=qd["name"]):
        empty.estimate()
    assert State.from_bytes(empty.to_bytes(), empty.query, schema).n == 0
    with pytest.raises(StateError, match="needs event times"):
        empty.update(data[0], data[1])  # the same reports without event times
    assert empty.n == 0 and not empty.pane_states()
    st = build_state(qd, schema).update(batch, x2)
    clone = pickle.loads(pickle.dumps(st))
    assert clone.estimate() == st.estimate() and clone.to_bytes() == st.to_bytes()
    for attr in list(vars(st)):
        setattr(clone, attr, None)
    assert isinstance(repr(clone), str)
    before = st.to_bytes()
    st.merge(build_state(qd, schema))  # merging an empty state changes nothing
    assert st.to_bytes() == before
