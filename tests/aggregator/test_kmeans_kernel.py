"""The compiled k-means renewal (``aggregator.state._kmeans_kernel.renew_kmeans_blocks``) runs the
same algorithm as the Python path of ``MixtureState`` (``mechanisms.renewable.Renewable.renew``
with ``KMeansLoss``, forced with ``state._kernel = None``): the same fit (θ̂, H, A, n, spread,
guard count) and buffers, to rounding, for DR and naive k-means; Gaussian mixtures keep the Python
path."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.state import build_state
from ingest.client.batch import slice_batch
from tests.aggregator._state_support import stream_state
from tests.aggregator.test_mixture_state import _reports, _schema

SCHEMA = _schema()
OPTS = {"warm_up": 1000, "batch_size": 100}
KM3 = {"kind": "kmeans", "name": "km", "fields": ["a", "b"], "k": 3, "renewable": OPTS}
KM2_NAIVE = {**KM3, "name": "kn", "k": 2, "estimator": "naive"}
KM1 = {**KM3, "name": "k1", "k": 1}
#: uneven update sizes: remainders wait in the buffer between updates on both paths, and one
#: update crosses the warm-up
CUTS = (1, 3, 700, 5, 1999, 45, 101)


def _chunks(n: int, seed: int):
    batch, x2 = _reports(SCHEMA, n, np.random.default_rng(seed))
    chunks, lo = [], 0
    for at in (*np.cumsum(CUTS), n):
        chunks.append((slice_batch(batch, lo, int(at)), x2[lo:at]))
        lo = int(at)
    return chunks


def _stream(qd, python: bool, chunks):
    return stream_state(qd, SCHEMA, python, chunks)


@pytest.mark.parametrize("qd", [KM3, KM2_NAIVE, KM1], ids=["dr-k3", "naive-k2", "dr-k1"])
def test_kernel_equals_python_path(qd):
    chunks = _chunks(5003, 7)
    fast, slow = _stream(qd, False, chunks), _stream(qd, True, chunks)
    assert fast._kernel is not None and slow._kernel is None
    # warm-up of 1000, then 40 blocks of 100; 3 reports wait
    assert fast.fit.n == slow.fit.n == 5000 and fast.buf1.shape[0] == 3
    ff, fs = fast.fit, slow.fit
    assert ff.guarded == fs.guarded and ff.spread == fs.spread
    for name in ("theta", "H", "A"):
        a, b = getattr(ff, name), getattr(fs, name)
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10 * float(np.abs(b).max()), err_msg=name)
    np.testing.assert_array_equal(fast.buf1, slow.buf1)
    np.testing.assert_array_equal(fast.buf2, slow.buf2)
    ef, es = fast.estimate(), slow.estimate()
    np.testing.assert_allclose(ef.value, es.value, rtol=1e-10)
    np.testing.assert_allclose(ef.stderr, es.stderr, rtol=1e-10)


def test_the_comparison_is_not_vacuous():
    """The 40 renewals move the centres away from the warm-up fit and grow H, and other reports
    give a fit farther away than the tolerance above."""
    chunks = _chunks(5003, 7)
    st = _stream(KM3, False, chunks)
    x1 = np.vstack([b.numeric for b, _ in chunks])[:1000]
    x2 = np.vstack([x for _, x in chunks])[:1000]
    warm, _ = st.engine.warm_start(st._std(x1), st._std(x2))
    assert np.trace(st.fit.H) > 4 * np.trace(warm.H)
    assert np.max(np.abs(st.fit.theta - warm.theta)) > 1e-4
    other = _stream(KM3, False, _chunks(5003, 8))
    assert np.max(np.abs(other.fit.theta - st.fit.theta)) > 1e-6


def test_mixtures_keep_the_python_path():
    st = build_state({**KM3, "kind": "gaussian_mixture", "name": "gm"}, SCHEMA)
    assert st._kernel is None
