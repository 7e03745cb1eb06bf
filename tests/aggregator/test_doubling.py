"""The consumer-side doubling draws (``aggregator.state.doubling_draws``): XXH3-64 seeds and
SplitMix64 + Box–Muller rows against an independent pure-Python computation, independence of the
batching, and the distribution of the draws (standard ``SL_d(I)``: mean 0, covariance I, one
``W ~ Exp(1)`` shared by a row's coordinates, Laplace marginals)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from aggregator.state import doubling_draws, doubling_seed

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def _splitmix_uniform(seed: int, j: int) -> float:
    z = (seed + j * GAMMA) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    z ^= z >> 31
    return ((z >> 11) + 0.5) / 2.0**53


def _reference_rows(record: bytes, n: int, d: int) -> np.ndarray:
    """Rows of one record, from the layout stated in ``_kernels.sl_draws``, in plain Python."""
    seed = doubling_seed(record)
    p = (d + 1) // 2
    out = np.empty((n, d))
    for i in range(n):
        j = i * (1 + 2 * p) + 1
        sw = math.sqrt(-math.log(_splitmix_uniform(seed, j)))
        g = []
        for t in range(p):
            r = math.sqrt(-2.0 * math.log(_splitmix_uniform(seed, j + 1 + 2 * t)))
            th = 2.0 * math.pi * _splitmix_uniform(seed, j + 2 + 2 * t)
            g += [r * math.cos(th), r * math.sin(th)]
        out[i] = np.array(g[:d]) * sw
    return out


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
