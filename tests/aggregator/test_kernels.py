"""The compiled update loops of the closed-form states (``aggregator.state._kernels``) against
independent NumPy computations: moments (two-pass mean and centred cross-products), the three
histograms (``searchsorted`` + ``bincount``) and uRAP counts (``URAP.counts``)."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.state import _kernels, build_state
from mechanisms.errors import ParameterError
from mechanisms.uldp import RAPPOR, URAP
from mechanisms.uldp.sparse import SparseBits
from tests.aggregator._state_support import make_batch, make_schema

SCHEMA = make_schema()


@pytest.mark.parametrize("n", [0, 1, 7, 5000])
def test_moments_batch_matches_numpy(n):
    rng = np.random.default_rng(n)
    x = rng.normal(3.0, 2.0, (n, 3))
    a, b = x[:, 0], x[:, 2]  # strided views, as the states pass them
    mb, cb = _kernels.moments_batch(a, b)
    if n == 0:
        assert np.all(mb == 0) and np.all(cb == 0)
        return
    z = np.column_stack([a, b, a * a, b * b])
    d = z - z.mean(axis=0)
    np.testing.assert_allclose(mb, z.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(cb, d.T @ d, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("bins", [16, 17, 3000, 100_000])
@pytest.mark.parametrize("field", ["a", "b"])
def test_histogram_counts_equal_searchsorted(bins, field):
    """Values on, just beside, between and far outside the edges; integer-ish data on the grid."""
    st = build_state({"kind": "quantiles", "name": "q", "field": field, "q": [0.5], "bins": bins}, SCHEMA)
    e = st.edges
    rng = np.random.default_rng(bins)
    span = e[-1] - e[0]
    x = np.concatenate([
        e, np.nextafter(e, np.inf), np.nextafter(e, -np.inf),
        rng.uniform(e[0] - span, e[-1] + span, 20_000),
        np.round(rng.normal(e.mean(), span / 4, 20_000), 1),
        [-1e300, 1e300, e[0] - 1e-300, 0.0, -0.0],
    ])
    y = rng.permutation(x)
    c1, c2, cm = (np.zeros(e.size + 1, np.int64) for _ in range(3))
    _kernels.histogram3(x, y, float(e[0]), st._inv_w, st._pad, c1, c2, cm)
    m = e.size + 1
    for got, v in ((c1, x), (c2, y), (cm, np.maximum(x, y))):
        np.testing.assert_array_equal(got, np.bincount(np.searchsorted(e, v, side="left"), minlength=m))


@pytest.mark.parametrize("mech", [URAP(12, [0, 3, 5], 1.0), URAP(105, list(range(10)), 2.0), RAPPOR(9, 1.5)])
def test_urap_counts_equal_the_mechanism(mech):
    rng = np.random.default_rng(mech.k)
    x = rng.integers(0, mech.k, 3000)
    reports = mech.privatize(x, rng)
    ref = URAP(mech.k, mech.sensitive, mech.epsilon, theta=mech.theta, max_patterns=0).counts(reports) \
        if type(mech) is URAP else mech.counts(reports)
    rank = np.asarray(mech._rank, np.int64)
    counts, protected, ob, bad, _ = _kernels.urap_counts(reports.indices, reports.offsets, rank,
                                                         mech.k, mech.s)
    assert bad == -1
    np.testing.assert_array_equal(counts, ref.counts)
    assert protected == ref.overflow_n + sum((ref.patterns or {}).values())
    if not ref.patterns:
        np.testing.assert_array_equal(ob, ref.overflow_bits)


@pytest.mark.parametrize("seed", range(4))
def test_urap_counts_rows_empty_runs_slices_and_first_bad_report(seed):
    """Empty reports (alone and in runs), protected and public reports in random order, a batch
    slice whose offsets do not start at 0, and the first report with two public bits, against
    ``URAP.counts`` (the slice re-based to offsets from 0)."""
    rng = np.random.default_rng(seed)
    k, sens = 20, np.array([1, 4, 7, 11, 19])
    mech = URAP(k, sens.tolist(), 1.0, max_patterns=0)
    rank = np.asarray(mech._rank, np.int64)
    public = np.setdiff1d(np.arange(k), sens)
    rows = []
    for _ in range(3000):
        bits = set(rng.choice(sens, rng.integers(0, 4), replace=False).tolist())
        if rng.random() < 0.5:
            bits.add(int(rng.choice(public)))
        rows.append(sorted(bits))
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    indices = np.array([j for r in rows for j in r], np.int32)
    for lo, hi in ((0, 3000), (137, 2011), (5, 5)):
        sub = offsets[lo:hi + 1]
        counts, protected, ob, bad, _ = _kernels.urap_counts(indices, sub, rank, k, sens.size)
        ref = mech.counts(SparseBits(indices[sub[0]:sub[-1]], sub - sub[0], k))
        assert bad == -1 and protected == ref.overflow_n
        np.testing.assert_array_equal(counts, ref.counts)
        np.testing.assert_array_equal(ob, ref.overflow_bits)
    at = int(rng.integers(10, 2900))
    rows[at] = sorted(set(rows[at]) | set(public[:2].tolist()))
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    indices = np.array([j for r in rows for j in r], np.int32)
    _, _, _, bad, nbad = _kernels.urap_counts(indices, offsets, rank, k, sens.size)
    assert (bad, nbad) == (at, len(set(rows[at]) - set(sens.tolist())))
    with pytest.raises(ParameterError, match=f"report {at} has {nbad} non-sensitive bits"):
        mech.counts(SparseBits(indices, offsets, k))


def test_counts_state_fast_path_equals_mechanism_and_refuses_two_public_bits():
    batch, x2, _ = make_batch(SCHEMA, 4000, np.random.default_rng(5))
    st = build_state({"kind": "frequency", "name": "f", "field": "d"}, SCHEMA)
    assert st._fast is not None
    st.update(batch, x2)
    ref = st.mechanism.counts(batch.categorical["d"])
    assert st.counts.n == ref.n and st.counts.overflow_n == ref.overflow_n
    np.testing.assert_array_equal(st.counts.counts, ref.counts)
    np.testing.assert_array_equal(st.counts.overflow_bits, ref.overflow_bits)
    # two non-sensitive bits in one report: impossible under uRAP, refused like the mechanism does
    ns = [j for j in range(st.mechanism.k) if st.mechanism._rank[j] < 0][:2]
    bad = SparseBits(np.array(ns, np.int32), np.array([0, 2]), st.mechanism.k)
    bb = type(batch)(batch.fingerprint, batch.numeric[:1], {"c": batch.categorical["c"][:1], "d": bad})
    with pytest.raises(ParameterError, match="report 0 has 2 non-sensitive bits"):
        st.update(bb, x2[:1])
    with pytest.raises(ParameterError, match="report 0 has 2 non-sensitive bits"):
        st.mechanism.counts(bad)


def test_jit_compiles_in_process_where_numba_cannot_cache(caplog):
    """numba refuses ``cache=True`` at import where it finds no writable cache directory (here:
    a function whose source is ``<string>``); the loops then compile per process, with a warning."""
    from ingest.jit import jit

    ns: dict = {}
    exec("def f(x):\n    return x + 1\n", ns)
    g = jit(nogil=True)(ns["f"])
    assert g(41) == 42
    assert "cannot cache f" in caplog.text and "NUMBA_CACHE_DIR" in caplog.text


def test_warm_all_compiles_every_kernel():
    from aggregator.state import _renewable_kernel
    from aggregator.warm import warm_all
    from ingest.client import decode_kernel

    warm_all()
    for fn in (decode_kernel.scan, decode_kernel.fill, _kernels._sl_rows, _kernels.histogram3,
               _renewable_kernel.renew_blocks):
        assert fn.signatures, fn
