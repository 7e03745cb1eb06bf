"""Fast tests of the categorical ULDP mechanisms: constants, validation, output law, counts,
merging, estimation methods, PUM (docs/frequency.md §2–§8; reference_values.json)."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest
from scipy.special import ndtri

from mechanisms.errors import ParameterError
from mechanisms.uldp import RAPPOR, RR, URAP, URR, FrequencyCounts, SparseBits
from mechanisms.uldp.pum import PUM
from mechanisms.uldp.urap import sample_subsets

REF_PATH = pathlib.Path(__file__).resolve().parents[1] / "reference" / "reference_values.json"
REF = json.loads(REF_PATH.read_text())
# Bonferroni-adjusted two-sided critical value for ~20 coordinates at family-wise level 1e-5
Z_K = float(ndtri(1 - 1e-5 / 40))


# -- constants --------------------------------------------------------------------------------
@pytest.mark.parametrize("case", REF["urap_constants"], ids=lambda c: f"eps={c['epsilon']:.3g}")
def test_urap_constants_match_reference(case):
    m = URAP(10, [0, 3], case["epsilon"])
    for name in ("theta", "d1", "d2"):
        assert getattr(m, name) == pytest.approx(case[name], abs=1e-12, rel=0)


@pytest.mark.parametrize("case", REF["urr_constants"], ids=lambda c: f"eps={c['epsilon']:.3g}")
def test_urr_constants_match_reference(case):
    s = case["n_sensitive"]
    m = URR(s + 7, range(s), case["epsilon"])
    for name in ("c1", "c2", "c3"):
        assert getattr(m, name) == pytest.approx(case[name], abs=1e-12, rel=0)
    assert m.c1 - m.c2 == pytest.approx(m.c3, abs=1e-15)


def test_expected_loss_formulas_match_reference():
    ref = REF["uldp_expected_loss"]
    p, n, s = np.array(ref["p"]), ref["n"], ref["n_sensitive_first"]
    for row in ref["rows"]:
        ua, ur = URAP(p.size, range(s), row["epsilon"]), URR(p.size, range(s), row["epsilon"])
        assert ua.expected_l2(p, n) == pytest.approx(row["urap_expected_l2sq"], rel=1e-10)
        assert ur.expected_l2(p, n) == pytest.approx(row["urr_expected_l2sq"], rel=1e-10)
        assert ua.expected_l1(p, n) == pytest.approx(row["urap_expected_l1_approx"], rel=1e-10)
        assert ur.expected_l1(p, n) == pytest.approx(row["urr_expected_l1_approx"], rel=1e-10)


def test_baseline_constants():
    eps = 1.3
    rr = RR(7, eps)
    assert rr.c1 == pytest.approx(math.exp(eps) / (7 + math.exp(eps) - 1))
    sym = RAPPOR(7, eps)
    assert sym.d1 == pytest.approx(1 - sym.theta) and sym.theta == pytest.approx(1 / (1 + math.exp(-eps / 2)))
    oue = RAPPOR.oue(7, eps)
    assert oue.theta == 0.5 and oue.d1 == pytest.approx(1 / (math.exp(eps) + 1))
    # unary encoding ratio of the two flipped bits is exactly e^eps
    for m in (sym, oue):
        assert (m.theta / m.d1) * ((1 - m.d1) / (1 - m.theta)) == pytest.approx(math.exp(eps))


# -- validation -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("factory", "arg"),
    [
        (lambda: URR(1, [0], 1.0), "k"),
        (lambda: URR(5.0, [0], 1.0), "k"),
        (lambda: URR(5, [], 1.0), "sensitive"),
        (lambda: URR(5, [5], 1.0), "sensitive"),
        (lambda: URR(5, [-1], 1.0), "sensitive"),
        (lambda: URAP(5, None, 1.0), "sensitive"),
        (lambda: URR(5, [0], 0.0), "epsilon"),
        (lambda: URR(5, [0], -1.0), "epsilon"),
        (lambda: URAP(5, [0], math.inf), "epsilon"),
        (lambda: URAP(5, [0], math.nan), "epsilon"),
        (lambda: URAP(5, [0], 1.0, theta=0.0), "theta"),
        (lambda: URAP(5, [0], 1.0, theta=1.0), "theta"),
        (lambda: RAPPOR(5, 1.0, theta=1.5), "theta"),
        (lambda: RR(5, 0), "epsilon"),
        (lambda: PUM(5, 0, 1.0), "kappa"),
        (lambda: PUM(5, 1, 1.0, base="x"), "base"),
        (lambda: PUM(5, 1, 1.0, base="urr", theta=0.6), "theta"),
        (lambda: PUM(5, 2, 1.0, bot_members=[[0]]), "bot_members"),
    ],
)
def test_bad_parameters_raise(factory, arg):
    with pytest.raises(ValueError, match=arg) as info:
        factory()
    assert isinstance(info.value, ParameterError)


@pytest.mark.parametrize("mech", [URR(5, [0, 1], 1.0), URAP(5, [0, 1], 1.0)], ids=["urr", "urap"])
def test_bad_codes_and_counts_raise(mech):
    rng = np.random.default_rng(0)
    for bad in ([0, 5], [-1], [0.5], [[0, 1]]):
        with pytest.raises(ParameterError, match="codes"):
            mech.privatize(bad, rng)
    other = URR(5, [0, 2], 1.0) if mech.output_kind == "codes" else URAP(5, [0, 1], 1.0, theta=0.7)
    c_other = other.counts(other.privatize([0, 1, 2], rng))
    with pytest.raises(ParameterError, match="counts"):
        mech.estimate(c_other)
    mine = mech.counts(mech.privatize([0, 1, 2], rng))
    with pytest.raises(ParameterError, match="counts"):
        mine + c_other
    with pytest.raises(ParameterError, match="counts"):
        mech.estimate(mech.empty_counts())
    with pytest.raises(ParameterError, match="method"):
        mech.estimate(mine, method="magic")
    with pytest.raises(ParameterError, match="level"):
        mech.estimate(mine, level=1.0)


def test_urap_counts_refuse_impossible_reports():
    m = URAP(5, [0, 1], 1.0)
    with pytest.raises(ParameterError, match="reports"):
        m.counts(SparseBits.from_dense([[0, 0, 1, 1, 0]]))  # two non-sensitive bits
    with pytest.raises(ParameterError, match="reports"):
        m.counts(SparseBits.from_dense([[0, 0, 1, 0]]))
    with pytest.raises(ParameterError, match="reports"):
        URR(5, [0], 1.0).counts([7])


# -- output law of privatize ------------------------------------------------------------------
def test_urr_output_law():
    rng = np.random.default_rng(11)
    m = URR(6, [1, 4, 5], 0.8)
    N = 60_000
    x = np.repeat(np.arange(6), N)
    y = m.privatize(x, rng)
    assert y.dtype == np.int32 and y.shape == x.shape
    Q = m.transition_matrix()
    assert np.allclose(Q.sum(axis=0), 1)
    counts = np.zeros((6, 6))
    np.add.at(counts, (y, x), 1)
    sd = np.sqrt(N * Q * (1 - Q))
    assert np.all(np.abs(counts - N * Q) <= 5.5 * sd + 1e-9)
    assert np.all(counts[Q == 0] == 0)


@pytest.mark.parametrize(("eps", "theta", "k", "sens"),
                         [(1.0, None, 5, [0, 2, 3]), (0.1, 0.9, 6, [0, 1, 2, 3, 4])])
def test_urap_output_law_full_vectors(eps, theta, k, sens):
    """Exact law of whole bit vectors (2^k outputs) per input; the second case has d₁ > 1/2 and
    exercises the complement path of the subset sampler."""
    rng = np.random.default_rng(12)
    m = URAP(k, sens, eps, theta)
    N = 40_000
    x = np.repeat(np.arange(k), N)
    rep = m.privatize(x, rng)
    assert isinstance(rep, SparseBits) and rep.n == x.size and rep.k == k
    dense = rep.to_dense()
    key = dense @ (1 << np.arange(k))
    obs = np.zeros((1 << k, k))
    np.add.at(obs, (key, x), 1)
    B = m.bit_matrix()
    ys = (np.arange(1 << k)[:, None] >> np.arange(k)[None, :]) & 1  # (2^k, k)
    Q = np.prod(np.where(ys[:, :, None] == 1, B[None], 1 - B[None]), axis=1)  # (2^k, k_in)
    assert np.allclose(Q.sum(axis=0), 1)
    sd = np.sqrt(N * Q * (1 - Q))
    assert np.all(np.abs(obs - N * Q) <= 6.0 * sd + 1e-9)
    assert np.all(obs[Q == 0] == 0)


def test_sample_subsets_distinct_and_uniform():
    rng = np.random.default_rng(13)
    n, M = 30_000, 7
    c = rng.integers(0, M + 1, size=n)
    rows, pos = sample_subsets(np.full(n, M), c, rng)
    assert np.array_equal(np.bincount(rows, minlength=n), c)
    key = rows * M + pos
    assert np.unique(key).size == key.size and pos.min() >= 0 and pos.max() < M
    # each position is included w.p. c/M: compare per-position totals
    expected = c.sum() / M
    cnt = np.bincount(pos, minlength=M)
    var = np.sum((c / M) * (1 - c / M))
    assert np.all(np.abs(cnt - expected) < 5.5 * np.sqrt(var))


# -- estimation, counts, merging --------------------------------------------------------------
def _skewed(k):
    p = 0.6 ** np.arange(k)
    return p / p.sum()


@pytest.mark.parametrize("kind", ["urr", "urap"])
def test_empirical_unbiased_within_se(kind):
    rng = np.random.default_rng(21)
    k, n = 20, 200_000
    p = np.array(REF["uldp_expected_loss"]["p"])
    m = URR(k, range(4), 1.0) if kind == "urr" else URAP(k, range(4), 1.0)
    x = rng.choice(k, size=n, p=p)
    est = m.estimate(m.counts(m.privatize(x, rng)))
    # truth is p; SE from the known output law (plug-in SE checked against it)
    mo = m.expected_output(p)
    _, b = m._intercept_slope()
    se = np.sqrt(mo * (1 - mo) / n) / b
    assert np.allclose(est.stderr, se, rtol=0.05)
    assert np.all(np.abs(est.p - p) < Z_K * se)
    assert np.all(est.ci_low < est.p) and np.all(est.p < est.ci_high)
    if kind == "urr":
        assert est.p.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("mech", [URR(12, [0, 5, 7], 1.0), URAP(12, [0, 5, 7], 1.0), RAPPOR(6, 1.0)],
                         ids=["urr", "urap", "rappor"])
def test_merge_halves_equals_one_pass(mech):
    rng = np.random.default_rng(22)
    x = rng.choice(mech.k, size=4000, p=_skewed(mech.k))
    rep = mech.privatize(x, rng)
    if isinstance(rep, SparseBits):
        a, b = rep.take(np.arange(1500)), rep.take(np.arange(1500, 4000))
    else:
        a, b = rep[:1500], rep[1500:]
    whole = mech.counts(rep)
    merged = mech.counts(a) + mech.counts(b)
    assert merged == whole
    acc = mech.empty_counts()
    acc += mech.counts(a)
    acc += mech.counts(b)
    assert acc == whole
    restored = FrequencyCounts.from_dict(json.loads(json.dumps(merged.to_dict())))
    assert restored == whole and FrequencyCounts.from_bytes(whole.to_bytes()) == whole
    for method in ("empirical", "threshold", "projected", "em"):
        e1, e2 = mech.estimate(whole, method), mech.estimate(restored, method)
        assert np.array_equal(e1.p, e2.p) and np.array_equal(e1.stderr, e2.stderr)
    assert "FrequencyCounts" in repr(whole)


_TAIL = [0, 9, 10, 11, 12, 13, 14]


@pytest.mark.parametrize("mech", [URR(15, _TAIL, 1.0), URAP(15, _TAIL, 1.0)], ids=["urr", "urap"])
def test_methods_return_distributions(mech):
    rng = np.random.default_rng(23)
    x = rng.choice(mech.k, size=3000, p=_skewed(mech.k))
    c = mech.counts(mech.privatize(x, rng))
    for method in ("threshold", "projected", "em"):
        e = mech.estimate(c, method)
        assert np.all(e.p >= 0) and e.p.sum() == pytest.approx(1.0, abs=1e-9)
        assert np.all((e.ci_low >= 0) & (e.ci_high <= 1))
        assert np.all(np.isfinite(e.stderr))
    emp = mech.estimate(c)
    assert emp.p.min() < 0  # skewed p, small n: empirical goes negative somewhere (else test is moot)


def test_threshold_rule_as_documented():
    """docs/frequency.md §4: Bonferroni threshold, the rest of the mass to the zeroed entries."""
    from mechanisms.uldp import threshold_estimate

    p = np.array([0.5, 0.3, 0.01, -0.02])
    se = np.full(4, 0.02)
    out = threshold_estimate(p, se)
    # z_{1-0.05/4} ≈ 2.50 → keep 0.5 and 0.3; remaining 0.2 to the two zeroed entries
    assert np.allclose(out, [0.5, 0.3, 0.1, 0.1])
    out2 = threshold_estimate(np.array([0.7, 0.5, 0.0]), se[:3])
    assert np.allclose(out2, [0.7 / 1.2, 0.5 / 1.2, 0.0])


def test_urap_em_pattern_overflow_fallback_is_a_distribution():
    rng = np.random.default_rng(24)
    m = URAP(12, range(8), 1.0, max_patterns=10)
    x = rng.choice(12, size=3000, p=_skewed(12))
    c = m.counts(m.privatize(x, rng))
    assert len(c.patterns) == 10 and c.overflow_n > 0
    assert sum(c.patterns.values()) + c.overflow_n == 3000 - c.counts[8:].sum()
    e = m.estimate(c, "em")
    assert np.all(np.isfinite(e.p)) and e.p.sum() == pytest.approx(1.0) and e.p.min() >= 0


# -- PUM --------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ["urr", "urap"])
def test_pum_estimate_unbiased_with_known_prior(base):
    rng = np.random.default_rng(31)
    k, n = 10, 200_000
    p = np.array([0.2, 0.05, 0.15, 0.1, 0.1, 0.05, 0.1, 0.05, 0.1, 0.1])
    pum = PUM(k, 2, 1.0, base=base, common_sensitive=[0, 1], bot_members=[[2, 4], [3]])
    x = rng.choice(k, size=n, p=p)
    # half the users hold 2 and 4 as "home" (bot 0), everyone holding 3 calls it "work" (bot 1)
    bots = np.where(np.isin(x, [2, 4]) & (rng.random(n) < 0.5), 0, np.where(x == 3, 1, -1))
    rep = pum.privatize(x, bots, rng)
    assert pum.output_kind == ("codes" if base == "urr" else "bits")
    c = pum.counts(rep)
    # the true conditional of bot 0's members: p(2)/2 : p(4)/2
    prior = np.zeros((2, k))
    prior[0, [2, 4]] = p[[2, 4]] / p[[2, 4]].sum()
    prior[1, 3] = 1.0
    e = pum.estimate(c, prior=prior)
    assert np.all(np.abs(e.p - p) < Z_K * e.stderr)
    # the stderr including the bot covariance agrees with the spread over disjoint sub-batches
    assert np.all(e.stderr > 0)
    for method in ("projected", "em"):
        ee = pum.estimate(c, method, prior=prior)
        assert ee.p.sum() == pytest.approx(1.0) and ee.p.min() >= 0
    uniform = pum.estimate(c)  # uniform over bot_members: bot 0 mass split evenly between 2 and 4
    r = pum.estimate_extended(c).p
    assert uniform.p[2] == pytest.approx(r[2] + 0.5 * r[k], abs=1e-12)
    assert uniform.p[3] == pytest.approx(r[3] + r[k + 1], abs=1e-12)


def test_pum_stderr_matches_replication_spread():
    """The PUM SE (which includes Cov(r̂(x), r̂(⊥))) matches the Monte Carlo SD of p̂."""
    rng = np.random.default_rng(32)
    k, n, R = 6, 4000, 400
    p = np.array([0.3, 0.2, 0.2, 0.1, 0.1, 0.1])
    pum = PUM(k, 1, 1.0, base="urr", common_sensitive=[0], bot_members=[[1, 2]])
    prior = np.array([[0.0, 0.5, 0.5, 0, 0, 0]])
    x = rng.choice(k, size=(R, n), p=p)
    bots = np.where(np.isin(x, [1, 2]), 0, -1)
    rep = pum.privatize(x.ravel(), bots.ravel(), rng).reshape(R, n)
    ests = np.array([pum.estimate(pum.counts(r), prior=prior).p for r in rep])
    se = pum.estimate(pum.counts(rep.ravel()), prior=prior).stderr * math.sqrt(R)
    sd = ests.std(axis=0, ddof=1)
    # SD of a sample SD with R=400 is ≈ SD/√(2R) = 3.5 %; allow 5 of those
    assert np.all(np.abs(sd / se - 1) < 0.18)


def test_pum_preprocess_forms_and_errors():
    pum = PUM(5, 2, 1.0, base="urr", bot_members=[[1, 2], [3]])
    x = np.array([0, 1, 2, 3, 4])
    assert pum.preprocess(x, [-1, 0, 0, 1, -1]).tolist() == [0, 5, 5, 6, 4]
    assert pum.preprocess(x, {1: 0, 3: 1}).tolist() == [0, 5, 2, 6, 4]
    assert pum.preprocess(x, [{}, {1: 0}, {}, {}, {3: 1}]).tolist() == [0, 5, 2, 3, 4]
    with pytest.raises(ParameterError, match="bot_members"):
        pum.preprocess(x, [-1, -1, -1, -1, 0])
    with pytest.raises(ParameterError, match="personal_sensitive"):
        pum.preprocess(x, [-1, 2, -1, -1, -1])
    with pytest.raises(ParameterError, match="personal_sensitive"):
        pum.preprocess(x, [-1, -1])
    with pytest.raises(ParameterError, match="prior"):
        pum.estimate(pum.counts(pum.privatize(x, [-1] * 5, 0)), prior=np.ones((2, 5)))
