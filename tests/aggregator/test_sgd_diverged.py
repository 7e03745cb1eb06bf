"""A query whose averaged SGD diverges fails alone: its state is marked diverged, keeps counting
reports, survives merges and checkpoints, and its estimate names the cause; the worker and the
other queries go on (one custom squared loss with a large ``sgd.step0`` does not stop the worker,
nor does a restart replay into the same failure)."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.errors import StateError
from aggregator.state.base import State
from aggregator.state.registry import build_state
from tests.aggregator._state_support import make_batch, make_schema

SCHEMA = make_schema()


def _linreg():
    """Squared loss of y on (a, b), every column noised: its gradient grows with θ."""
    from mechanisms.losses import LinearRegressionLoss

    return LinearRegressionLoss(noised=(0, 1, 2))


def _query(step0: float) -> dict:
    return {"kind": "custom", "name": "lin", "fields": ["a", "b", "y"],
            "loss": "tests.aggregator.test_sgd_diverged:_linreg", "estimator": "dr",
            "sgd": {"step0": step0, "burn_in": 10, "batch_size": 16}}


def _batches(seed: int, k: int = 3, n: int = 2000):
    rng = np.random.default_rng(seed)
    return [make_batch(SCHEMA, n, rng)[:2] for _ in range(k)]


def test_a_diverging_sgd_is_marked_not_raised():
    st = build_state(_query(1000.0), SCHEMA)
    with np.errstate(all="raise"):  # no floating-point warning escapes the update either
        for b, x2 in _batches(1):
            st.update(b, x2)  # no exception: the worker must go on
    assert st.diverged is not None and "SGD diverged" in st.diverged and "sgd.step0 = 1000" in st.diverged
    assert st.n == 6000  # reports keep being counted
    t = st.t
    b, x2 = _batches(2, k=1)[0]
    st.update(b, x2)
    assert st.t == t and st.n == 8000  # no more steps once diverged
    with pytest.raises(StateError, match="SGD diverged"):
        st.estimate()


def test_diverged_survives_checkpoints_and_merges_in_either_order():
    bad = build_state(_query(1000.0), SCHEMA)
    for b, x2 in _batches(3):
        bad.update(b, x2)
    assert bad.diverged is not None
    back = State.from_bytes(bad.to_bytes(), bad.query, SCHEMA)
    assert back.diverged == bad.diverged and back.n == bad.n and back.t == bad.t
    # a healthy partition of the same query (a step that does not diverge on these data)
    good = build_state(_query(1000.0), SCHEMA)
    assert good.diverged is None and good.n == 0
    for left, right in ((bad, good), (good, bad)):
        merged = left + right
        assert merged.diverged == bad.diverged
        with pytest.raises(StateError, match="SGD diverged"):
            merged.estimate()


def test_a_small_step_does_not_diverge_on_the_same_data():
    """The other side of the bound: the same stream with a modest step estimates normally."""
    st = build_state(_query(0.05), SCHEMA)
    for b, x2 in _batches(1):
        st.update(b, x2)
    assert st.diverged is None
    est = st.estimate()
    assert np.all(np.isfinite(est.value)) and np.all(est.stderr > 0)


def test_old_checkpoints_without_the_field_restore_as_not_diverged():
    import json

    from aggregator.state.serialize import FORMAT_MAGIC

    st = build_state(_query(0.05), SCHEMA)
    for b, x2 in _batches(1):
        st.update(b, x2)
    doc = json.loads(st.to_bytes()[len(FORMAT_MAGIC):])
    del doc["data"]["diverged"]
    back = State.from_bytes(FORMAT_MAGIC + json.dumps(doc).encode(), st.query, SCHEMA)
    assert back.diverged is None
    np.testing.assert_array_equal(back.estimate().value, st.estimate().value)
    doc["data"]["diverged"] = 3
    with pytest.raises(StateError, match="diverged"):
        State.from_bytes(FORMAT_MAGIC + json.dumps(doc).encode(), st.query, SCHEMA)


def _flights_linreg():
    from mechanisms.losses import LinearRegressionLoss

    return LinearRegressionLoss(noised=(0, 1))


@pytest.mark.parametrize("overlap", [False, True])
def test_the_worker_goes_on_and_the_other_queries_estimate(overlap, caplog):
    """A worker (fold and update threads with ``overlap``) over a pipeline whose custom query
    diverges: no exception, the final checkpoint holds every record, the other query estimates,
    the diverged one reports why."""
    import tomllib

    from aggregator.checkpoint import Checkpoint
    from aggregator.config import PipelineConfig
    from aggregator.serve import estimate_payload
    from aggregator.worker import PipelineRuntime
    from tests.aggregator.worker_support import FakeConsumer, make_worker, polls, run_on
    from tests.integration import pipeline_support as ps

    text = (f'[pipeline]\nname = "flights"\nschema = "{ps.SCHEMA}"\n'
            '[kafka]\nbootstrap_servers = "127.0.0.1:9"\n'
            '[[queries]]\nkind = "mean"\nname = "m"\nfield = "arr_delay"\n'
            '[[queries]]\nkind = "custom"\nname = "lin"\nfields = ["dep_delay", "arr_delay"]\n'
            'loss = "tests.aggregator.test_sgd_diverged:_flights_linreg"\n'
            'sgd = { step0 = 1000.0, burn_in = 10, batch_size = 16 }\n')
    runtime = PipelineRuntime.from_config(PipelineConfig.from_dict(tomllib.loads(text)))
    records = ps.make_records(runtime.schema, n_records=12, per_record=100, seed=5)
    w = make_worker(runtime, overlap=overlap, consumer=FakeConsumer(polls(records, [4, 4, 4])))
    n = run_on(w, max_reports=1200)
    assert n == w.processed_reports == 1200 and not w.final_checkpoint_failed
    ck = Checkpoint.from_bytes(w.producer.sent[-1][2])
    assert ck.next_offset == 12 and ck.reports == 1200
    states = {name: runtime.restore_state(name, data) for name, data in ck.states.items()}
    assert states["lin"].diverged is not None and states["lin"].n == 1200
    mean = estimate_payload("m", states["m"])
    assert "error" not in mean and mean["n"] == 1200
    lin = estimate_payload("lin", states["lin"])
    assert lin["n"] == 1200 and "SGD diverged" in lin["error"]
    assert "SGD diverged" in caplog.text and "the others go on" in caplog.text


def test_overflowing_sums_mark_the_state_diverged_before_the_iterate_does():
    """A run-away iterate (finite, 1e183 on the flights with step0 1e-3) overflows the one-step and
    random-scaling sums first, so the state is marked diverged."""
    st = build_state(_query(0.05), SCHEMA)
    for b, x2 in _batches(1):
        st.update(b, x2)
    assert st.diverged is None
    for name in ("os_s", "rs_a", "avg"):
        probe = build_state(_query(0.05), SCHEMA)
        probe._set_data(st._get_data())
        getattr(probe, name).flat[0] = np.inf
        probe._check_finite()
        assert probe.diverged is not None and "non-finite iterate or sums" in probe.diverged, name


def test_a_non_finite_estimate_is_refused_with_the_cause():
    st = build_state(_query(0.05), SCHEMA)
    for b, x2 in _batches(1):
        st.update(b, x2)
    est = st.estimate()
    assert np.all(np.isfinite(est.value))
    st.a = st.a * np.nan  # the affine map back to original units: any non-finite result
    with np.errstate(all="raise"), pytest.raises(StateError, match="the estimate is not finite"):
        st.estimate()


def test_serve_reports_an_unexpected_estimate_failure_as_that_querys_error(caplog):
    from aggregator.serve import estimate_payload

    class Broken:
        n = 7

        def estimate(self):
            return None * 1.0  # a bug: TypeError

    out = estimate_payload("q", Broken())
    assert out == {"query": "q", "n": 7,
                   "error": "internal error: TypeError: unsupported operand type(s) for *: "
                            "'NoneType' and 'float'"}
    assert "query 'q': estimate failed" in caplog.text
