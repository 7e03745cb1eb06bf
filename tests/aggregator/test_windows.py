"""aggregator/windows.py: finality across partitions (final_horizon), merge of checkpoint and
published panes (merge_panes), WindowView.compute with idle and busy partitions, the cache of
final rows, window_rows' error rows and latest_final."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from aggregator.checkpoint import Checkpoint, pane_key
from aggregator.errors import ConfigError
from aggregator.windows import (
    PartitionClock,
    WindowView,
    final_horizon,
    latest_final,
    merge_panes,
    window_rows,
)
from ingest.client.event_time import iso_utc
from tests.aggregator.window_support import T0, plain_state, timed, windowed_runtime

M = {"kind": "mean", "name": "m", "field": "a", "window": {"size": "20s", "hop": "10s"}}
LR = {"kind": "linear_regression", "name": "lr", "response": "b", "covariates": ["a"],
      "window": {"size": "10s"}}
TOT = {"kind": "mean", "name": "tot", "field": "a"}


@pytest.fixture(scope="module")
def runtime():
    return windowed_runtime([M, TOT])


# ------------------------------------------------------------------ final_horizon
def C(p, wm, idle=False, pane_end=None):
    return PartitionClock(p, wm, idle, pane_end)


@pytest.mark.parametrize(("clocks", "want"), [
    ([], None),
    ([C(0, 100), C(1, 50)], 50),                         # the slowest busy partition
    ([C(0, 100), C(1, 50, True)], 100),                  # an idle partition does not hold windows open
    ([C(0, 100), C(1, None)], None),                     # a busy partition without watermark: nothing final
    ([C(0, None), C(1, 50, True)], None),
    ([C(0, 100), C(1, None, True)], 100),                # idle and empty
    # every partition idle: none holds a window open, every window of the data is final — up to
    # the end of the latest pane (docs/windows.md §4)
    ([C(0, 100, True, 130), C(1, 50, True, 80), C(2, None, True)], 130),
    ([C(0, None, True), C(1, None, True)], None),
])
def test_final_horizon(clocks, want):
    assert final_horizon(clocks) == want


# ------------------------------------------------------------------ merge_panes
def _pane(runtime, times, seed):
    st = runtime.new_states()["m"]
    st.update(*timed(runtime.schema, times, seed))
    return next(iter(st.pane_states().values()))


def test_merge_panes_prefers_the_checkpoint_copy_and_never_double_counts(runtime):
    a0, a1 = _pane(runtime, [1, 2, 3], 1), _pane(runtime, [11, 12], 2)
    b0, b1 = _pane(runtime, [4, 5, 6, 7], 3), _pane(runtime, [13], 4)
    stale = _pane(runtime, [1], 5)  # the pane record of (0, 0): the checkpoint still holds it
    a2 = _pane(runtime, [21, 22, 23, 24, 25], 6)
    held = {0: {0: a0, 10: a1}, 1: {0: b0}}
    published = {(0, 0): stale, (0, 20): a2, (1, 10): b1}
    before = {id(s): s.to_bytes() for s in (a0, a1, b0, b1, stale, a2)}
    out = merge_panes(held, published)
    assert sorted(out) == [0, 10, 20]
    assert (out[0].n, out[10].n, out[20].n) == (3 + 4, 2 + 1, 5)
    assert out[0].to_bytes() == a0.copy().merge(b0).to_bytes()  # ascending partition order
    assert out[10].to_bytes() == a1.copy().merge(b1).to_bytes()
    assert out[20].to_bytes() == a2.to_bytes() and out[20] is not a2
    assert {id(s): s.to_bytes() for s in (a0, a1, b0, b1, stale, a2)} == before  # inputs kept
    assert merge_panes({}, {}) == {}


# ------------------------------------------------------------------ WindowView.compute
def _partitions(runtime, now):
    """Two partitions of ``m`` over [T0, T0+100): partition 0 up to T0+95 (watermark 95),
    partition 1 up to T0+61 and 3 late reports; partition 0's closed panes are published
    (retained), their pane records in the state topic at offsets 100 + k."""
    rng = np.random.default_rng(10)
    parts, restored, cks, panes, batches = {}, {}, {}, {}, []
    for p, hi in ((0, 96), (1, 62)):
        t = np.sort(rng.integers(T0, T0 + hi, 200)).astype(np.int64)
        t[-1] = T0 + hi - 1
        batch, x2 = timed(runtime.schema, t, 20 + p)
        batches.append((batch, x2))
        states = runtime.new_states()
        for st in states.values():
            st.update(batch, x2)
        if p == 1:  # 3 late reports: pane [T0, T0+10) ended before the watermark T0+61
            late = timed(runtime.schema, [T0 + 1, T0 + 2, T0 + 3], 29)
            states["m"].update(*late)
            assert states["m"].late == 3
        if p == 0:
            w = states["m"]
            for k, (start, blob) in enumerate(w.outbox(200)):
                key = pane_key(runtime.name, 0, "m", start)
                panes[("m", 0, start)] = (key, blob, 100 + k)
            w.settle(200)
            assert w.retained and not w.closed
        cks[p] = Checkpoint(runtime.name, p, 200, 200, runtime.fingerprint,
                            {n: s.to_bytes() for n, s in states.items()}, created=now - 1000)
        restored[p] = {n: runtime.restore_state(n, b) for n, b in cks[p].states.items()}
        parts[p] = states
    return restored, cks, panes, batches


def test_compute_merges_partitions_and_published_panes(runtime):
    now = T0 + 10**6
    restored, cks, panes, batches = _partitions(runtime, now)
    out = WindowView(runtime, idle_timeout_s=300).compute(restored, cks, panes, None, now)
    assert set(out) == {"m"}  # only the windowed queries
    m = out["m"]
    assert m["query"] == "m"
    assert m["window"] == {"size_s": 20, "hop_s": 10, "grace_s": 0, "retention_s": 10_000}
    assert m["horizon"] == iso_utc(T0 + 61)  # ends None: every partition holds windows open
    assert m["late"] == 3
    rows = m["windows"]
    assert [r["start_s"] for r in rows] == list(range(T0 - 10, T0 + 91, 10))
    for r in rows:
        assert r["end_s"] == r["start_s"] + 20
        assert r["start"] == iso_utc(r["start_s"]) and r["end"] == iso_utc(r["end_s"])
        assert r["final"] == (r["end_s"] <= T0 + 61)
        want = plain_state(runtime, "m", batches, r["start_s"], r["end_s"])
        assert r["n"] == want.n
        est = want.estimate()
        np.testing.assert_allclose(r["value"], est.value, rtol=1e-10)
        np.testing.assert_allclose(r["stderr"], est.stderr, rtol=1e-10)
        np.testing.assert_allclose(r["ci_low"], est.ci_low, rtol=1e-10)
        assert r["params"] == list(est.params) and r["level"] == 0.95


@pytest.mark.parametrize(("ends", "age", "horizon"), [
    ({0: 250, 1: 200}, 1000, T0 + 95),   # partition 1 caught up for longer than the timeout: idle
    ({0: 250, 1: 200}, 10, T0 + 61),     # caught up but its checkpoint is recent: it holds
    ({0: 200, 1: 250}, 1000, T0 + 61),   # behind the end of its partition: busy
    ({0: 250, 1: 250}, 1000, T0 + 61),
    ({0: 250, 1: 200, 2: 5}, 1000, None),  # partition 2 has reports and no checkpoint: nothing final
    ({0: 250, 1: 200, 2: 0}, 1000, T0 + 95),  # an empty partition is idle
    # every partition idle: final up to the end of the latest pane (partition 0's, T0+95 → T0+100)
    ({0: 200, 1: 200}, 1000, T0 + 100),
    ({0: 200, 1: 200, 2: 0, 3: 0}, 10**6, T0 + 100),
])
def test_compute_finality_with_idle_and_busy_partitions(runtime, ends, age, horizon):
    now = T0 + 10**7
    restored, cks, panes, _ = _partitions(runtime, now)
    cks = {p: Checkpoint(ck.pipeline, ck.partition, ck.next_offset, ck.reports, ck.fingerprint, ck.states,
                         created=now - age) for p, ck in cks.items()}
    out = WindowView(runtime, idle_timeout_s=300).compute(restored, cks, panes, ends, now)["m"]
    assert out["horizon"] == (None if horizon is None else iso_utc(horizon))
    for r in out["windows"]:
        assert r["final"] == (horizon is not None and r["end_s"] <= horizon)


def test_finality_never_moves_back(runtime):
    """Windows served as final stay final: once every partition was idle (horizon T0+100), a
    partition holding windows open again (horizon T0+61) does not take the horizon back."""
    now = T0 + 10**7
    restored, cks, panes, _ = _partitions(runtime, now)
    old = {p: Checkpoint(ck.pipeline, ck.partition, ck.next_offset, ck.reports, ck.fingerprint, ck.states,
                         created=now - 1000) for p, ck in cks.items()}
    view = WindowView(runtime, idle_timeout_s=300)
    first = view.compute(restored, old, panes, {0: 200, 1: 200}, now)["m"]
    assert first["horizon"] == iso_utc(T0 + 100)
    again = view.compute(restored, old, panes, {0: 200, 1: 250}, now)["m"]  # partition 1 busy again
    assert again["horizon"] == iso_utc(T0 + 100)
    assert [r["final"] for r in again["windows"]] == [r["final"] for r in first["windows"]]
    # a view of its own (a serve restart) starts from the partitions as they are
    assert WindowView(runtime).compute(restored, old, panes, {0: 200, 1: 250}, now)["m"]["horizon"] \
        == iso_utc(T0 + 61)


def test_the_idle_timeout_must_be_positive(runtime):
    for bad in (0, -1, "5", None):
        with pytest.raises(ConfigError, match="window_idle_timeout_s"):
            WindowView(runtime, idle_timeout_s=bad)


def test_an_unreadable_pane_record_is_skipped_and_logged(runtime, caplog):
    now = T0 + 10**6
    restored, cks, panes, _ = _partitions(runtime, now)
    view = WindowView(runtime)
    good = view.compute(restored, cks, panes, None, now)["m"]["windows"]
    (q, p, start), (key, _, off) = next(iter(panes.items()))
    bad = {**panes, (q, p, start): (key, b"garbage", off + 1)}
    with caplog.at_level(logging.ERROR, logger="aggregator.windows"):
        rows = WindowView(runtime).compute(restored, cks, bad, None, now)["m"]["windows"]
    assert "cannot be restored" in caplog.text
    lost = {r["start_s"]: r["n"] for r in rows}
    for r in good:
        covers = r["start_s"] <= start < r["end_s"]
        assert lost.get(r["start_s"], 0) < r["n"] if covers else lost[r["start_s"]] == r["n"]


# ------------------------------------------------------------------ the cache of final rows
def test_final_rows_are_reused_while_their_sources_are_unchanged(runtime):
    now = T0 + 10**6
    restored, cks, panes, _ = _partitions(runtime, now)
    view = WindowView(runtime)
    first = {r["start_s"]: r for r in view.compute(restored, cks, panes, None, now)["m"]["windows"]}
    again = {r["start_s"]: r for r in view.compute(restored, cks, panes, None, now)["m"]["windows"]}
    finals = [s for s, r in first.items() if r["final"]]
    assert finals and len(finals) < len(first)
    assert all(again[s] is first[s] for s in finals)
    # a pane record of partition 0 rewritten at a new offset: the windows holding it are recomputed
    key0 = ("m", 0, T0 + 10)
    k, blob, off = panes[key0]
    moved = {**panes, key0: (k, blob, off + 50)}
    third = {r["start_s"]: r for r in view.compute(restored, cks, moved, None, now)["m"]["windows"]}
    for s in finals:
        holds = s <= T0 + 10 < s + 20
        assert (third[s] is not again[s]) == holds, s
        assert third[s] == again[s]  # the same values
    # a new checkpoint of partition 1: every window holding one of its panes is recomputed
    ck1 = cks[1]
    cks2 = {**cks, 1: Checkpoint("p", 1, 201, ck1.reports, ck1.fingerprint, ck1.states, created=ck1.created)}
    fourth = {r["start_s"]: r for r in view.compute(restored, cks2, moved, None, now)["m"]["windows"]}
    p1 = set(restored[1]["m"].pane_states())
    for s in finals:
        holds = any(s <= p < s + 20 for p in p1)
        assert (fourth[s] is not third[s]) == holds, s


# ------------------------------------------------------------------ window_rows / latest_final
def test_a_window_that_cannot_estimate_has_an_error_row():
    rt = windowed_runtime([LR])
    st = rt.new_states()["lr"]
    st.update(*timed(rt.schema, [T0 + 1, T0 + 15], 1))  # one report in pane T0: too few to fit
    rows = window_rows(st, st.pane_states(), T0 + 15)
    assert [r["start_s"] for r in rows] == [T0, T0 + 10]
    r = rows[0]
    assert r["final"] and not rows[1]["final"]
    assert r["n"] == 1 and r["value"] is None and r["params"] == [] and "error" in r and "lr" in r["error"]
    none = latest_final({"query": "lr", "window": None, "windows": rows})
    assert none["error"].startswith("no final window")


def test_latest_final_is_the_last_final_window_without_error():
    rows = [{"start_s": 0, "final": True, "n": 3, "value": [1.0]},
            {"start_s": 10, "final": True, "n": 4, "value": [2.0]},
            {"start_s": 20, "final": True, "n": 1, "value": None, "error": "too few"},
            {"start_s": 30, "final": False, "n": 9, "value": [3.0]}]
    got = latest_final({"query": "m", "window": {"size_s": 10}, "windows": rows})
    assert got == {"query": "m", "window": {"size_s": 10}, "start_s": 10, "final": True, "n": 4,
                   "value": [2.0]}
    none = latest_final({"query": "m", "window": {"size_s": 10}, "windows": rows[3:]})
    assert none["n"] == 0 and none["query"] == "m" and "no final window yet" in none["error"]
    assert latest_final({"query": "m", "windows": []})["n"] == 0


def test_windows_past_the_most_advanced_partitions_retention_are_not_served():
    """Retention counts from each partition's own watermark: once the most advanced partition
    may have deleted a window's first pane, serve no longer shows that window (docs/windows.md
    §4), even though a slower partition still holds its copy."""
    spec = {"kind": "mean", "name": "m", "field": "a",
            "window": {"size": "10s", "retention": "30s"}}
    rt = windowed_runtime([spec])
    now = T0 + 10**6
    restored, cks = {}, {}
    for p, hi in ((0, 100), (1, 40)):  # watermarks T0+99 and T0+39
        t = np.arange(T0, T0 + hi, dtype=np.int64)
        states = rt.new_states()
        states["m"].update(*timed(rt.schema, t, 40 + p))
        cks[p] = Checkpoint(rt.name, p, 100, len(t), rt.fingerprint,
                            {n: s.to_bytes() for n, s in states.items()}, created=now)
        restored[p] = {n: rt.restore_state(n, b) for n, b in cks[p].states.items()}
    rows = WindowView(rt).compute(restored, cks, {}, None, now)["m"]["windows"]
    starts = [r["start_s"] - T0 for r in rows]
    # the cut is 99 − 30 = 69: windows whose first pane ends after it
    assert starts == [60, 70, 80, 90]
    assert all(r["start_s"] + 10 > T0 + 69 for r in rows)
