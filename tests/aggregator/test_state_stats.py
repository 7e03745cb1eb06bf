"""Statistical tests of the closed-form and histogram state estimators (moments, SDR Gram
regression, DR quantiles) against independent batch computations (``mechanisms.estimation``) and
coverage of their confidence intervals (docs/mechanisms.md §4, §6). The renewable regression
states have theirs in ``test_renewable_stats.py``."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.state import build_state
from mechanisms.estimation import dr_quantile, m_estimate, variance_estimate
from mechanisms.losses import LinearRegressionLoss
from tests.aggregator._state_support import make_batch, make_schema

pytestmark = pytest.mark.slow

SCHEMA = make_schema()
ZIL = SCHEMA.zil_mechanism()
D = ZIL.zero_prob


@pytest.fixture(scope="module")
def big():
    return make_batch(SCHEMA, 100_000, np.random.default_rng(4242))


def _fed(qd, batch, x2):
    """Stream ``batch`` into a fresh state in 13 chunks, as records would arrive."""
    st = build_state(qd, SCHEMA)
    idx = np.arange(batch.n)
    for rows in np.array_split(idx, 13):
        cat = {k: (c.take(rows) if hasattr(c, "take") else c[rows]) for k, c in batch.categorical.items()}
        sub = type(batch)(batch.fingerprint, batch.numeric[rows], cat)
        st.update(sub, x2[rows])
    return st


def test_moments_match_batch_formulas(big):
    batch, x2, _ = big
    x1a, x2a = batch.numeric[:, 0], x2[:, 0]
    n = batch.n
    m = _fed({"kind": "mean", "name": "m", "field": "a"}, batch, x2).estimate()
    np.testing.assert_allclose(m.value, [x1a.mean()], rtol=1e-12)
    np.testing.assert_allclose(m.stderr, [x1a.std(ddof=1) / np.sqrt(n)], rtol=1e-9)
    dr = _fed({"kind": "mean", "name": "d", "field": "a", "estimator": "dr"}, batch, x2).estimate()
    g = (x1a - (1 - D) * x2a) / D
    np.testing.assert_allclose(dr.value, [g.mean()], rtol=1e-10)
    np.testing.assert_allclose(dr.stderr, [g.std(ddof=1) / np.sqrt(n)], rtol=1e-9)
    sl = _fed({"kind": "mean", "name": "s", "field": "a", "estimator": "sl"}, batch, x2).estimate()
    np.testing.assert_allclose(sl.value, [x2a.mean()], rtol=1e-12)
    v = _fed({"kind": "variance", "name": "v", "field": "a"}, batch, x2).estimate()
    ref = variance_estimate(x1a, zero_prob=D, scale=ZIL.coord_scale[0])
    np.testing.assert_allclose(v.value, ref.theta, rtol=1e-10)
    np.testing.assert_allclose(v.stderr, ref.stderr, rtol=1e-4)  # ddof n-1 vs n: 1/(2n) apart


def test_moments_are_unbiased_for_the_truth():
    """Across 200 small streams the SDR/DR means and SDR variance centre on the raw-data values."""
    z = {"m": [], "d": [], "v": []}
    for seed in range(200):
        batch, x2, x = make_batch(SCHEMA, 2000, np.random.default_rng(seed))
        for key, qd in (
            ("m", {"kind": "mean", "name": "m", "field": "b"}),
            ("d", {"kind": "mean", "name": "d", "field": "b", "estimator": "dr"}),
            ("v", {"kind": "variance", "name": "v", "field": "b"}),
        ):
            e = build_state(qd, SCHEMA).update(batch, x2).estimate()
            t = x[:, 1].mean() if key != "v" else x[:, 1].var()
            z[key].append((e.value[0] - t) / e.stderr[0])
    for key, vals in z.items():
        vals = np.asarray(vals)
        # standardized errors: mean 0 (SE of the mean of 200 is <= 1/sqrt(200)); spread <= 1
        assert abs(vals.mean()) < 4 / np.sqrt(200), key
        assert 0.5 < vals.std() < 1.3, key


def test_gram_matches_batch_sdr_closed_form(big):
    batch, x2, _ = big
    st = _fed({"kind": "linear_regression", "name": "lr", "response": "b", "covariates": ["a"]}, batch, x2)
    e = st.estimate()
    loss = LinearRegressionLoss(noised=(0, 1), covariates=(0,))
    ref = m_estimate(loss, batch.numeric[:, [0, 1]], x2[:, [0, 1]], zero_prob=D,
                     scale=ZIL.coord_scale[[0, 1]], method="sdr")
    np.testing.assert_allclose(e.value, ref.theta, rtol=1e-8)
    np.testing.assert_allclose(e.stderr, ref.stderr, rtol=1e-3)
    # and the truth (slope of E[b|a]; clipping of b at ±5 is rare) is inside 4 SE
    assert np.all(np.abs(e.value - np.array([-4.0, 0.5])) < 4 * e.stderr + 0.02)


def test_histogram_quantiles_match_batch_dr_quantile(big):
    batch, x2, _ = big
    q = [0.1, 0.25, 0.5, 0.75, 0.9]
    qd = {"kind": "quantiles", "name": "q", "field": "b", "q": q, "bins": 2000}
    e = _fed(qd, batch, x2).estimate()
    ref = dr_quantile(batch.numeric[:, 1], x2[:, 1], q, D)
    width = 10.0 / 2000
    assert np.all(np.abs(e.value - ref.theta) <= width), (e.value, ref.theta)
    # Woodruff stderr vs the batch kernel-density sandwich: two noisy density estimates, within 50 %
    np.testing.assert_allclose(e.stderr, ref.stderr, rtol=0.5)


def test_histogram_quantile_ci_coverage():
    """95 % Woodruff intervals of the DR median and 0.9-quantile cover in 90–99 % of 400 streams."""
    hits = np.zeros(2)
    reps = 400
    for seed in range(reps):
        batch, x2, _ = make_batch(SCHEMA, 3000, np.random.default_rng(10_000 + seed))
        e = build_state({"kind": "quantiles", "name": "q", "field": "b", "q": [0.5, 0.9], "bins": 1000},
                        SCHEMA).update(batch, x2).estimate()
        # population quantiles of b: -4 + 0.5 a + L (a ~ U(0,10), L ~ Logistic), computed below
        hits += (e.ci_low <= POP_Q) & (POP_Q <= e.ci_high)
    cover = hits / reps
    assert np.all((cover > 0.90) & (cover < 0.99)), cover


def test_histogram_quantile_ci_contains_an_atom_median():
    """Discrete data (integers 0..10, median exactly 5): the interval must contain the atom.

    The jump of F at 5 (mass 1/11) is far wider than ±z·s at n = 5·10⁴, so both Woodruff limits
    fall in the atom's bin; without rounding them outwards to the bin edges the interval sat
    strictly inside that bin and excluded 5 (as on the flights' integer minutes).
    """
    from ingest.client.batch import ReportBatch

    for seed in range(5):
        rng = np.random.default_rng(777 + seed)
        x = np.column_stack([rng.integers(0, 11, 50_000).astype(float), np.zeros(50_000), np.zeros(50_000)])
        x1 = ZIL.privatize(x, rng)
        cat = {"c": SCHEMA.categorical_mechanism("c").privatize(np.zeros(50_000, int), rng),
               "d": SCHEMA.categorical_mechanism("d").privatize(np.zeros(50_000, int), rng)}
        batch = ReportBatch(SCHEMA.fingerprint, x1, cat)
        e = build_state({"kind": "quantiles", "name": "q", "field": "a", "q": [0.5], "bins": 1000},
                        SCHEMA).update(batch, ZIL.double(x1, rng)).estimate()
        assert e.ci_low[0] <= 5.0 <= e.ci_high[0], (seed, e.value, e.ci_low, e.ci_high)
        assert e.ci_high[0] - e.ci_low[0] < 1.0


def _population_quantiles() -> np.ndarray:
    from scipy import optimize, stats

    grid = np.linspace(0, 10, 4001)

    def cdf(t):
        return np.mean(stats.logistic.cdf(t + 4 - 0.5 * grid))

    return np.array([optimize.brentq(lambda t, p=p: cdf(t) - p, -5, 5, xtol=1e-10) for p in (0.5, 0.9)])


POP_Q = _population_quantiles()
