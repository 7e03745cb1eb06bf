"""The positive-definiteness guard of the renewable fit (``mechanisms.renewable``, docs/mechanisms.md
§6.6): a DR block Hessian can be indefinite, so

* when ``H + Ĥ_b`` is not positive definite the Newton step uses ``H`` alone, and when
  ``H + Ĥ_b(θ̂)`` is not, the block's Hessian is not added (each counted in ``guarded``);
* a block whose Newton step is not finite is skipped, its reports counted in ``n``;
* a warm-up Hessian that is not positive definite extends the warm-up (no renewal from a nearly
  singular H) up to ``MAX_WARM_UP_FACTOR · warm_up`` reports; there its eigenvalues are floored
  at ``1e-9·max|λ|``.

H stays positive definite and the estimate finite, on the compiled and the Python path alike;
the count reaches serve's payload (``hessian_guard``). Also: a non-finite estimate is refused
with its cause, and serve reports an unexpected estimate failure as that query's error.
"""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.errors import StateError
from aggregator.state import State, build_state
from ingest.client.batch import ReportBatch
from mechanisms.renewable import RenewableFit, is_positive_definite
from tests.aggregator._state_support import make_batch, make_schema

SCHEMA = make_schema()
OPTS = {"warm_up": 100, "batch_size": 40}
LOGIT = {"kind": "logistic_regression", "name": "lg", "covariates": ["a"], "label": "b", "threshold": -1.5,
         "renewable": OPTS}
MEDIAN = {"kind": "quantile_regression", "name": "qr", "covariates": ["a"], "response": "b", "tau": 0.5,
          "renewable": OPTS}
M = OPTS["batch_size"]
PATHS = pytest.mark.parametrize("python", [False, True], ids=["kernel", "python"])
QUERIES = pytest.mark.parametrize("qd", [LOGIT, MEDIAN], ids=["logistic", "median"])


def _block(balanced: bool) -> tuple[ReportBatch, np.ndarray]:
    """One block of ``M`` reports whose DR Hessian at θ = 0 is indefinite.

    ``X̃₁``: ``a`` at the centre of its box (standardized 0, so z₁ = (1, 0)) and ``b`` on either
    side of the threshold (−1.5) and of the zero residual. ``X̃₂``: the same with ``a`` = 45 or −35
    (standardized ±8): the DR Hessian ``[H(x₁) − 0.7 H(x₂)]/0.3`` has a large negative slope
    entry. ``balanced``: each sign of ``a`` comes with both labels, so the DR gradient at θ = 0 is
    exactly zero; otherwise the slope gradient is not.
    """
    i = np.arange(M)
    x1 = np.column_stack([np.full(M, 5.0), np.where(i % 2, 2.0, -3.0), np.zeros(M)])
    x2 = x1.copy()
    x2[:, 0] = np.where(((i // 2) if balanced else i) % 2, 45.0, -35.0)
    base, _, _ = make_batch(SCHEMA, M, np.random.default_rng(0))
    return ReportBatch(base.fingerprint, x1, base.categorical), x2


def _with_fit(qd, python: bool, H: np.ndarray) -> State:
    st = build_state(qd, SCHEMA)
    if python:
        st._kernel = None
    st.fit = RenewableFit(np.zeros(2), H.copy(), np.zeros((2, 2)), 1000, 1.0, 0)
    return st


@QUERIES
@PATHS
def test_an_indefinite_block_hessian_is_guarded_twice(qd, python):
    """The balanced block at θ̂ = 0: the step (of zero gradient) is taken with H alone (guard 1),
    and H + Ĥ_b(θ̂) is indefinite, so the block's Hessian is not added (guard 2): θ̂ and H are
    unchanged, A and n grow, and the estimate is finite."""
    H0 = 5.0 * np.eye(2)
    st = _with_fit(qd, python, H0)
    batch, x2 = _block(balanced=True)
    u1, u2 = st._std(batch.numeric), st._std(x2)
    hb = st.engine.hessian(u1, u2, np.zeros(2), 1000 + M, 1.0)
    assert np.linalg.eigvalsh(hb)[0] < -10 * np.abs(H0).max()  # the block is strongly indefinite
    g = st.closs.grad(u1, u2, np.zeros(2))
    assert np.all(np.abs(g.sum(axis=0)) < 1e-9)
    st.update(batch, x2)
    f = st.fit
    assert f.guarded == st.guarded == 2
    assert f.n == 1000 + M and st.buf1.shape[0] == 0
    np.testing.assert_array_equal(f.H, H0)
    np.testing.assert_array_equal(f.theta, np.zeros(2))
    np.testing.assert_allclose(f.A, g.T @ g, rtol=1e-12)
    assert is_positive_definite(f.H)
    e = st.estimate()
    assert np.all(np.isfinite(e.value)) and np.all(np.isfinite(e.stderr)) and np.all(e.stderr > 0)
    # the guard count is part of the state (checkpoints, merges) and of serve's payload
    from aggregator.serve import estimate_payload

    back = State.from_bytes(st.to_bytes(), st.query, SCHEMA)
    assert back.guarded == 2 and back.fit.guarded == 2
    assert (back + st).guarded == 4
    assert estimate_payload(st.name, st)["hessian_guard"] == 2


@QUERIES
@PATHS
def test_an_ordinary_block_is_not_guarded(qd, python):
    """The other side: the same fit and a block whose doubles are close to the releases — no
    guard, and H grows by exactly the block Hessian at the new θ̂."""
    H0 = 5.0 * np.eye(2)
    st = _with_fit(qd, python, H0)
    batch, x2 = _block(balanced=True)
    x2 = batch.numeric + np.random.default_rng(1).normal(0.0, 0.05, batch.numeric.shape)
    st.update(batch, x2)
    f = st.fit
    assert f.guarded == st.guarded == 0 and f.n == 1000 + M
    hb = st.engine.hessian(st._std(batch.numeric), st._std(x2), f.theta, 1000 + M, 1.0)
    np.testing.assert_allclose(f.H - H0, hb, rtol=1e-10, atol=1e-10 * np.abs(hb).max())
    assert np.max(np.abs(f.theta)) > 0


@QUERIES
@PATHS
def test_a_block_with_a_non_finite_step_is_skipped_and_counted(qd, python):
    """H = 10⁻³⁰⁷·I (positive definite, barely) and the unbalanced block (slope gradient ≠ 0,
    block Hessian indefinite): the step with H alone overflows, so the block is skipped — θ̂, H
    and A unchanged, its reports counted in n — and both guards are counted."""
    H0 = 1e-307 * np.eye(2)
    st = _with_fit(qd, python, H0)
    batch, x2 = _block(balanced=False)
    g = st.closs.grad(st._std(batch.numeric), st._std(x2), np.zeros(2)).sum(axis=0)
    assert abs(g[1]) > 1.0
    st.update(batch, x2)
    f = st.fit
    assert f.n == 1000 + M and st.n == M
    assert f.guarded == st.guarded == 2
    np.testing.assert_array_equal(f.theta, np.zeros(2))
    np.testing.assert_array_equal(f.H, H0)
    np.testing.assert_array_equal(f.A, np.zeros((2, 2)))


def _indefinite(monkeypatch, st) -> np.ndarray:
    """Make every Hessian of ``st``'s engine indefinite (eigenvalues 300, −50 on a rotated basis);
    returns the rotation."""
    rot = np.array([[np.cos(0.3), -np.sin(0.3)], [np.sin(0.3), np.cos(0.3)]])
    bad = rot @ np.diag([300.0, -50.0]) @ rot.T
    monkeypatch.setattr(st.engine, "hessian", lambda *a, **k: bad)
    return rot


def test_a_warm_up_hessian_that_is_not_positive_definite_extends_the_warm_up(monkeypatch):
    """Below the cap a warm-up fit whose Hessian is not positive definite starts no renewal: the
    reports stay buffered, the next try waits for twice as many, nothing is dropped or counted as
    guarded, and the estimate meanwhile is the batch fit of the buffer."""
    st = build_state({**MEDIAN, "renewable": {"warm_up": 200, "batch_size": 40}}, SCHEMA)
    _indefinite(monkeypatch, st)
    batch, x2, _ = make_batch(SCHEMA, 700, np.random.default_rng(0))
    st.update(batch, x2)
    assert st.fit is None and st.warm_target == 800 and st.buf1.shape[0] == 700
    assert st.dropped == 0 and st.guarded == 0
    assert st.costly_estimate


def test_a_warm_up_hessian_that_is_not_positive_definite_is_floored_at_the_cap(monkeypatch):
    """At ``MAX_WARM_UP_FACTOR · warm_up`` reports the warm-up fit's indefinite Hessian has its
    eigenvalues floored at 1e-9·max|λ| on the same eigenvectors, counted once."""
    from aggregator.state.renewable import MAX_WARM_UP_FACTOR

    st = build_state({**MEDIAN, "renewable": {"warm_up": 200, "batch_size": 40}}, SCHEMA)
    rot = _indefinite(monkeypatch, st)
    cap = MAX_WARM_UP_FACTOR * 200
    batch, x2, _ = make_batch(SCHEMA, cap, np.random.default_rng(0))
    st.update(batch, x2)
    f = st.fit
    assert f.guarded == st.guarded == 1 and f.n == cap and st.dropped == 0
    w, v = np.linalg.eigh(f.H)
    np.testing.assert_allclose(w, [1e-9 * 300.0, 300.0], rtol=1e-6)
    np.testing.assert_allclose(np.abs(v.T @ rot), np.eye(2)[::-1], atol=1e-9)
    assert is_positive_definite(f.H)
    # the real warm-up Hessian of the first 200 reports is positive definite: a fit at once
    ok = build_state({**MEDIAN, "renewable": {"warm_up": 200, "batch_size": 40}}, SCHEMA)
    ok.update(*make_batch(SCHEMA, 200, np.random.default_rng(0))[:2])
    assert ok.fit.guarded == 0 and ok.fit.n == 200


@PATHS
def test_a_tiny_warm_up_stream_keeps_h_positive_definite(python):
    """Median regression with a warm-up of 100 and blocks of 10 (DR block Hessians of 10
    reports are often indefinite): over the first of 40 seeded streams of 3000 reports on which the
    guard acts, H stays positive definite, the estimate is finite and within 4 standard errors
    of the truth (median(b | a) = −4 + 0.5a), and both paths count the same."""
    qd = {**MEDIAN, "renewable": {"warm_up": 100, "batch_size": 10}}
    for seed in range(40):
        batch, x2, _ = make_batch(SCHEMA, 3000, np.random.default_rng(seed))
        st = build_state(qd, SCHEMA)
        if python:
            st._kernel = None
        st.update(batch, x2)
        if st.guarded:
            break
    else:
        pytest.fail("the guard never acted")
    assert st.fit.n == 3000 and is_positive_definite(st.fit.H)
    e = st.estimate()
    assert np.all(np.isfinite(e.value)) and np.all(e.stderr > 0)
    assert np.all(np.abs(e.value - np.array([-4.0, 0.5])) < 4 * e.stderr), (e.value, e.stderr)
    other = build_state(qd, SCHEMA)
    if not python:
        other._kernel = None
    other.update(batch, x2)
    assert other.guarded == st.guarded


def test_a_diverging_warm_up_fit_extends_the_warm_up_and_never_stops_the_update():
    """A plain-label logistic regression on 2 covariates with a warm-up of 100 reports: the DR
    objective of so few reports can be unbounded below and the batch fit diverges. ``update``
    must not raise (the worker's fold would stop, and a replay would hit the same record): the
    reports stay buffered and the fit is tried again on twice as many; past 4·warm_up the oldest
    are dropped and counted. The estimate is refused with the cause meanwhile."""
    qd = {"kind": "logistic_regression", "name": "lp", "covariates": ["a", "b"], "label": "y",
          "renewable": {"warm_up": 100, "batch_size": 10}}
    batch, x2, _ = make_batch(SCHEMA, 100, np.random.default_rng(0))
    st = build_state(qd, SCHEMA)
    st.update(batch, x2)
    assert st.n == 100
    assert st.fit is None and st.warm_target == 200 and st.buf1.shape[0] == 100  # seed 0 diverges
    with pytest.raises(StateError, match="'lp'"):
        st.estimate()
    # the same policy restored from a checkpoint
    back = State.from_bytes(st.to_bytes(), st.query, SCHEMA)
    assert back.warm_target == 200 and back.dropped == 0
    # streams of such tiny warm-ups never raise, and the buffer stays bounded
    rng = np.random.default_rng(1)
    for _ in range(12):
        b, x, _ = make_batch(SCHEMA, 100, rng)
        st.update(b, x)
        assert st.buf1.shape[0] <= 4 * 100 + 100
    assert st.n == 1300
    assert st.fit is not None or st.dropped > 0


def test_a_non_finite_estimate_is_refused_with_the_cause():
    st = build_state(MEDIAN, SCHEMA)
    batch, x2, _ = make_batch(SCHEMA, 2000, np.random.default_rng(4))
    st.update(batch, x2)
    assert np.all(np.isfinite(st.estimate().value))
    st.a = st.a * np.nan  # the affine map back to original units: any non-finite result
    with np.errstate(all="raise"), pytest.raises(StateError,
                                                 match="the estimate from 2000 reports is not finite"):
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


def _flights_linreg():
    """A custom squared loss of arr_delay on dep_delay, both noised (``tests/aggregator/test_plan.py``)."""
    from mechanisms.losses import LinearRegressionLoss

    return LinearRegressionLoss(noised=(0, 1))
