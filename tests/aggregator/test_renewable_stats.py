"""Statistical and algebraic tests of the renewable M-estimation state
(``aggregator.state.renewable.RenewableState``, docs/mechanisms.md §6.5–§6.8).

The reports are the streams of the efficiency benchmark (``benchmarks/efficiency.py``, copied here
so that the tests do not move with the benchmark): four ZIL-privatized fields, δ = 0.2, λ = 0.5;
a DR logistic regression with a thresholded label and a DR median regression, three coefficients
each, with known truths. Every query names its ``renewable`` options (the tests do not follow
the default warm-up).

* the online estimate agrees with the batch M-estimate (``mechanisms.estimation.m_estimate``) of
  the same reports, relative to the batch standard error;
* 95 % Wald intervals cover the truth at the nominal rate, from one partition and merged from 4;
* merging is exact and order-free, and the state is a function of its reports (not of how the
  records grouped them, nor of checkpoints in between);
* kinked losses use the bandwidth rule ``kink_bandwidth`` (``0.6·spread·n^(−1/5)``) in their
  Hessians, smooth ones the analytic DR Hessian;
* below the warm-up the estimate is the batch fit of the pooled reports; too few reports per
  parameter is an ``EmptyStateError``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from aggregator.errors import EmptyStateError
from aggregator.state import State, build_state
from ingest.client.batch import ReportBatch
from ingest.client.schema import TelemetrySchema
from mechanisms.estimation import m_estimate
from mechanisms.losses import LogisticLoss, QuantileRegressionLoss
from mechanisms.renewable import BANDWIDTH_C, BANDWIDTH_POWER, kink_bandwidth

pytestmark = pytest.mark.slow

ZERO_PROB = 0.2
SCHEMA = TelemetrySchema.from_dict({
    "name": "renewable-stats", "version": 1,
    "numeric": {"zero_prob": ZERO_PROB, "scale": 0.5, "fields": [
        {"name": "c1", "low": -1.0, "high": 1.0},
        {"name": "c2", "low": -1.0, "high": 1.0},
        {"name": "lab", "low": 0.0, "high": 1.0},
        {"name": "y", "low": -3.0, "high": 5.0},
    ]},
})
MECH = SCHEMA.zil_mechanism()
C1, C2, LAB, Y = range(4)
BETA_LOGIT = np.array([0.5, 1.0, -1.0])
BETA_LINEAR = np.array([1.0, 1.0, -1.0])
#: warm-up 5000, blocks of 1000
OPTS = {"warm_up": 5000, "batch_size": 1000}
QUERIES = {
    "logistic": {"kind": "logistic_regression", "name": "logistic", "covariates": ["c1", "c2"],
                 "label": "lab", "threshold": 0.5, "estimator": "dr", "renewable": OPTS},
    "median_regression": {"kind": "quantile_regression", "name": "median_regression", "response": "y",
                          "covariates": ["c1", "c2"], "tau": 0.5, "estimator": "dr", "renewable": OPTS},
}
#: P(lab = 1 | c) = σ(0.5 + c1 − c2), label 1{lab > 0.5}; median(y | c) = 1 + c1 − c2 (symmetric
#: errors; the clipping at −3 and 5 is more than 4σ away at every c)
TRUTH = {"logistic": BETA_LOGIT, "median_regression": BETA_LINEAR}
KINDS = tuple(QUERIES)
#: columns of the batch fits (original units)
COLS = {"logistic": [C1, C2, LAB], "median_regression": [C1, C2, Y]}


def simulate(n: int, rng: np.random.Generator) -> np.ndarray:
    """Raw records (n, 4): ``c1, c2 ~ U(−1, 1)``, ``lab ~ Bernoulli(σ(0.5 + c1 − c2))``,
    ``y = 1 + c1 − c2 + N(0, 0.5²)`` clipped to [−3, 5] (as ``benchmarks.efficiency.simulate``)."""
    c = rng.uniform(-1.0, 1.0, (n, 2))
    lab = (rng.random(n) < 1.0 / (1.0 + np.exp(-(BETA_LOGIT[0] + c @ BETA_LOGIT[1:])))).astype(float)
    y = BETA_LINEAR[0] + c @ BETA_LINEAR[1:] + 0.5 * rng.standard_normal(n)
    return np.column_stack([c, lab, np.clip(y, -3.0, 5.0)])


def _batch_loss(kind: str):
    if kind == "logistic":
        return LogisticLoss(covariates=(0, 1), noised=(0, 1, 2),
                            label=lambda a: (a[:, 2] > 0.5).astype(float))
    return QuantileRegressionLoss(tau=0.5, noised=(0, 1, 2))


def _reports(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``X̃₁`` (privatized) and ``X̃₂`` (doubled) of ``n`` simulated records, shape (n, 5)."""
    x1 = MECH.privatize(simulate(n, rng), rng=rng)
    return x1, MECH.double(x1, rng=rng)


def _batch(x1: np.ndarray) -> ReportBatch:
    return ReportBatch(bytes(SCHEMA.fingerprint), x1, {})


def _fold(qd: dict, x1, x2, sizes=None, python: bool = False):
    """A fresh state of ``qd`` with the reports folded in records of ``sizes`` (default: one)."""
    st = build_state(qd, SCHEMA)
    if python:
        st._kernel = None
    bounds = np.cumsum([0, *(sizes if sizes is not None else [x1.shape[0]])])
    assert bounds[-1] == x1.shape[0]
    for s, e in itertools.pairwise(bounds):
        st.update(_batch(x1[s:e]), x2[s:e])
    return st


def _merged(parts):
    out = parts[0].copy()
    for p in parts[1:]:
        out.merge(p)
    return out


def _split(x1, x2, sizes):
    bounds = np.cumsum([0, *sizes])
    return [(x1[s:e], x2[s:e]) for s, e in itertools.pairwise(bounds)]


# ------------------------------------------------------------------ online vs batch
@pytest.mark.parametrize(("kind", "tol"), [("logistic", 0.35), ("median_regression", 1.25)])
def test_online_estimate_agrees_with_the_batch_fit(kind, tol):
    """5·10⁴ reports in records of 1000 (warm-up 5000, then 45 blocks of 1000): the online θ̂ is
    within ``tol`` batch standard errors of the batch DR M-estimate of the same reports, and its
    standard error within 15 % (logistic) / 25 % (median) of the batch one.

    Both are asymptotically the same estimator, so their difference is o(SE). Measured over 20
    other seeds: logistic |Δ|/SE at most 0.19 (RMS per coefficient ≤ 0.08), SE ratio 0.94–1.07;
    median regression — one Newton step per block on an exact sub-gradient against a restarted
    Nelder–Mead batch fit — |Δ|/SE at most 0.77 (RMS ≤ 0.31), SE ratio 0.83–1.04 (the two
    smoothed Hessians use different bandwidths). The tolerances are ≈ 4 RMS.
    """
    rng = np.random.default_rng(2024)
    for _ in range(3):
        x1, x2 = _reports(50_000, rng)
        st = _fold(QUERIES[kind], x1, x2, sizes=[1000] * 50)
        assert st.fit.n == 50_000 and st.buf1.shape[0] == 0
        e = st.estimate()
        cols = COLS[kind]
        ref = m_estimate(_batch_loss(kind), x1[:, cols], x2[:, cols], zero_prob=ZERO_PROB, method="dr")
        d = (e.value - ref.theta) / ref.stderr
        assert np.all(np.abs(d) < tol), d
        se_tol = 0.15 if kind == "logistic" else 0.25
        np.testing.assert_allclose(e.stderr, ref.stderr, rtol=se_tol)


# ------------------------------------------------------------------ coverage
def _coverage_bounds(reps: int, checks: int, alpha: float = 1e-4) -> tuple[int, int]:
    """Allowed misses ``[lo, hi]`` of one coefficient's 95 % interval in ``reps`` independent
    streams: exact binomial tails at the nominal miss rate 0.05 with ``alpha/(2·checks)`` on each
    side, so that a correct implementation fails one of ``checks`` coefficients with probability
    below ``alpha`` (Bonferroni)."""
    a = alpha / (2 * checks)
    lo = int(stats.binom.ppf(a, reps, 0.05))  # the smallest k with P(X <= k) >= a: P(X < lo) < a
    hi = int(stats.binom.isf(a, reps, 0.05))  # P(X > hi) <= a
    assert stats.binom.cdf(lo - 1, reps, 0.05) <= a and stats.binom.sf(hi, reps, 0.05) <= a
    return lo, hi


COVER = {
    # id: (kind, partition sizes, renewable options, streams)
    "logistic-1": ("logistic", [10_000], None, 200),
    "median-1": ("median_regression", [10_000], None, 200),
    "logistic-4": ("logistic", [3500] * 4, {"warm_up": 3000, "batch_size": 250}, 150),
    "median-4": ("median_regression", [3500] * 4, {"warm_up": 3000, "batch_size": 250}, 150),
}


@pytest.mark.parametrize("case", list(COVER))
def test_wald_interval_coverage(case):
    """95 % intervals cover each true coefficient at the nominal rate.

    One partition of 10⁴ reports (warm-up 5000, 5 blocks of 1000), or 4 partitions of 3500
    (warm-up 3000, 2 blocks of 250) merged as serve merges a group's checkpoints. The misses of
    each of the 3 coefficients must lie within the exact binomial bounds at the nominal 5 % miss
    rate that a correct implementation leaves with probability below 10⁻⁴
    (``_coverage_bounds``; 200 streams: at most 25 misses, 150 streams: at most 21; over-coverage
    cannot be detected at these sizes). Measured with other seeds (intercept, c1, c2):

    * one partition, 1000 streams: logistic 0.950/0.958/0.949, median 0.963/0.943/0.948;
    * 4 × 3500 merged, 600 streams: logistic 0.942/0.962/0.948 — but its estimates lean towards
      zero by about 0.3 standard errors (mean z −0.34/−0.23/+0.29; one partition of 10⁴: within
      ±0.1); median 0.982/0.942/0.933 — its intercept's standard error is about 10 % too large
      (sd of z 0.90; also in one partition of 3500 and in 4 × 10⁴ merged).
    """
    kind, sizes, opts, reps = COVER[case]
    qd = dict(QUERIES[kind])
    if opts is not None:
        qd["renewable"] = opts
    truth = TRUTH[kind]
    rng = np.random.default_rng(31_000 + list(COVER).index(case))
    misses = np.zeros(3, dtype=int)
    z = []
    for _ in range(reps):
        x1, x2 = _reports(sum(sizes), rng)
        parts = [_fold(qd, a, b) for a, b in _split(x1, x2, sizes)]
        st = _merged(parts) if len(parts) > 1 else parts[0]
        assert st.fit is not None and st.fit.n == sum(sizes) - sum(p.buf1.shape[0] for p in parts)
        e = st.estimate()
        misses += ~((e.ci_low <= truth) & (truth <= e.ci_high))
        z.append((e.value - truth) / e.stderr)
    lo, hi = _coverage_bounds(reps, checks=3)
    z = np.asarray(z)
    print(f"coverage {case}: {1 - misses / reps}, allowed misses [{lo}, {hi}] of {reps}; "
          f"mean z {z.mean(axis=0).round(3)}, sd z {z.std(axis=0).round(3)}")
    assert np.all((lo <= misses) & (misses <= hi)), (misses, lo, hi)


# ------------------------------------------------------------------ merging
@pytest.mark.parametrize("kind", KINDS)
def test_merge_in_every_order_gives_the_same_estimate(kind):
    """4 partition states — two renewed (warm-up done, blocks renewed, a remainder buffered), two
    still warming up (buffers only) — merged in all 24 orders: the same θ̂ and standard errors
    to 10⁻¹² relative; the pooled fit is ``H = ΣH_k``, ``θ̂ = H⁻¹ΣH_kθ̂_k``, ``A = ΣA_k``."""
    rng = np.random.default_rng(77)
    sizes = [6_543, 7_210, 3_001, 812]
    x1, x2 = _reports(sum(sizes), rng)
    parts = [_fold(QUERIES[kind], a, b, sizes=[1000] * (a.shape[0] // 1000) + [a.shape[0] % 1000])
             for a, b in _split(x1, x2, sizes)]
    assert [p.fit is not None for p in parts] == [True, True, False, False]
    fits = [p.fit for p in parts[:2]]
    ref = _merged(parts)
    # the pooled fit, computed here
    H = fits[0].H + fits[1].H
    np.testing.assert_allclose(ref.fit.H, H, rtol=1e-15)
    np.testing.assert_allclose(ref.fit.theta, np.linalg.solve(H, fits[0].H @ fits[0].theta
                                                             + fits[1].H @ fits[1].theta), rtol=1e-12)
    np.testing.assert_allclose(ref.fit.A, fits[0].A + fits[1].A, rtol=1e-15)
    assert ref.fit.n == fits[0].n + fits[1].n and ref.n == sum(sizes)
    assert ref.buf1.shape[0] == sum(p.buf1.shape[0] for p in parts) == 543 + 210 + 3001 + 812
    e0 = ref.estimate()
    values = []
    for order in itertools.permutations(range(4)):
        e = _merged([parts[i] for i in order]).estimate()
        np.testing.assert_allclose(e.value, e0.value, rtol=1e-12, err_msg=str(order))
        np.testing.assert_allclose(e.stderr, e0.stderr, rtol=1e-12, err_msg=str(order))
        assert e.n == e0.n
        values.append(e.value)
    # a tree of merges too
    tree = (parts[3] + parts[0]) + (parts[2] + parts[1])
    np.testing.assert_allclose(tree.estimate().value, e0.value, rtol=1e-12)
    # ... and the estimate is the pooled fit renewed with every buffered report (not, e.g., the
    # pooled fit alone): leaving one partition's buffer out moves it
    partial = _merged(parts[:3]).estimate()
    assert np.max(np.abs(partial.value - e0.value) / e0.stderr) > 1e-3


# ------------------------------------------------------------------ determinism
@pytest.mark.parametrize("python", [False, True], ids=["kernel", "python"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_state_is_a_function_of_its_reports(kind, python):
    """The same 12 345 reports in one update, in 26 records of random sizes, and with a
    checkpoint round trip in between: byte-identical ``to_bytes()`` — blocks are cut by count in
    offset order, so a partition's state does not depend on how polls grouped its records."""
    rng = np.random.default_rng(5)
    n = 12_345
    x1, x2 = _reports(n, rng)
    one = _fold(QUERIES[kind], x1, x2, python=python)
    assert (one._kernel is None) == python
    assert one.fit.n == 12_000 and one.buf1.shape[0] == 345
    cuts = np.sort(rng.choice(np.arange(1, n), size=25, replace=False))
    sizes = np.diff(np.concatenate([[0], cuts, [n]]))
    many = _fold(QUERIES[kind], x1, x2, sizes=sizes.tolist(), python=python)
    assert many.to_bytes() == one.to_bytes()
    # restore (as a worker does from its checkpoint) after each of the first records, go on
    st = build_state(QUERIES[kind], SCHEMA)
    bounds = np.concatenate([[0], cuts, [n]])
    for i, (s, e) in enumerate(itertools.pairwise(bounds)):
        if i % 5 == 0:
            st = State.from_bytes(st.to_bytes(), st.query, SCHEMA)
            if python:
                st._kernel = None
        st.update(_batch(x1[s:e]), x2[s:e])
    assert st.to_bytes() == one.to_bytes()
    # the state does see the reports: one report changed, other bytes
    y1 = x1.copy()
    y1[100, C1] += 1e-3
    assert _fold(QUERIES[kind], y1, x2, python=python).to_bytes() != one.to_bytes()


# ------------------------------------------------------------------ bandwidth rule
def test_kink_bandwidth_is_the_documented_rule():
    """``h = 0.6 · spread · n^(−1/5)`` (docs/mechanisms.md §6.7), n floored at 1."""
    assert (BANDWIDTH_C, BANDWIDTH_POWER) == (0.6, 0.2)
    for spread, n in ((1.0, 1), (0.37, 5000), (2.5, 123_456), (1e-3, 10**9)):
        assert kink_bandwidth(spread, n) == pytest.approx(0.6 * spread * n ** -0.2, rel=1e-15)
    assert kink_bandwidth(0.8, 0) == kink_bandwidth(0.8, 1) == pytest.approx(0.48)
    # it shrinks as reports accumulate, at the rate n^(−1/5)
    assert kink_bandwidth(1.0, 32 * 1000) == pytest.approx(kink_bandwidth(1.0, 1000) / 2)


def _smoothed_dr_hessian(u1, u2, theta, h):
    """The DR kernel-smoothed Hessian of the check loss summed over a block, by hand:
    ``[Σ K_h(r₁ᵢ) z₁ᵢz₁ᵢᵀ − (1−δ) Σ K_h(r₂ᵢ) z₂ᵢz₂ᵢᵀ]/δ``, ``z = (1, u_c1, u_c2)``, ``r = u_y − zᵀθ``,
    ``K_h`` the Gaussian density of standard deviation h."""
    def one(u):
        z = np.column_stack([np.ones(u.shape[0]), u[:, 0], u[:, 1]])
        r = u[:, 2] - z @ theta
        w = np.exp(-0.5 * (r / h) ** 2) / (h * math.sqrt(2 * math.pi))
        return (z * w[:, None]).T @ z
    return (one(u1) - (1 - ZERO_PROB) * one(u2)) / ZERO_PROB


@pytest.mark.parametrize("python", [False, True], ids=["kernel", "python"])
def test_the_state_uses_the_bandwidth_rule_in_its_block_hessians(python):
    """Median regression, warm-up 2000 then blocks of 500: ``fit.spread`` is the IQR/1.349 of the
    released reports' residuals at the warm-up fit, and each block adds to H the DR smoothed
    Hessian at the block's new θ̂ with ``h = kink_bandwidth(spread, n)`` (n counting the block),
    computed by hand — not the one at another bandwidth."""
    qd = {**QUERIES["median_regression"], "renewable": {"warm_up": 2000, "batch_size": 500}}
    x1, x2 = _reports(3000, np.random.default_rng(99))
    st = build_state(qd, SCHEMA)
    if python:
        st._kernel = None
    st.update(_batch(x1[:2000]), x2[:2000])
    f0 = st.fit
    u1, u2 = st._std(x1), st._std(x2)
    z = np.column_stack([np.ones(2000), u1[:2000, :2]])
    q75, q25 = np.percentile(u1[:2000, 2] - z @ f0.theta, [75, 25])
    assert f0.spread == pytest.approx((q75 - q25) / 1.349, rel=1e-12)
    assert f0.n == 2000 and f0.guarded == 0
    h0 = kink_bandwidth(f0.spread, 2000)
    np.testing.assert_allclose(f0.H, _smoothed_dr_hessian(u1[:2000], u2[:2000], f0.theta, h0), rtol=1e-10)
    for k, s in enumerate(range(2000, 3000, 500)):
        before = st.fit
        st.update(_batch(x1[s:s + 500]), x2[s:s + 500])
        after = st.fit
        assert after.n == s + 500 and after.spread == f0.spread  # the spread is the warm-up's
        h = kink_bandwidth(f0.spread, s + 500)
        want = _smoothed_dr_hessian(u1[s:s + 500], u2[s:s + 500], after.theta, h)
        np.testing.assert_allclose(after.H - before.H, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())
        # the engine's block Hessian is the same matrix; another bandwidth is not
        eng = st.engine.hessian(u1[s:s + 500], u2[s:s + 500], after.theta, s + 500, f0.spread)
        np.testing.assert_allclose(eng, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())
        other = _smoothed_dr_hessian(u1[s:s + 500], u2[s:s + 500], after.theta, 1.5 * h)
        assert np.max(np.abs(other - want)) > 1e-3 * np.abs(want).max(), k


def test_smooth_losses_add_the_analytic_dr_hessian():
    """Logistic regression: spread 1 (no kink) and each block adds
    ``[Σ p₁(1−p₁) z₁z₁ᵀ − (1−δ) Σ p₂(1−p₂) z₂z₂ᵀ]/δ`` at the block's θ̂."""
    qd = QUERIES["logistic"]
    x1, x2 = _reports(6000, np.random.default_rng(98))
    st = build_state(qd, SCHEMA)
    st.update(_batch(x1[:5000]), x2[:5000])
    before = st.fit
    assert before.spread == 1.0
    st.update(_batch(x1[5000:]), x2[5000:])
    after = st.fit
    u1, u2 = st._std(x1[5000:]), st._std(x2[5000:])

    def one(u):
        z = np.column_stack([np.ones(u.shape[0]), u[:, 0], u[:, 1]])
        p = 1 / (1 + np.exp(-(z @ after.theta)))
        return (z * (p * (1 - p))[:, None]).T @ z

    want = (one(u1) - (1 - ZERO_PROB) * one(u2)) / ZERO_PROB
    np.testing.assert_allclose(after.H - before.H, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


# ------------------------------------------------------------------ warm-up and small counts
@pytest.mark.parametrize("kind", KINDS)
def test_below_the_warm_up_the_merged_estimate_is_the_pooled_batch_fit(kind):
    """4 partitions of 1000 reports (below the default warm-up of 5000: buffers only), merged: the
    estimate is the batch DR fit of the 4000 pooled reports — ``m_estimate`` of the same reports
    in original units and their own order, within 10⁻⁵ (logistic: BFGS to gtol 10⁻⁹; measured
    ≤ 7·10⁻⁸ over 10 seeds) / 0.1 (median: restarted Nelder–Mead on a flat non-smooth optimum;
    measured ≤ 0.023) batch standard errors. The logistic standard errors agree to 10⁻³ (the
    batch V is a difference quotient of the gradient, the state's H analytic); the median's
    differ by the smoothed Hessians' bandwidths (state 0.6, batch 1.0 × spread·n^(−1/5))."""
    rng = np.random.default_rng(4321)
    x1, x2 = _reports(4000, rng)
    parts = [_fold(QUERIES[kind], a, b) for a, b in _split(x1, x2, [1000] * 4)]
    assert all(p.fit is None and p.buf1.shape[0] == 1000 for p in parts)
    st = _merged(parts)
    assert st.fit is None and st.n == 4000
    e = st.estimate()
    cols = COLS[kind]
    ref = m_estimate(_batch_loss(kind), x1[:, cols], x2[:, cols], zero_prob=ZERO_PROB, method="dr")
    tol = 1e-5 if kind == "logistic" else 0.1
    d = (e.value - ref.theta) / ref.stderr
    assert np.all(np.abs(d) < tol), d
    if kind == "logistic":
        np.testing.assert_allclose(e.stderr, ref.stderr, rtol=1e-3)
    # the partitioning does not matter: one state of the 4000 reports estimates the same
    one = _fold(QUERIES[kind], x1, x2).estimate()
    np.testing.assert_allclose(one.value, e.value, rtol=1e-12)
    np.testing.assert_allclose(one.stderr, e.stderr, rtol=1e-12)


def test_too_few_reports_per_parameter_is_an_empty_state():
    """An estimate needs 10 reports per parameter (3 here): 29 refuse, in one partition or
    merged from two; 30 pass the count (and a first report-less state refuses too)."""
    qd = QUERIES["median_regression"]
    x1, x2 = _reports(60, np.random.default_rng(3))
    with pytest.raises(EmptyStateError, match="0 report"):
        build_state(qd, SCHEMA).estimate()
    with pytest.raises(EmptyStateError, match=r"has 29 report\(s\); an estimate needs at least 30"):
        _fold(qd, x1[:29], x2[:29]).estimate()
    merged = _fold(qd, x1[:15], x2[:15]) + _fold(qd, x1[15:29], x2[15:29])
    with pytest.raises(EmptyStateError, match="needs at least 30"):
        merged.estimate()
    e = (merged + _fold(qd, x1[29:60], x2[29:60])).estimate()
    assert e.n == 60 and np.all(np.isfinite(e.value))
