"""WindowedState (aggregator/state/windowed.py): the late rule, chunking invariance, panes against
plain states of the same kind, hopping windows, merge, serialization, the outbox/settle protocol
of pane records, the late listener, renewable panes, and the errors."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from aggregator.errors import ConfigError, EmptyStateError, StateError
from aggregator.queries import parse_query
from aggregator.state import STATE_CLASSES, State, build_state
from aggregator.state.registry import known_classes, state_class
from aggregator.state.serialize import FORMAT_MAGIC, query_digest
from aggregator.state.windowed import WindowedState
from ingest.client.batch import slice_batch
from tests.aggregator._state_support import make_batch, make_schema
from tests.aggregator.window_support import take, timed

HOUR, DAY = 3600, 86400
T0 = 1_700_006_400  # a multiple of 1 d (2023-11-15T00:00:00Z)

MEAN = {"kind": "mean", "name": "m", "field": "a"}
FREQ = {"kind": "frequency", "name": "f", "field": "c"}
QUANT = {"kind": "quantiles", "name": "q", "field": "b", "q": [0.1, 0.5, 0.9], "bins": 200}
LINREG = {"kind": "linear_regression", "name": "lr", "response": "b", "covariates": ["a"]}
EXACT = [MEAN, FREQ, QUANT, LINREG]


@pytest.fixture(scope="module")
def schema():
    return make_schema()


def windowed(spec, **window):
    return {**spec, "window": window}


def reference_late(times, hop, grace, prev=None):
    """The late rule written out report by report: report i is late iff its pane's end is ≤ the
    max event time of the reports before it (``prev``: of earlier updates) minus grace."""
    late, m = [], prev
    for t in np.asarray(times).tolist():
        end = t - t % hop + hop
        late.append(m is not None and end <= m - grace)
        m = t if m is None else max(m, t)
    return np.array(late, dtype=bool)


def feed(st, batch, x2, cuts):
    """Update ``st`` with ``batch`` cut at the positions ``cuts``."""
    bounds = [0, *sorted(cuts), batch.n]
    for a, b in itertools.pairwise(bounds):
        st.update(slice_batch(batch, a, b), x2[a:b])
    return st


def random_cuts(rng, n, k):
    return sorted(rng.choice(np.arange(1, n), size=k, replace=False).tolist())


def messy_times(rng, n, span, jitter):
    """Event times mostly increasing with some disorder (late reports at any grace < jitter)."""
    base = np.sort(rng.integers(0, span, n))
    return (T0 + base - rng.integers(0, jitter, n) * (rng.random(n) < 0.2)).astype(np.int64)


def plain(spec, schema, batch, x2, idx):
    """The unwindowed state of ``spec`` fed exactly the reports ``idx``."""
    st = build_state({k: v for k, v in spec.items() if k != "window"}, schema)
    if len(idx):
        st.update(take(batch, idx), x2[np.asarray(idx)])
    return st


def assert_same_estimate(got, want, rtol=1e-12):
    try:
        ew = want.estimate()
    except EmptyStateError:  # too few reports for this kind: the pane cannot estimate either
        with pytest.raises(EmptyStateError):
            got.estimate()
        return
    eg = got.estimate()
    assert eg.n == ew.n and eg.params == ew.params
    for a in ("value", "stderr", "ci_low", "ci_high"):
        np.testing.assert_allclose(getattr(eg, a), getattr(ew, a), rtol=rtol, atol=1e-12)


# ------------------------------------------------------------------ the late rule, by hand
@pytest.mark.parametrize(("times", "hop", "grace", "late"), [
    ([5], 10, 0, [False]),                              # the first report is never late …
    ([10**9], 10, 0, [False]),                          # … whatever its time
    ([5, 15, 9], 10, 0, [False, False, True]),          # pane [0,10) ends at 10 ≤ 15
    ([5, 100], 10, 0, [False, False]),                  # a later report does not make an earlier one late
    ([100, 5], 10, 0, [False, True]),                   # out of order within one batch
    ([10, 10], 10, 0, [False, False]),                  # equal times
    ([20, 10], 10, 0, [False, True]),                   # end == watermark: late (≤)
    ([19, 10], 10, 0, [False, False]),                  # end 20 > 19
    ([25, 14], 10, 5, [False, True]),                   # end 20 ≤ 25 − 5
    ([24, 14], 10, 5, [False, False]),                  # end 20 > 24 − 5
    ([5, 30, 7, 31, 25], 10, 0, [False, False, True, False, True]),
    ([30, 7, 31, 25], 10, 30, [False, False, False, False]),  # a large grace keeps everything
])
def test_the_late_rule_by_hand(schema, times, hop, grace, late):
    batch, x2 = timed(schema, times, 1)
    assert reference_late(times, hop, grace).tolist() == late  # the reference is the rule
    for cuts in ([], list(range(1, len(times)))):  # one batch, and report by report
        st = build_state(windowed(MEAN, size=f"{hop}s", grace=f"{grace}s"), schema)
        feed(st, batch, x2, cuts)
        assert st.late == sum(late)
        assert st.n == len(times) - sum(late)
        assert st.max_event_time == max(times)
        assert st.watermark == max(times) - grace
        kept = [t for t, lt in zip(times, late, strict=True) if not lt]
        counts = {}
        for t in kept:
            counts[t - t % hop] = counts.get(t - t % hop, 0) + 1
        assert {s: p.n for s, p in st.pane_states().items()} == counts
        # panes whose end is ≤ the watermark are closed, the others open
        wm = max(times) - grace
        assert set(st.closed) == {s for s in counts if s + hop <= wm}
        assert set(st.panes) == {s for s in counts if s + hop > wm}


def test_the_watermark_carries_across_updates(schema):
    """The max event time before a report includes every earlier update's reports."""
    st = build_state(windowed(MEAN, size="10s", grace="5s"), schema)
    assert st.watermark is None and st.max_event_time is None
    b, x2 = timed(schema, [40], 2)
    st.update(b, x2)
    assert st.watermark == 35 and st.late == 0
    b, x2 = timed(schema, [25, 29, 30, 34], 3)
    st.update(b, x2)  # pane [20,30) ends at 30 ≤ 35: late; pane [30,40) ends at 40 > 35
    assert st.late == 2 and st.n == 3
    assert sorted(st.pane_states()) == [30, 40]


@pytest.mark.parametrize("seed", range(5))
def test_the_late_rule_matches_the_reference_on_random_streams(schema, seed):
    rng = np.random.default_rng(100 + seed)
    n, hop, grace = 400, 60, int(rng.integers(0, 120))
    times = messy_times(rng, n, 3600, 400)
    batch, x2 = timed(schema, times, seed)
    want = reference_late(times, hop, grace)
    assert 0 < want.sum() < n  # the stream has late and on-time reports
    st = feed(build_state(windowed(MEAN, size="1m", grace=f"{grace}s"), schema), batch, x2,
              random_cuts(rng, n, 9))
    assert st.late == want.sum() and st.n == n - want.sum()
    kept = times[~want]
    starts, counts = np.unique(kept - kept % hop, return_counts=True)
    assert {s: p.n for s, p in st.pane_states().items()} == dict(zip(starts.tolist(), counts.tolist()))


# ------------------------------------------------------------------ chunking invariance
@pytest.mark.parametrize("seed", range(4))
def test_chunking_does_not_change_anything(schema, seed):
    """The same reports cut into random chunkings give identical pane sets, n and late; the
    counts state identical bytes, the moments state equal estimates to 1e-12."""
    rng = np.random.default_rng(200 + seed)
    n = 600
    times = messy_times(rng, n, 6 * HOUR, 2 * HOUR)
    batch, x2 = timed(schema, times, 50 + seed)
    for spec in (windowed(FREQ, size="1h", grace="20m"), windowed(MEAN, size="2h", hop="1h", grace="10m")):
        runs = [feed(build_state(spec, schema), batch, x2, cuts)
                for cuts in ([], list(range(1, n)), random_cuts(rng, n, 5), random_cuts(rng, n, 40))]
        ref = runs[0]
        assert ref.late > 0 and len(ref.closed) >= 3 and ref.panes
        for st in runs[1:]:
            assert (st.n, st.late, st.max_event_time) == (ref.n, ref.late, ref.max_event_time)
            assert set(st.panes) == set(ref.panes) and set(st.closed) == set(ref.closed)
            sizes = {s: p.n for s, p in ref.pane_states().items()}
            assert {s: p.n for s, p in st.pane_states().items()} == sizes
            if spec["kind"] == "frequency":
                assert st.to_bytes() == ref.to_bytes()
            else:
                for start, pane in st.pane_states().items():
                    assert_same_estimate(pane, ref.pane_states()[start])
                assert_same_estimate(st, ref)


# ------------------------------------------------------------------ panes == plain states
@pytest.mark.parametrize("spec", EXACT, ids=[q["kind"] for q in EXACT])
def test_each_pane_is_the_plain_state_of_its_on_time_reports(schema, spec):
    rng = np.random.default_rng(300)
    n, hop, grace = 3000, HOUR, 15 * 60
    times = messy_times(rng, n, 5 * HOUR, HOUR)
    batch, x2 = timed(schema, times, 301)
    st = feed(build_state(windowed(spec, size="1h", grace="15m"), schema), batch, x2, random_cuts(rng, n, 7))
    late = reference_late(times, hop, grace)
    assert st.late == late.sum() > 0
    panes = st.pane_states()
    starts = times - times % hop
    assert set(panes) == set(starts[~late].tolist())
    for start, pane in panes.items():
        idx = np.flatnonzero((starts == start) & ~late)
        want = plain(spec, schema, batch, x2, idx)
        assert pane.n == idx.size
        assert_same_estimate(pane, want)


# ------------------------------------------------------------------ hopping windows
@pytest.mark.parametrize("spec", [MEAN, FREQ], ids=["mean", "frequency"])
def test_a_hopping_window_is_the_plain_state_of_its_panes_reports(schema, spec):
    """size 7d, hop 1d: every window merges its 7 panes, and estimate() is the latest window
    whose end is ≤ the watermark."""
    rng = np.random.default_rng(400)
    n = 4000
    times = np.sort(rng.integers(T0, T0 + 12 * DAY + 5 * HOUR, n)).astype(np.int64)
    batch, x2 = timed(schema, times, 401)
    st = feed(build_state(windowed(spec, size="7d", hop="1d"), schema), batch, x2, random_cuts(rng, n, 11))
    assert st.late == 0 and st.n == n
    wm = int(times.max())
    latest = (wm - 7 * DAY) // DAY * DAY
    want = plain(spec, schema, batch, x2, np.flatnonzero((times >= latest) & (times < latest + 7 * DAY)))
    assert_same_estimate(st, want, rtol=1e-10)
    panes = st.pane_states()
    starts = st.window_starts(panes)
    assert starts == list(range(T0 - 6 * DAY, T0 + 12 * DAY + 1, DAY))  # every window holding a pane
    for w in starts[::3]:
        idx = np.flatnonzero((times >= w) & (times < w + 7 * DAY))
        got = st.window_state(w, panes)
        assert got.n == idx.size
        assert_same_estimate(got, plain(spec, schema, batch, x2, idx), rtol=1e-10)
    assert st.window_state(T0 - 30 * DAY, panes) is None  # no pane there
    # the window states are merged copies: the panes are untouched
    assert {s: p.n for s, p in st.pane_states().items()} == {s: p.n for s, p in panes.items()}


def test_estimate_before_any_window_closed(schema):
    st = build_state(windowed(MEAN, size="1h", grace="5m"), schema)
    with pytest.raises(EmptyStateError, match="'m'"):
        st.estimate()
    b, x2 = timed(schema, T0 + np.arange(100) * 30, 5)  # 50 minutes: the watermark is inside the pane
    st.update(b, x2)
    with pytest.raises(EmptyStateError, match="no window has closed"):
        st.estimate()
    b, x2 = timed(schema, [T0 + HOUR + 5 * 60], 6)  # watermark = T0 + 1h: pane [T0, T0+1h) closes
    st.update(b, x2)
    assert st.estimate().n == 100 and list(st.closed) == [T0]


# ------------------------------------------------------------------ merge
@pytest.mark.parametrize("spec", [MEAN, FREQ, QUANT], ids=["mean", "frequency", "quantiles"])
def test_merge_of_two_partitions_is_one_state_fed_both(schema, spec):
    """Two partitions over the same time range (each in time order, both ending at the same
    time) merge into the state of their union in time order, pane by pane."""
    rng = np.random.default_rng(500)
    n = 3000
    times = np.sort(rng.integers(T0, T0 + 10 * HOUR, n)).astype(np.int64)
    times[-2:] = T0 + 10 * HOUR + 7  # both partitions see the last time
    batch, x2 = timed(schema, times, 501)
    spec = windowed(spec, size="2h", hop="1h", grace="10m")
    a_idx, b_idx = np.arange(0, n, 2), np.arange(1, n, 2)
    parts = []
    for idx in (a_idx, b_idx):
        sub = take(batch, idx)
        parts.append(feed(build_state(spec, schema), sub, x2[idx], random_cuts(rng, idx.size, 4)))
    one = feed(build_state(spec, schema), batch, x2, random_cuts(rng, n, 6))
    merged = parts[0] + parts[1]
    assert parts[0].n == a_idx.size  # `+` does not mutate
    assert merged.n == one.n == n and merged.late == one.late == 0
    assert merged.max_event_time == one.max_event_time
    assert set(merged.panes) == set(one.panes) and set(merged.closed) == set(one.closed)
    for start, pane in one.pane_states().items():
        got = merged.pane_states()[start]
        assert got.n == pane.n
        assert_same_estimate(got, pane, rtol=1e-10)
    assert_same_estimate(merged, one, rtol=1e-10)


def test_merge_adds_late_counts_and_keeps_the_larger_max_event_time(schema):
    spec = windowed(MEAN, size="10s")
    a = build_state(spec, schema).update(*timed(schema, [100, 5, 6], 1))
    b = build_state(spec, schema).update(*timed(schema, [300, 150], 2))
    m = a.copy().merge(b)
    assert (a.late, b.late, m.late) == (2, 1, 3)
    assert m.max_event_time == 300 and m.n == 2
    assert build_state(spec, schema).merge(a).max_event_time == 100  # into an empty state


def test_merge_of_a_pane_open_in_one_partition_and_closed_in_the_other(schema):
    spec = windowed(MEAN, size="10s")
    a = build_state(spec, schema).update(*timed(schema, [5] * 50, 1))          # pane 0 open
    b = build_state(spec, schema).update(*timed(schema, [5] * 25 + [25] * 25, 2))  # pane 0 closed
    assert 0 in a.panes and 0 in b.closed
    m = a.copy().merge(b)
    assert m.n == 100
    assert sum(p.n for p in m.pane_states().values()) == m.n
    assert m.pane_states()[0].n == 75
    m.update(*timed(schema, [40], 3))  # closes every pane
    assert m.closed[0].n == 75 and sum(p.n for p in m.pane_states().values()) == m.n


# ------------------------------------------------------------------ serialization
def _protocol_state(schema):
    """A state with open, closed, retained and tombstoned panes and late reports."""
    st = build_state(windowed(FREQ, size="10s", grace="2s", retention="30s"), schema)
    st.update(*timed(schema, [1, 3, 12, 14, 25, 21], 1))     # wm 23: panes 0, 10 closed
    st.outbox(7)
    st.settle(7)                                             # 0, 10 retained
    st.update(*timed(schema, [44, 2, 46, 45], 2))            # wm 44: 2 is late, 0 past retention
    assert st.tombstones == {0} and st.retained == {10}
    st.update(*timed(schema, [47, 5], 3))                    # wm 45: 5 is late
    assert set(st.closed) == {20} and set(st.panes) == {40} and st.late == 2
    return st


def test_serialization_round_trip_keeps_every_part_of_the_state(schema):
    st = _protocol_state(schema)
    blob = st.to_bytes()
    assert blob.startswith(FORMAT_MAGIC)
    back = State.from_bytes(blob, st.query, schema)
    assert type(back) is WindowedState and back.inner_class is STATE_CLASSES["frequency"]
    assert back.to_bytes() == blob
    assert (back.n, back.late, back.max_event_time, back.watermark) == (st.n, st.late, 47, 45)
    assert back.retained == st.retained and back.tombstones == st.tombstones
    assert set(back.panes) == set(st.panes) and set(back.closed) == set(st.closed)
    for start, pane in st.pane_states().items():
        assert back.pane_states()[start].to_bytes() == pane.to_bytes()
    assert back.estimate() == st.estimate()
    assert back.late_listener is None
    # the restored state keeps streaming identically (late rule and all)
    more = timed(schema, [62, 49, 80, 55, 71], 4)
    assert st.update(*more).to_bytes() == back.update(*more).to_bytes()
    assert back.late == st.late == 4
    # copy and WindowedState.from_bytes
    assert st.copy().to_bytes() == st.to_bytes()
    assert WindowedState.from_bytes(blob, st.query, schema).to_bytes() == blob


def test_an_empty_state_round_trips(schema):
    st = build_state(windowed(MEAN, size="1h"), schema)
    back = State.from_bytes(st.to_bytes(), st.query, schema)
    assert back.max_event_time is None and back.late == 0 and back.n == 0
    assert not (back.panes or back.closed or back.retained or back.tombstones)


def test_a_pane_start_off_the_hop_grid_is_refused(schema):
    st = build_state(windowed(MEAN, size="10s"), schema).update(*timed(schema, [3, 4], 1))
    doc = json.loads(st.to_bytes()[len(FORMAT_MAGIC):])
    assert doc["class"] == "WindowedState" and doc["data"]["panes"][0][0] == 0
    doc["data"]["panes"][0][0] = 5
    bad = FORMAT_MAGIC + json.dumps(doc).encode()
    with pytest.raises(StateError, match="pane start 5 is not a multiple of the hop 10"):
        State.from_bytes(bad, st.query, schema)


def test_a_windowed_state_is_not_restored_as_another_spec_or_class(schema):
    st = build_state(windowed(MEAN, size="10s"), schema).update(*timed(schema, [3], 1))
    with pytest.raises(StateError, match="another spec"):
        State.from_bytes(st.to_bytes(), parse_query(windowed(MEAN, size="20s")), schema)
    with pytest.raises(StateError, match="another spec"):
        State.from_bytes(st.to_bytes(), parse_query(MEAN), schema)
    with pytest.raises(StateError, match="not a"):
        STATE_CLASSES["mean"].from_bytes(st.to_bytes(), st.query, schema)


def test_registry_and_digest_of_windowed_queries():
    assert WindowedState in known_classes()
    assert set(STATE_CLASSES.values()) <= set(known_classes())
    assert state_class(parse_query(windowed(MEAN, size="1h"))) is WindowedState
    assert state_class(parse_query(MEAN)) is STATE_CLASSES["mean"]
    # an unwindowed query keeps the digest it had before windows existed (no "window" key)
    import hashlib

    q = parse_query(MEAN)
    spec = q.model_dump(mode="json")
    assert spec.pop("window") is None
    old = hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    assert query_digest(q) == old
    assert query_digest(parse_query(windowed(MEAN, size="1h"))) != old
    assert query_digest(parse_query(windowed(MEAN, size="1h"))) != query_digest(
        parse_query(windowed(MEAN, size="1h", grace="1s")))


# ------------------------------------------------------------------ outbox / settle
def test_a_closed_pane_stays_until_a_durable_offset_reaches_its_send(schema):
    st = build_state(windowed(MEAN, size="10s"), schema)
    st.update(*timed(schema, [1, 2, 3, 11, 12], 1))      # wm 12: pane 0 closed, pane 10 open
    assert set(st.closed) == {0} and set(st.panes) == {10}
    assert st.outbox(100) == [(0, st.closed[0].to_bytes())]  # open panes are never sent
    blob = st.outbox(100)[0][1]
    pane = State.from_bytes(blob, st.query, schema)          # a pane record is the inner state
    assert type(pane) is STATE_CLASSES["mean"] and pane.n == 3
    for durable in (None, 0, 99):
        st.settle(durable)
        assert set(st.closed) == {0} and not st.retained
    st.outbox(150)                                          # sent again with a newer checkpoint
    st.settle(120)                                          # the older one is durable: not enough
    assert set(st.closed) == {0}
    st.settle(150)
    assert not st.closed and st.retained == {0}
    assert st.outbox(200) == []                             # nothing left to send
    st.settle(10**9)
    assert st.retained == {0} and set(st.panes) == {10}
    assert st.n == 5  # n counts every folded report, published or not


def test_a_pane_never_sent_is_not_dropped_by_settle(schema):
    st = build_state(windowed(MEAN, size="10s"), schema).update(*timed(schema, [1, 25], 1))
    st.settle(10**9)
    assert set(st.closed) == {0} and not st.retained
    # and a restored state has forgotten what was sent: it sends again
    st.outbox(5)
    back = State.from_bytes(st.to_bytes(), st.query, schema)
    back.settle(5)
    assert set(back.closed) == {0}
    assert [s for s, _ in back.outbox(6)] == [0]


def test_tombstones_after_the_retention_are_forgotten_once_acknowledged(schema):
    st = build_state(windowed(MEAN, size="10s", retention="30s"), schema)
    st.update(*timed(schema, [1, 15], 1))                   # wm 15: pane 0 closed
    st.outbox(10)
    st.settle(10)
    assert st.retained == {0} and not st.tombstones
    st.update(*timed(schema, [39], 2))                      # wm 39: 0 + 10 > 39 − 30
    assert st.retained == {0} and not st.tombstones
    st.update(*timed(schema, [40], 3))                      # wm 40: 0 + 10 ≤ 40 − 30
    assert not st.retained and st.tombstones == {0}
    out = st.outbox(20)
    assert (0, None) in out and sorted(s for s, v in out if v is not None) == [10, 30]
    st.settle(19)
    assert st.tombstones == {0}
    assert (0, None) in st.outbox(25)                       # resent until acknowledged
    st.settle(20)
    assert st.tombstones == {0}                             # the resend (25) is not durable yet
    st.settle(25)
    assert not st.tombstones and not st.closed
    assert st.retained == {10, 30}  # the panes sent with it are durable too


def test_a_closed_pane_past_the_retention_is_tombstoned_only_after_its_record_is_durable(schema):
    st = build_state(windowed(MEAN, size="10s", retention="10s"), schema)
    st.update(*timed(schema, [1, 100], 1))                 # pane 0 closed, already past retention
    assert set(st.closed) == {0} and not st.tombstones     # never deleted before it was published
    st.outbox(3)
    st.settle(3)                                           # durable: retained, then due for deletion
    assert not st.closed and not st.retained and st.tombstones == {0}
    assert st.outbox(4) == [(0, None)]


# ------------------------------------------------------------------ late listener
def test_the_late_listener_gets_the_late_count_of_each_update(schema):
    st = build_state(windowed(MEAN, size="10s"), schema)
    calls = []
    st.late_listener = calls.append
    st.update(*timed(schema, [50, 3, 4, 55], 1))
    st.update(*timed(schema, [56, 57], 2))      # nothing late: not called
    st.update(*timed(schema, [9, 41, 60], 3))   # panes 0 and 40 ended before 57
    assert calls == [2, 2] and st.late == 4
    assert State.from_bytes(st.to_bytes(), st.query, schema).late_listener is None
    assert st.copy().late_listener is None


# ------------------------------------------------------------------ renewable panes
LOGIT = {"kind": "logistic_regression", "name": "lg", "covariates": ["a"], "label": "y",
         "renewable": {"warm_up": 1000, "batch_size": 200}}


def test_renewable_panes_below_the_warm_up_estimate_as_the_plain_state(schema):
    """Panes of ~250 reports (warm_up 1000): a window of 3 panes is a buffer-only state, whose
    estimate is the batch fit of its reports — the plain RenewableState's on the same reports."""
    rng = np.random.default_rng(600)
    n = 1000
    times = np.sort(rng.integers(T0, T0 + 4 * HOUR, n)).astype(np.int64)
    batch, x2 = timed(schema, times, 601)
    st = feed(build_state(windowed(LOGIT, size="3h", hop="1h"), schema), batch, x2, random_cuts(rng, n, 5))
    panes = st.pane_states()
    assert len(panes) == 4 and all(p.fit is None and 0 < p.n < 1000 for p in panes.values())
    idx = np.flatnonzero(times < T0 + 3 * HOUR)  # the latest window with end ≤ the watermark
    want = plain(LOGIT, schema, batch, x2, idx)
    assert want.fit is None and want.n == idx.size < 1000
    assert_same_estimate(st, want, rtol=1e-9)
    # a window of more reports than the warm-up, every pane below it: the batch fit of them all
    big = {**LOGIT, "renewable": {"warm_up": 5000, "batch_size": 200}}
    st2 = feed(build_state(windowed(big, size="4h", hop="1h"), schema), batch, x2, [])
    st2.update(*timed(schema, [T0 + 4 * HOUR], 602))
    est = st2.estimate()
    want2 = plain(big, schema, batch, x2, np.arange(n))
    assert want2.fit is None
    assert est.n == n
    np.testing.assert_allclose(est.value, want2.estimate().value, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ errors
def test_update_without_event_times_is_refused(schema):
    st = build_state(windowed(MEAN, size="1h"), schema)
    batch, x2, _ = make_batch(schema, 10, np.random.default_rng(1))
    with pytest.raises(StateError, match="'m' needs event times"):
        st.update(batch, x2)
    assert st.n == 0 and st.max_event_time is None and not st.pane_states()
    st.update(slice_batch(batch, 0, 0), x2[:0])  # an empty batch is a no-op, with or without times
    assert st.n == 0


def test_a_windowed_state_needs_a_query_with_a_window(schema):
    with pytest.raises(ConfigError, match=r"queries\.m: a WindowedState needs a query with a window"):
        WindowedState(parse_query(MEAN), schema)
    with pytest.raises(ConfigError, match=r"queries\.m\.field"):
        WindowedState(parse_query(windowed({**MEAN, "field": "c"}, size="1h")), schema)  # not numeric
