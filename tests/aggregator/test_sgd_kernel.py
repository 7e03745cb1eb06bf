"""The compiled SGD loop (``aggregator.state._sgd_kernel``) runs the same algorithm as the Python
loop of ``SGDState._update``: same iterates, averages, random-scaling and one-step sums, to
rounding, for every query it serves; queries it does not serve keep the Python loop."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.state import build_state
from tests.aggregator._state_support import make_batch, make_schema

SCHEMA = make_schema()
LOGIT = {"kind": "logistic_regression", "name": "lg", "covariates": ["a"], "label": "b", "threshold": -1.5}
PLAIN = {"kind": "logistic_regression", "name": "lp", "covariates": ["a", "b"], "label": "y"}
MEDIAN = {"kind": "quantile_regression", "name": "qr", "covariates": ["a"], "response": "b", "tau": 0.5}
Q90 = {**MEDIAN, "name": "q9", "tau": 0.9, "covariates": ["a", "y"]}
OPTS = {"batch_size": 32, "burn_in": 20}

FIELDS = ("theta", "avg", "rs_a", "rs_b", "rs_c", "t", "s", "os_m", "os_g", "os_s", "os_h", "os_ht",
          "os_t1", "os_t2", "os_nb", "buf1", "buf2")


def _stream(qd, python: bool, chunks):
    st = build_state(qd, SCHEMA)
    if python:
        st._kernel = None
    for b, x2 in chunks:
        st.update(b, x2)
    return st


@pytest.mark.parametrize("qd", [
    {**LOGIT, "sgd": {**OPTS, "ci": "plugin"}},
    {**PLAIN, "sgd": {**OPTS, "ci": "plugin"}},
    {**LOGIT, "sgd": {**OPTS, "ci": "random_scaling"}},
    {**MEDIAN, "sgd": OPTS},
    {**MEDIAN, "sgd": {**OPTS, "ci": "plugin"}},
    {**Q90, "sgd": {**OPTS, "ci": "plugin"}},
], ids=["logit-dr-plugin", "logit-plain-label", "logit-rs", "median-rs", "median-ladder",
        "q90-ladder"])
def test_kernel_equals_python_loop(qd):
    rng = np.random.default_rng(7)
    batch, x2, _ = make_batch(SCHEMA, 5003, rng)
    from tests.aggregator._state_support import split

    # uneven chunks: remainders are buffered between updates on both paths
    chunks, rest = [], (batch, x2)
    for at in (1, 3, 700, 5, 1999, 45):
        head, tail = split(rest[0], rest[1], at)
        chunks.append(head)
        rest = tail
    chunks.append(rest)
    fast, slow = _stream(qd, False, chunks), _stream(qd, True, chunks)
    assert fast._kernel is not None
    assert fast.t == slow.t > OPTS["burn_in"]
    for name in FIELDS:
        a, b = np.asarray(getattr(fast, name), float), np.asarray(getattr(slow, name), float)
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(b).max(initial=0))),
                                   err_msg=name)
    ef, es = fast.estimate(), slow.estimate()
    np.testing.assert_allclose(ef.value, es.value, rtol=1e-8)
    np.testing.assert_allclose(ef.stderr, es.stderr, rtol=1e-8)


@pytest.mark.parametrize("qd", [
    {**LOGIT, "estimator": "sdr", "label": "y", "threshold": None, "sgd": OPTS},
    {"kind": "custom", "name": "cu", "fields": ["a", "b"], "loss": "tests.aggregator.test_sgd_kernel:_loss"},
])
def test_queries_outside_the_kernel_keep_the_python_loop(qd):
    qd = {k: v for k, v in qd.items() if v is not None}
    st = build_state(qd, SCHEMA)
    assert st._kernel is None
    batch, x2, _ = make_batch(SCHEMA, 400, np.random.default_rng(3))
    st.update(batch, x2)
    assert st.t == 400 // st.opts.batch_size


def _loss():
    from mechanisms.losses import QuantileRegressionLoss

    return QuantileRegressionLoss(tau=0.5, noised=(0, 1))


def test_vectorized_exp_is_within_two_ulp_of_numpy():
    """The kernel's ``_exp`` (polynomial + 2^k from the rounding shifter's bits) against
    ``np.exp`` over its whole range, near 0 and at the clamps (x > 709 → e^709, x < −708 → e^−708)."""
    from aggregator.state._sgd_kernel import _exp

    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-708.0, 709.0, 200_000), rng.normal(0.0, 5.0, 200_000),
                        np.linspace(-40.0, 40.0, 80_001), [0.0, -0.0, 1e-300, -1e-300, 709.0, -708.0]])
    out, t, bits = np.empty_like(x), np.empty_like(x), np.empty(x.size, np.int64)
    _exp(x, out, t, bits)
    assert np.max(np.abs(out / np.exp(x) - 1.0)) <= 4e-16
    clamped = np.array([710.0, 1e308, -709.0, -1e308])
    out = np.empty(4)
    _exp(clamped, out, np.empty(4), np.empty(4, np.int64))
    np.testing.assert_allclose(out, np.exp([709.0, 709.0, -708.0, -708.0]), rtol=4e-16)
