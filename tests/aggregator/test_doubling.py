"""The consumer-side doubling draws (``aggregator.state.doubling_draws``): XXH3-64 seeds and
SplitMix64 + ziggurat rows against an independent pure-Python computation, the ziggurat tables
(equal layer areas) and samplers (distributions and tails), independence of the
batching, and the distribution of the draws (standard ``SL_d(I)``: mean 0, covariance I, one
``W ~ Exp(1)`` shared by a row's coordinates, Laplace marginals)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from aggregator.state import _kernels, double_records, doubling_draws, doubling_seed

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def _mix(seed: int, j: int) -> int:
    z = (seed + j * GAMMA) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _uniform(seed: int, j: int) -> float:
    return ((_mix(seed, j) >> 11) + 0.5) / 2.0**53


class _Stream:
    """SplitMix64 outputs 1, 2, … of one seed and the two ziggurat samplers, in plain Python."""

    def __init__(self, seed: int) -> None:
        self.seed, self.j = seed, 1

    def _next(self) -> int:
        z = _mix(self.seed, self.j)
        self.j += 1
        return z

    def _u(self) -> float:
        u = _uniform(self.seed, self.j)
        self.j += 1
        return u

    def normal(self) -> float:
        r, x, f = _kernels._ZN_R, _kernels._ZN_X, _kernels._ZN_F
        while True:
            z = self._next()
            i, neg = z & 255, (z >> 8) & 1
            v = (z >> 11) / 2.0**53 * x[i]
            if v < x[i + 1]:
                return -v if neg else v
            if i == 0:
                while True:
                    a = -math.log(self._u()) / r
                    b = -math.log(self._u())
                    if b + b > a * a:
                        return -(r + a) if neg else r + a
            if f[i] + self._u() * (f[i + 1] - f[i]) < math.exp(-0.5 * v * v):
                return -v if neg else v

    def exponential(self) -> float:
        r, x, f = _kernels._ZE_R, _kernels._ZE_X, _kernels._ZE_F
        while True:
            z = self._next()
            i = z & 255
            v = (z >> 11) / 2.0**53 * x[i]
            if v < x[i + 1]:
                return v
            if i == 0:
                return r - math.log(self._u())
            if f[i] + self._u() * (f[i + 1] - f[i]) < math.exp(-v):
                return v


def _reference_rows(record: bytes, n: int, d: int) -> np.ndarray:
    """Rows of one record, from the layout stated in ``_kernels.sl_draws``, in plain Python."""
    st = _Stream(doubling_seed(record))
    out = np.empty((n, d))
    for i in range(n):
        sw = math.sqrt(st.exponential())
        out[i] = [sw * st.normal() for _ in range(d)]
    return out


@pytest.mark.parametrize("which", ["normal", "exponential"])
def test_ziggurat_layers_have_equal_areas(which):
    """Layer i ≥ 1 is [0, x_i] × [f(x_i), f(x_{i+1})]; the base is [0, r] × [0, f(r)] plus the
    tail; all 256 have the same area V, and the layers close at f(0) = 1."""
    if which == "normal":
        r, x, fx = _kernels._ZN_R, _kernels._ZN_X, _kernels._ZN_F
        tail = math.sqrt(math.pi / 2) * math.erfc(r / math.sqrt(2))
        f = lambda v: np.exp(-0.5 * v * v)  # noqa: E731
    else:
        r, x, fx = _kernels._ZE_R, _kernels._ZE_X, _kernels._ZE_F
        tail = math.exp(-r)
        f = lambda v: np.exp(-v)  # noqa: E731
    np.testing.assert_allclose(fx, f(x), rtol=1e-15)
    area = r * f(r) + tail
    assert x.shape == (257,) and x[1] == r and x[-1] == 0 and fx[-1] == 1
    np.testing.assert_allclose(x[0] * fx[1], area, rtol=1e-15)
    np.testing.assert_allclose(x[1:256] * (fx[2:] - fx[1:256]), area, rtol=1e-11)
    assert np.all(np.diff(x) < 0)


@pytest.mark.parametrize("seed", [0, 7])
def test_samplers_equal_an_independent_computation(seed):
    st = _Stream(seed)
    want = [st.normal() for _ in range(3000)]
    np.testing.assert_allclose(_kernels.normal_draws(seed, 3000), want, rtol=1e-14, atol=1e-300)
    st = _Stream(seed)
    want = [st.exponential() for _ in range(3000)]
    np.testing.assert_allclose(_kernels.exponential_draws(seed, 3000), want, rtol=1e-14, atol=1e-300)


def test_samplers_have_the_right_distributions_and_tails():
    """10⁶ draws each: KS against N(0, 1) and Exp(1) (p > 10⁻⁵), and the frequency of the tail
    beyond the base layer's edge r (P = 2Φ(−r) ≈ 2.6·10⁻⁴, e^(−r) ≈ 4.5·10⁻⁴) within 4.5 SE,
    so the tail branches are exercised and right."""
    n = 10**6
    z = _kernels.normal_draws(12345, n)
    e = _kernels.exponential_draws(54321, n)
    assert stats.kstest(z, "norm").pvalue > 1e-5
    assert stats.kstest(e, "expon").pvalue > 1e-5
    for sample, p in ((np.abs(z) > _kernels._ZN_R, 2 * stats.norm.sf(_kernels._ZN_R)),
                      (e > _kernels._ZE_R, math.exp(-_kernels._ZE_R))):
        assert abs(sample.mean() - p) < 4.5 * math.sqrt(p * (1 - p) / n)
    # beyond the tail edge the shape is right too: E[z² | |z| > r] and E[e − r | e > r] = 1
    zt = np.abs(z[np.abs(z) > _kernels._ZN_R])
    r = _kernels._ZN_R
    mean_tail = stats.norm.pdf(r) / stats.norm.sf(r)  # E[|z| | |z| > r]
    assert abs(zt.mean() - mean_tail) < 4.5 * zt.std() / math.sqrt(zt.size)
    et = e[e > _kernels._ZE_R] - _kernels._ZE_R
    assert abs(et.mean() - 1) < 4.5 / math.sqrt(et.size)


def test_seed_is_xxh3_64_of_the_bytes():
    # XXH3-64 (seed 0) of the empty input, from the xxHash specification's test vectors
    assert doubling_seed(b"") == 0x2D06800538D394C2
    assert doubling_seed(bytearray(b"record-1")) == doubling_seed(b"record-1") != doubling_seed(b"record-2")
    with pytest.raises(TypeError):
        doubling_seed("not bytes")


@pytest.mark.parametrize("d", [1, 2, 5])
def test_draws_equal_an_independent_computation(d):
    records = [b"", b"a", bytes(range(256)) * 3, b"record-1"]
    counts = [2, 0, 5, 3]
    got = doubling_draws(records, counts, d)
    want = np.concatenate([_reference_rows(r, n, d) for r, n in zip(records, counts, strict=True)])
    assert got.shape == (10, d)
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-300)


@pytest.mark.parametrize("sd", [2.5, np.array([134.2, 134.2, 2236.1, 313.0, 10.3])])
def test_double_records_is_the_draws_scaled_and_added_bit_for_bit(sd):
    # the fused kernel must give exactly what the worker computed before: g *= sd; g += x1
    rng = np.random.default_rng(11)
    records = [rng.bytes(int(m)) for m in rng.integers(1, 500, 30)]
    counts = rng.integers(0, 40, 30).tolist()
    x1 = rng.normal(0.0, 300.0, (sum(counts), 5))
    want = doubling_draws(records, counts, 5)
    want *= sd
    want += x1
    got = double_records(records, counts, x1, sd)
    assert np.array_equal(got, want)
    assert np.array_equal(double_records(records, counts, np.asfortranarray(x1), sd), want)


def test_double_records_refuses_mismatched_shapes():
    records, counts = [b"a", b"b"], [2, 3]
    with pytest.raises(ValueError, match=r"x1 must have shape \(sum\(counts\), d\) = \(5, d\)"):
        double_records(records, counts, np.zeros((4, 2)), 1.0)
    with pytest.raises(ValueError, match=r"sd must be a scalar or of shape \(2,\)"):
        double_records(records, counts, np.zeros((5, 2)), np.ones(3))


def test_draws_do_not_depend_on_the_batching():
    rng = np.random.default_rng(5)
    records = [rng.bytes(int(m)) for m in rng.integers(1, 3000, 40)]
    counts = rng.integers(0, 50, 40).tolist()
    whole = doubling_draws(records, counts, 5)
    parts = [doubling_draws(records[i:i + 7], counts[i:i + 7], 5) for i in range(0, 40, 7)]
    assert np.array_equal(whole, np.concatenate(parts))
    again = doubling_draws(list(reversed(records)), list(reversed(counts)), 5)
    starts = np.cumsum([0, *counts])
    for i in range(40):  # record i's rows are the same wherever it sits in the batch
        rstart = int(np.sum(counts[i + 1:]))  # records 39 … i+1 come first
        assert np.array_equal(again[rstart:rstart + counts[i]], whole[starts[i]:starts[i + 1]])


def test_draws_have_the_standard_sl_distribution():
    """n = 2·10⁵ rows: per coordinate E x = 0 (Var x = 1), E x² = 1 (Var x² = E W²·E G⁴ − 1 = 5),
    E x₁²x₂² = E W² = 2 (Var = E W⁴·(E G⁴)² − 4 = 212), E x₁x₂ = 0 (Var = E W² = 2); bounds at
    4.5 SE (all of them pass together with probability > 1 − 10⁻⁴). Marginals are Laplace with
    scale 1/√2 (KS p > 10⁻⁵)."""
    rng = np.random.default_rng(11)
    records = [rng.bytes(64) for _ in range(2000)]
    x = doubling_draws(records, [100] * 2000, 3)
    n = x.shape[0]
    for c in range(3):
        assert abs(x[:, c].mean()) < 4.5 * math.sqrt(1 / n)
        assert abs((x[:, c] ** 2).mean() - 1) < 4.5 * math.sqrt(5 / n)
        assert stats.kstest(x[:, c], stats.laplace(scale=1 / math.sqrt(2)).cdf).pvalue > 1e-5
    assert abs((x[:, 0] ** 2 * x[:, 1] ** 2).mean() - 2) < 4.5 * math.sqrt(212 / n)
    assert abs((x[:, 0] * x[:, 2]).mean()) < 4.5 * math.sqrt(2 / n)
    # consecutive rows and records are uncorrelated (the streams do not overlap)
    assert abs((x[1:, 0] * x[:-1, 0]).mean()) < 4.5 * math.sqrt(1 / n)
    first = x[::100, 0]
    assert abs((first[1:] * first[:-1]).mean()) < 4.5 * math.sqrt(1 / first.size)


def test_doubler_is_the_schemas_doubling_record_by_record_or_batched():
    """``Doubler(schema)``: ``sd = sqrt(zero_prob · noise_variance)``; ``double_many`` over several
    records equals ``double`` of each record's rows, and a schema without numeric fields or a
    batch without reports gives ``X̃₁`` back (a copy)."""
    from aggregator.state import Doubler
    from ingest.client.batch import ReportBatch, slice_batch
    from ingest.client.schema import TelemetrySchema
    from tests.aggregator._state_support import make_batch, make_schema

    schema = make_schema()
    dbl = Doubler(schema)
    mech = schema.zil_mechanism()
    assert np.array_equal(dbl.sd, np.sqrt(mech.zero_prob * mech.noise_variance))
    batch, _, _ = make_batch(schema, 30, np.random.default_rng(2))
    records, counts = [b"r0", b"r1", b"r2"], [10, 0, 20]
    got = dbl.double_many(batch, records, counts)
    assert np.array_equal(got, double_records(records, counts, batch.numeric, dbl.sd))
    per = [dbl.double(slice_batch(batch, a, a + n), r)
           for r, a, n in zip(records, np.cumsum([0, *counts[:-1]]), counts)]
    assert np.array_equal(got, np.concatenate(per))
    empty = slice_batch(batch, 0, 0)
    assert dbl.double(empty, b"x").shape == (0, batch.numeric.shape[1])
    cat_only = TelemetrySchema.from_dict({"name": "c", "version": 1, "categorical": [
        {"name": "c", "categories": ["a", "b"], "sensitive": ["a"], "mechanism": "urr", "epsilon": 1.0}]})
    none = Doubler(cat_only)
    assert none.sd is None
    b = ReportBatch(cat_only.fingerprint, np.zeros((3, 0)), {"c": np.zeros(3, np.int32)})
    out = none.double(b, b"x")
    assert out.shape == (3, 0) and out is not b.numeric
