"""The compiled renewal (``aggregator.state._renewable_kernel.renew_blocks``) runs the same algorithm
as the Python path of ``RenewableState`` (``mechanisms.renewable.Renewable.renew``, forced with
``state._kernel = None``): the same fit (θ̂, H, A, n, spread, guard count) and buffers, to rounding,
for every query it serves; queries it does not serve (SDR, custom losses) take the Python path,
whose fit is the warm-up and block renewals of ``Renewable`` recomputed here by hand. The kernel's
vectorized ``exp`` (``aggregator.state._index_kernel.vexp``) is within 4·10⁻¹⁶ of ``np.exp``."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.state import build_state
from tests.aggregator._state_support import make_batch, make_schema, split, stream_state

SCHEMA = make_schema()
OPTS = {"warm_up": 1000, "batch_size": 100}
LOGIT = {"kind": "logistic_regression", "name": "lg", "covariates": ["a"], "label": "b", "threshold": -1.5,
         "renewable": OPTS}
PLAIN = {"kind": "logistic_regression", "name": "lp", "covariates": ["a", "b"], "label": "y",
         "renewable": OPTS}
MEDIAN = {"kind": "quantile_regression", "name": "qr", "covariates": ["a"], "response": "b", "tau": 0.5,
          "renewable": OPTS}
Q90 = {**MEDIAN, "name": "q9", "tau": 0.9, "covariates": ["a", "y"]}
#: uneven record sizes: remainders wait in the buffer between updates on both paths, and one
#: update crosses the warm-up
CUTS = (1, 3, 700, 5, 1999, 45, 101)


def _chunks(n: int, seed: int, cuts=CUTS):
    batch, x2, _ = make_batch(SCHEMA, n, np.random.default_rng(seed))
    chunks, rest = [], (batch, x2)
    for at in cuts:
        head, rest = split(rest[0], rest[1], at)
        chunks.append(head)
    chunks.append(rest)
    return chunks


def _stream(qd, python: bool, chunks):
    return stream_state(qd, SCHEMA, python, chunks)


def _assert_same_fit(fast, slow, rtol):
    ff, fs = fast.fit, slow.fit
    assert ff.n == fs.n and ff.guarded == fs.guarded and ff.spread == fs.spread
    for name in ("theta", "H", "A"):
        a, b = getattr(ff, name), getattr(fs, name)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * float(np.abs(b).max()), err_msg=name)
    # the buffers hold the same standardized reports (the kernel standardizes on the fly)
    np.testing.assert_array_equal(fast.buf1, slow.buf1)
    np.testing.assert_array_equal(fast.buf2, slow.buf2)


@pytest.mark.parametrize("qd", [LOGIT, PLAIN, MEDIAN, Q90],
                         ids=["logit-threshold", "logit-plain-label", "median", "q90"])
def test_kernel_equals_python_path(qd):
    chunks = _chunks(5003, 7)
    fast, slow = _stream(qd, False, chunks), _stream(qd, True, chunks)
    assert fast._kernel is not None and slow._kernel is None
    # warm-up of 1000, then 40 blocks of 100; 3 reports wait
    assert fast.fit.n == slow.fit.n == 5000 and fast.buf1.shape[0] == 3
    assert np.all(np.isfinite(fast.fit.theta))
    _assert_same_fit(fast, slow, rtol=1e-10)
    ef, es = fast.estimate(), slow.estimate()
    np.testing.assert_allclose(ef.value, es.value, rtol=1e-10)
    np.testing.assert_allclose(ef.stderr, es.stderr, rtol=1e-10)


def test_the_kernel_path_moves_the_fit():
    """The comparison above is not vacuous: the 40 renewals move θ̂ away from the warm-up fit and
    multiply H, and other reports give a fit farther away than the tolerance."""
    chunks = _chunks(5003, 7)
    st = _stream(MEDIAN, False, chunks)
    u = st._std(np.vstack([b.numeric for b, _ in chunks])[:1000])
    u2 = st._std(np.vstack([x for _, x in chunks])[:1000])
    warm, _ = st.engine.warm_start(u, u2)
    assert st.fit.n == 5000 and st.fit.H[0, 0] > 4 * warm.H[0, 0]
    assert np.max(np.abs(st.fit.theta - warm.theta)) > 1e-3 * np.max(np.abs(warm.theta))
    other = _stream(MEDIAN, False, _chunks(5003, 8))
    assert np.max(np.abs(other.fit.theta - st.fit.theta) / np.abs(st.fit.theta)) > 1e-6


def _reference_fit(st, chunks):
    """The fit of ``st``'s reports recomputed with ``mechanisms.renewable.Renewable`` directly:
    the warm-up batch fit of the first ``warm_up`` standardized reports, then one renewal per
    complete block of ``batch_size``; the rest is the buffer."""
    x1 = np.vstack([b.numeric for b, _ in chunks])
    x2 = np.vstack([x for _, x in chunks])
    u1, u2 = st._std(x1), st._std(x2)
    two = st.closs.needs_x2
    m0, B = st.opts.warm_up, st.opts.batch_size
    fit, _ = st.engine.warm_start(u1[:m0], u2[:m0] if two else None)
    s = m0
    while s + B <= u1.shape[0]:
        fit = st.engine.renew(fit, u1[s:s + B], u2[s:s + B] if two else None)
        s += B
    return fit, u1[s:]


def _loss():
    from mechanisms.losses import QuantileRegressionLoss

    return QuantileRegressionLoss(tau=0.5, noised=(0, 1))


@pytest.mark.parametrize("qd", [
    {**PLAIN, "estimator": "sdr", "covariates": ["a"]},
    {"kind": "custom", "name": "cu", "fields": ["a", "b"],
     "loss": "tests.aggregator.test_renewable_kernel:_loss", "renewable": OPTS},
], ids=["logit-sdr", "custom"])
def test_queries_outside_the_kernel_take_the_python_path(qd):
    chunks = _chunks(2345, 3, cuts=(1, 3, 700, 5, 1200, 45, 101))
    st = build_state(qd, SCHEMA)
    assert st._kernel is None
    for b, x2 in chunks:
        st.update(b, x2)
    ref, rest = _reference_fit(st, chunks)
    assert st.fit.n == ref.n == 2300 and st.buf1.shape[0] == 45
    np.testing.assert_array_equal(st.buf1, rest)
    for name in ("theta", "H", "A"):
        np.testing.assert_allclose(getattr(st.fit, name), getattr(ref, name), rtol=1e-12, err_msg=name)
    assert st.fit.guarded == ref.guarded


def test_vectorized_exp_is_within_two_ulp_of_numpy():
    """``vexp`` (polynomial + 2^k from the rounding shifter's bits) against ``np.exp`` over its
    whole range, near 0 and at the clamps (x > 709 → e^709, x < −708 → e^−708)."""
    from aggregator.state._index_kernel import vexp

    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-708.0, 709.0, 200_000), rng.normal(0.0, 5.0, 200_000),
                        np.linspace(-40.0, 40.0, 80_001), [0.0, -0.0, 1e-300, -1e-300, 709.0, -708.0]])
    out, t, bits = np.empty_like(x), np.empty_like(x), np.empty(x.size, np.int64)
    vexp(x, out, t, bits)
    assert np.max(np.abs(out / np.exp(x) - 1.0)) <= 4e-16
    clamped = np.array([710.0, 1e308, -709.0, -1e308])
    out = np.empty(4)
    vexp(clamped, out, np.empty(4), np.empty(4, np.int64))
    np.testing.assert_allclose(out, np.exp([709.0, 709.0, -708.0, -708.0]), rtol=4e-16)
