"""Statistical tests of the ULDP mechanisms: expected loss (reference_values.json), EM vs
empirical, uRR/uRAP vs RR/RAPPOR, and the ULDP audit (docs/frequency.md §1, §4–§5)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from mechanisms.uldp import RAPPOR, RR, URAP, URR, SparseBits
from mechanisms.uldp.audit import audit_uldp
from mechanisms.uldp.pum import PUM

REF_PATH = pathlib.Path(__file__).resolve().parents[1] / "reference" / "reference_values.json"
REF = json.loads(REF_PATH.read_text())["uldp_expected_loss"]

pytestmark = pytest.mark.slow


def _draw_output_counts(mech, p, n, R, rng):
    """Output counts of R independent batches of n reports, drawn from their exact law:
    uRR → Multinomial(n, m); uRAP → input counts n_x ~ Multinomial(n, p), then, given them, bits
    are independent across j: count_j = Bin(n_j, θ) + Bin(n − n_j, d₁) (sensitive j) or
    Bin(n_j, 1 − d₂) (non-sensitive j)."""
    if mech.output_kind == "codes":
        return rng.multinomial(n, mech.expected_output(p), size=R)
    nx = rng.multinomial(n, p, size=R)
    S = mech.is_sensitive
    own = rng.binomial(nx, np.where(S, mech.theta, 1 - mech.d2))
    other = np.where(S, rng.binomial(n - nx, mech.d1), 0)
    return own + other


@pytest.mark.parametrize("row", REF["rows"], ids=lambda r: f"eps={r['epsilon']}")
@pytest.mark.parametrize("kind", ["urap", "urr"])
def test_expected_l2_monte_carlo(kind, row):
    rng = np.random.default_rng(101)
    p, n, s = np.array(REF["p"]), REF["n"], REF["n_sensitive_first"]
    mech = (URAP if kind == "urap" else URR)(p.size, range(s), row["epsilon"])
    R = 20_000
    C = _draw_output_counts(mech, p, n, R, rng)
    a, b = mech._intercept_slope()
    phat = (C / n - a) / b
    loss = ((phat - p) ** 2).sum(axis=1)
    mean, se = loss.mean(), loss.std(ddof=1) / np.sqrt(R)
    ref = row[f"{kind}_expected_l2sq"]
    assert se / mean <= 0.015
    assert abs(mean - ref) <= 0.05 * ref
    assert abs(mean - mech.expected_l2(p, n)) <= 0.05 * ref


@pytest.mark.parametrize("kind", ["urr", "urap"])
def test_em_beats_empirical_on_skewed_p(kind):
    rng = np.random.default_rng(102)
    k, n, R = 12, 2000, 40
    p = 0.5 ** np.arange(k)
    p /= p.sum()
    sens = [0, 4, 7, 9, 11]
    mech = URR(k, sens, 1.0) if kind == "urr" else URAP(k, sens, 1.0)
    l_emp, l_em = [], []
    for _ in range(R):
        c = mech.counts(mech.privatize(rng.choice(k, size=n, p=p), rng))
        l_emp.append(((mech.estimate(c).p - p) ** 2).sum())
        l_em.append(((mech.estimate(c, "em").p - p) ** 2).sum())
    d = np.array(l_emp) - np.array(l_em)
    # paired comparison: mean improvement > 4 SE of the paired differences
    assert d.mean() > 4 * d.std(ddof=1) / np.sqrt(R)


def test_utility_optimized_far_better_than_baselines_k100():
    rng = np.random.default_rng(103)
    k, s, eps, n = 100, 5, 1.0, 100_000
    p = rng.dirichlet(np.full(k, 0.5))
    x = rng.choice(k, size=n, p=p)
    sens = list(range(s))
    loss = {}
    mechs = [("urr", URR(k, sens, eps)), ("rr", RR(k, eps)),
             ("urap", URAP(k, sens, eps, max_patterns=0)), ("rappor", RAPPOR(k, eps, max_patterns=0))]
    for name, mech in mechs:
        est = mech.estimate(mech.counts(mech.privatize(x, rng)))
        loss[name] = np.abs(est.p - p).sum()
        # each l1 loss is near its theoretical approximation (sanity of the comparison)
        assert loss[name] == pytest.approx(mech.expected_l1(p, n), rel=0.35)
    assert loss["urr"] < 0.3 * loss["rr"]
    assert loss["urap"] < 0.3 * loss["rappor"]


# -- audit ------------------------------------------------------------------------------------
def _mechs(eps):
    return {
        "urr": URR(5, [0, 2, 3], eps),
        "urap": URAP(5, [0, 2, 3], eps),
        "rr": RR(5, eps),
        "rappor": RAPPOR(5, eps),
        "oue": RAPPOR.oue(5, eps),
        "pum_urr": PUM(5, 2, eps, base="urr", common_sensitive=[0]),
        "pum_urap": PUM(5, 2, eps, base="urap", common_sensitive=[0]),
    }


@pytest.mark.parametrize("eps", [0.5, 2.0])
@pytest.mark.parametrize("name", ["urr", "urap", "rr", "rappor", "oue", "pum_urr", "pum_urap"])
def test_audit_passes_correct_mechanisms(name, eps):
    rng = np.random.default_rng(104)
    mech = _mechs(eps)[name]
    personal = {1: 0, 4: 1} if name.startswith("pum") else None
    res = audit_uldp(mech, personal_sensitive=personal, rng=rng)
    assert res.passed, res
    assert res.n_tests > 0 and not res.invertible_violations


class _KeepTrueBit(URAP):
    """Broken uRAP: the true sensitive bit is always 1 (θ = 1 on the own bit)."""

    def privatize(self, codes, rng=None):
        bits = super().privatize(codes, rng).to_dense()
        x = np.asarray(codes)
        s = self.is_sensitive[x]
        bits[np.nonzero(s)[0], x[s]] = 1
        return SparseBits.from_dense(bits)


class _LeakyURR(URR):
    """Broken uRR: 5 % of sensitive inputs are reported as the non-sensitive code 1 (an
    invertible output produced by a sensitive input)."""

    def privatize(self, codes, rng=None):
        g = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
        y = super().privatize(codes, g)
        x = np.asarray(codes)
        leak = self.is_sensitive[x] & (g.random(x.size) < 0.05)
        y[leak] = 1
        return y


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_audit_fails_broken_mechanisms(eps):
    rng = np.random.default_rng(105)
    res = audit_uldp(_KeepTrueBit(5, [0, 2, 3], eps), rng=rng)
    assert not res.passed and res.max_z > 3 * res.z_crit and res.worst_ratio == np.inf
    res2 = audit_uldp(_LeakyURR(5, [0, 2, 3], eps), rng=rng)
    assert not res2.passed and res2.invertible_violations
    # a mechanism that is only (2ε)-ULDP fails an audit at ε
    res3 = audit_uldp(URAP(5, [0, 2, 3], 2 * eps), epsilon=eps, rng=rng)
    assert not res3.passed and res3.worst_ratio > np.exp(eps)
