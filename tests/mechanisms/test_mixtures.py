"""mechanisms.mixtures: gradients against finite differences, the deconvolution likelihood against
quadrature, component bookkeeping, bad input and edge cases (statistical suites:
test_mixtures_stats.py)."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import integrate, stats

from mechanisms.corrected import corrected_loss
from mechanisms.errors import ConvergenceWarning, ParameterError
from mechanisms.estimation import m_estimate
from mechanisms.losses import SquaredLoss
from mechanisms.mixtures import (
    DeconvolutionMixtureLoss,
    GaussianMixtureLoss,
    KMeansLoss,
    canonical_order,
    fit_gaussian_mixture,
    fit_kmeans,
    match_components,
    max_centre_error,
    mixture_density,
    mixture_tv_distance,
)
from mechanisms.mixtures.components import component_index, permute_fit
from mechanisms.mixtures.deconvolution import scale_nodes
from mechanisms.zil import ZILMechanism

pytestmark = pytest.mark.usefixtures("one_blas_thread")


CENTRES = np.array([[0.0, 0.0], [4.0, 7.0], [8.0, 0.0]])  # canonical order (ascending first field)
LOW, HIGH = CENTRES.min(axis=0) - 4.0, CENTRES.max(axis=0) + 4.0


def _clusters(rng, n, zero_prob=0.2, lam=0.5):
    """Three spherical unit-variance clusters 8 SD apart, ZIL reports on their bounding box ± 4 SD."""
    mech = ZILMechanism(zero_prob, lam, LOW, HIGH)
    x = CENTRES[rng.integers(3, size=n)] + rng.standard_normal((n, 2))
    x1 = mech.privatize(x, rng)
    return mech, x, x1, mech.double(x1, rng)


def _fd_jacobian(f, theta, eps):
    """Central differences of a per-record function f(θ) → (n,), as (n, q)."""
    cols = []
    for j in range(theta.size):
        e = np.zeros(theta.size)
        e[j] = eps
        cols.append((f(theta + e) - f(theta - e)) / (2.0 * eps))
    return np.stack(cols, axis=1)


def _random_mixture_theta(rng, k, p):
    return np.concatenate([rng.normal(size=k), rng.normal(size=k * p), rng.normal(scale=0.4, size=k * p)])


# ---------------------------------------------------------------------------------------------
# gradients
# ---------------------------------------------------------------------------------------------


def test_kmeans_grad_matches_central_differences_away_from_cell_boundaries():
    rng = np.random.default_rng(100)
    loss = KMeansLoss(4, 3)
    theta = rng.normal(scale=2.0, size=12)
    x = rng.normal(scale=2.0, size=(400, 3))
    eps = 1e-6
    # the nearest centre must not change within ±eps of θ: the gap between the two nearest
    # squared distances moves by at most ~4·eps·(|x| + |c|) ≈ 1e-4, so keep gaps > 1e-2
    d = ((x[:, None, :] - loss.centres(theta)[None]) ** 2).sum(axis=2)
    d.sort(axis=1)
    x = x[d[:, 1] - d[:, 0] > 1e-2]
    assert x.shape[0] > 300
    fd = _fd_jacobian(lambda t: loss.value(x, t), theta, eps)
    g = loss.grad(x, theta)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-6)
    # exactly one centre's block is non-zero per record: 2(c_a − x)
    blocks = np.abs(g.reshape(-1, 4, 3)).sum(axis=2)
    assert np.all((blocks > 0).sum(axis=1) == 1)


@pytest.mark.parametrize(("k", "p"), [(1, 1), (3, 2), (2, 4)])
def test_gaussian_mixture_grad_matches_central_differences(k, p):
    rng = np.random.default_rng(101 + k * 10 + p)
    loss = GaussianMixtureLoss(k, p)
    theta = _random_mixture_theta(rng, k, p)
    x = rng.normal(scale=1.5, size=(60, p))
    fd = _fd_jacobian(lambda t: loss.value(x, t), theta, 1e-5)
    np.testing.assert_allclose(loss.grad(x, theta), fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("k", "p"), [(1, 1), (3, 2), (2, 3)])
def test_deconvolution_grad_and_value_grad_match_central_differences(k, p):
    rng = np.random.default_rng(111 + k * 10 + p)
    loss = DeconvolutionMixtureLoss(k, p, zero_prob=0.3, noise_var=rng.uniform(0.3, 1.5, size=p))
    theta = _random_mixture_theta(rng, k, p)
    x = rng.normal(scale=2.0, size=(60, p))
    fd = _fd_jacobian(lambda t: loss.value(x, t), theta, 1e-5)
    val, g = loss.value_grad(x, theta)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(val, loss.value(x, theta))
    np.testing.assert_array_equal(g, loss.grad(x, theta))
    assert loss.value_grad(x, theta, grad=False)[1] is None


def test_deconvolution_chunks_agree_with_one_block():
    """More rows than one evaluation block (20000): the blocks must stitch together exactly."""
    rng = np.random.default_rng(120)
    loss = DeconvolutionMixtureLoss(2, 1, zero_prob=0.4, noise_var=0.5)
    theta = _random_mixture_theta(rng, 2, 1)
    x = rng.normal(size=(45_001, 1))
    val, g = loss.value_grad(x, theta)
    for s in (0, 19_999, 20_000, 44_990):
        v_part, g_part = loss.value_grad(x[s:s + 11], theta)
        np.testing.assert_allclose(val[s:s + 11], v_part, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(g[s:s + 11], g_part, rtol=1e-12, atol=1e-13)


def test_softmax_penalty_fixes_the_logit_shift():
    rng = np.random.default_rng(121)
    loss = GaussianMixtureLoss(3, 2)
    theta = _random_mixture_theta(rng, 3, 2)
    theta[:3] -= theta[:3].mean()
    x = rng.normal(size=(20, 2))
    shifted = theta.copy()
    shifted[:3] += 0.7
    # softmax is shift invariant; only ½(Σα)² = ½(3·0.7)² changes
    np.testing.assert_allclose(loss.value(x, shifted) - loss.value(x, theta), 0.5 * 2.1**2, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# smoothed Hessian: structure (its population limit is in test_mixtures_stats.py)
# ---------------------------------------------------------------------------------------------


def _smoothed_hessian_loops(x, C, h):
    """Record-by-record transcription of the KMeansLoss.smoothed_hessian docstring."""
    k, p = C.shape
    H = np.zeros((k, p, k, p))
    for xi in x:
        d = ((C - xi) ** 2).sum(axis=1)
        a, b = np.argsort(d, kind="stable")[:2]
        S = d[b] - d[a]
        K = math.exp(-0.5 * (S / h) ** 2) / (h * math.sqrt(2 * math.pi))
        ua, ub = C[a] - xi, C[b] - xi
        H[a, :, a, :] += 2.0 * np.eye(p) - 4.0 * K * np.outer(ua, ua)
        H[b, :, b, :] -= 4.0 * K * np.outer(ub, ub)
        H[a, :, b, :] += 4.0 * K * np.outer(ua, ub)
        H[b, :, a, :] += 4.0 * K * np.outer(ub, ua)
    return H.reshape(k * p, k * p) / x.shape[0]


def test_smoothed_hessian_matches_its_docstring_formula():
    rng = np.random.default_rng(130)
    loss = KMeansLoss(3, 2)
    C = np.array([[0.0, 0.0], [1.5, 0.3], [0.4, 1.2]])
    x = rng.normal(loc=0.6, size=(300, 2))
    for h in (0.05, 0.5, 3.0):
        np.testing.assert_allclose(loss.smoothed_hessian(x, C.ravel(), h), _smoothed_hessian_loops(x, C, h),
                                   rtol=1e-10, atol=1e-12)


def test_smoothed_hessian_of_one_centre_is_2i():
    x = np.random.default_rng(131).normal(size=(50, 3))
    np.testing.assert_array_equal(KMeansLoss(1, 3).smoothed_hessian(x, np.zeros(3), 0.1), 2.0 * np.eye(3))


# ---------------------------------------------------------------------------------------------
# the deconvolution likelihood against quadrature
# ---------------------------------------------------------------------------------------------


def _report_log_density(x, mu, sig2, s2, delta):
    """log[δ Π_j φ(x_j; μ_j, σ_j²) + (1 − δ) ∫₀^∞ Π_j φ(x_j; μ_j, σ_j² + w s_j²) e^{−w} dw] by
    adaptive quadrature in t = log w (the integrand is smooth in t and vanishes like e^t at −∞),
    computed relative to its maximum so that tails do not underflow."""
    x, mu, sig2, s2 = (np.atleast_1d(np.asarray(a, dtype=np.float64)) for a in (x, mu, sig2, s2))
    r2 = (x - mu) ** 2

    def lh(t):
        w = math.exp(t)
        V = sig2 + w * s2
        return float(-(r2 / (2 * V)).sum() - 0.5 * np.log(2 * math.pi * V).sum() - w + t)

    grid = np.linspace(-60.0, 8.0, 1361)
    lv = np.array([lh(t) for t in grid])
    top, tp = float(lv.max()), float(grid[lv.argmax()])
    knots = sorted({-60.0, 8.0, tp - 1.0, tp, tp + 1.0, *np.clip(np.log(sig2 / s2), -60, 8)})
    inner = sum(integrate.quad(lambda t: math.exp(lh(t) - top), a, b, epsabs=0.0, epsrel=1e-12,
                               limit=400)[0] for a, b in itertools.pairwise(knots) if b > a)
    log_exact = math.log(delta) + float(-(r2 / (2 * sig2)).sum() - 0.5 * np.log(2 * math.pi * sig2).sum())
    return float(np.logaddexp(log_exact, math.log(1.0 - delta) + top + math.log(inner)))


def test_scale_nodes_are_a_probability_rule():
    w, om = scale_nodes()
    assert w[0] == 0.0 and np.all(np.diff(w) > 0) and np.all(om > 0)
    # the docstring's claims: Σ ω = 1 and E W = 1 to 1e-5; E W² = 2 likewise
    assert om.sum() == pytest.approx(1.0, abs=1e-5)
    assert om @ w == pytest.approx(1.0, abs=1e-5)
    assert om @ w**2 == pytest.approx(2.0, abs=2e-5)
    # halving the step shrinks the error about fourfold (second order, not first)
    _, om2 = scale_nodes(step=0.2)
    assert abs(om2.sum() - 1.0) < 0.35 * abs(om.sum() - 1.0)


@pytest.mark.parametrize("s2", [0.25, 1.0, 3.0])
@pytest.mark.parametrize("ratio", [10.0, 1.0, 0.1, 1e-2, 1e-4])
def test_deconvolution_density_matches_quadrature(s2, ratio):
    """exp(−ℓ) against quad, σ² = ratio·s² down to 1e-4·s², |x − μ| up to 10 s."""
    delta, mu = 0.2, 0.3
    sig2 = ratio * s2
    loss = DeconvolutionMixtureLoss(1, 1, zero_prob=delta, noise_var=s2)
    theta = np.array([0.0, mu, math.log(sig2)])
    sig, s = math.sqrt(sig2), math.sqrt(s2)
    for off in (0.0, 0.5 * sig, -3.0 * sig, s, -4.0 * s, 10.0 * s):
        got = -loss.value(np.array([[mu + off]]), theta)[0]
        want = _report_log_density(mu + off, mu, sig2, s2, delta)
        assert abs(math.expm1(got - want)) < 1e-3, (off, got, want)


def test_deconvolution_density_two_fields_and_two_components_matches_quadrature():
    delta = 0.35
    s2 = np.array([0.5, 1.3])
    loss = DeconvolutionMixtureLoss(2, 2, zero_prob=delta, noise_var=s2)
    mu = np.array([[0.0, 1.0], [2.0, -1.0]])
    var = np.array([[0.3, 0.05], [1.0, 0.6]])
    alpha = np.array([0.4, -0.4])  # Σα = 0: no penalty; weights softmax(α)
    pi = np.exp(alpha) / np.exp(alpha).sum()
    theta = np.concatenate([alpha, mu.ravel(), np.log(var).ravel()])
    for x in ([0.1, 0.9], [2.5, -3.0], [-2.0, 4.0], [1.0, 0.0]):
        want = np.logaddexp(*(math.log(pi[j]) + _report_log_density(x, mu[j], var[j], s2, delta)
                              for j in range(2)))
        got = -loss.value(np.array([x]), theta)[0]
        assert abs(math.expm1(got - want)) < 1e-3, (x, got, want)


@pytest.mark.parametrize(("mu", "sig2", "s2"), [(0.0, 1.0, 0.5), (0.5, 0.01, 0.25), (-1.0, 1e-4, 1.0)])
def test_deconvolution_density_integrates_to_one(mu, sig2, s2):
    loss = DeconvolutionMixtureLoss(1, 1, zero_prob=0.2, noise_var=s2)
    theta = np.array([0.0, mu, math.log(sig2)])

    def g(x):
        return math.exp(-loss.value(np.array([[x]]), theta)[0])

    sig = math.sqrt(sig2)
    pts = [mu - 10 * sig, mu - sig, mu, mu + sig, mu + 10 * sig]
    lo, hi = mu - 1.0 - 10 * sig, mu + 1.0 + 10 * sig
    total = integrate.quad(g, -np.inf, lo, limit=200)[0] + integrate.quad(g, hi, np.inf, limit=200)[0]
    total += integrate.quad(g, lo, hi, points=pts, limit=400, epsabs=1e-12)[0]
    assert total == pytest.approx(1.0, abs=2e-4)


# ---------------------------------------------------------------------------------------------
# components
# ---------------------------------------------------------------------------------------------


def test_canonical_order_sorts_by_first_field_then_the_next():
    c = np.array([[2.0, 5.0], [1.0, 9.0], [2.0, -1.0], [-3.0, 0.0]])
    order = canonical_order(c)
    np.testing.assert_array_equal(order, [3, 1, 2, 0])
    np.testing.assert_array_equal(c[order], [[-3.0, 0.0], [1.0, 9.0], [2.0, -1.0], [2.0, 5.0]])
    assert canonical_order(np.array([[3.0], [1.0], [2.0]])).tolist() == [1, 2, 0]


def test_match_components_recovers_a_random_permutation():
    rng = np.random.default_rng(140)
    for k in (2, 5, 12):
        ref = rng.normal(scale=10.0, size=(k, 3))
        for _ in range(5):
            shuffle = rng.permutation(k)
            # noise far below the spacing of the centres, so the true matching is the cheapest
            gap = min(np.linalg.norm(ref[i] - ref[j]) for i in range(k) for j in range(i))
            noisy = ref[shuffle] + rng.normal(scale=gap / 50.0, size=(k, 3))
            perm = match_components(ref, noisy)
            np.testing.assert_array_equal(shuffle[perm], np.arange(k))
            assert np.abs(noisy[perm] - ref).max() < gap / 5.0


def test_match_components_minimises_the_total_squared_distance():
    rng = np.random.default_rng(141)
    from itertools import permutations

    ref, cand = rng.normal(size=(5, 2)), rng.normal(size=(5, 2))
    best = min(((cand[list(q)] - ref) ** 2).sum() for q in permutations(range(5)))
    perm = match_components(ref, cand)
    assert ((cand[perm] - ref) ** 2).sum() == pytest.approx(best, rel=1e-12)


def test_component_index_and_permute_fit_round_trip():
    rng = np.random.default_rng(142)
    k, p = 4, 3
    widths = (1, p, p)
    q = k * (1 + 2 * p)
    theta = rng.normal(size=q)
    H = rng.normal(size=(q, q))
    perm = rng.permutation(k)
    idx = component_index(perm, widths)
    assert sorted(idx.tolist()) == list(range(q))
    t2, H2 = permute_fit(perm, widths, theta, H)
    back = np.argsort(perm)
    t3, H3 = permute_fit(back, widths, t2, H2)
    np.testing.assert_array_equal(t3, theta)
    np.testing.assert_array_equal(H3, H)
    # new component j is old component perm[j], group by group
    loss = GaussianMixtureLoss(k, p)
    for j in range(k):
        a, mu, v = loss.split(t2)
        a0, mu0, v0 = loss.split(theta)
        assert a[j] == a0[perm[j]]
        np.testing.assert_array_equal(mu[j], mu0[perm[j]])
        np.testing.assert_array_equal(v[j], v0[perm[j]])


@pytest.mark.parametrize("make", [
    lambda: GaussianMixtureLoss(3, 2),
    lambda: DeconvolutionMixtureLoss(3, 2, zero_prob=0.3, noise_var=[0.4, 0.9]),
    lambda: KMeansLoss(3, 2),
])
def test_permuting_components_leaves_every_record_unchanged(make):
    rng = np.random.default_rng(143)
    loss = make()
    q = loss.n_params(2)
    theta = rng.normal(size=q) if isinstance(loss, KMeansLoss) else _random_mixture_theta(rng, 3, 2)
    x = rng.normal(scale=2.0, size=(200, 2))
    for perm in ([1, 2, 0], [2, 1, 0], [0, 2, 1]):
        idx = component_index(perm, loss.widths)
        np.testing.assert_allclose(loss.value(x, theta[idx]), loss.value(x, theta), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(loss.grad(x, theta[idx]), loss.grad(x, theta)[:, idx], rtol=1e-10,
                                   atol=1e-12)
        if isinstance(loss, KMeansLoss):
            np.testing.assert_allclose(loss.smoothed_hessian(x, theta[idx], 0.3),
                                       loss.smoothed_hessian(x, theta, 0.3)[np.ix_(idx, idx)],
                                       rtol=1e-10, atol=1e-12)


def test_mixture_density_matches_scipy():
    rng = np.random.default_rng(144)
    w = np.array([0.2, 0.5, 0.3])
    m = rng.normal(size=(3, 2))
    v = rng.uniform(0.2, 2.0, size=(3, 2))
    x = rng.normal(size=(30, 2))
    want = sum(w[j] * stats.multivariate_normal(m[j], np.diag(v[j])).pdf(x) for j in range(3))
    np.testing.assert_allclose(mixture_density(x, w, m, v), want, rtol=1e-12)


@pytest.mark.parametrize(("delta_mu", "sigma"), [(0.5, 1.0), (1.0, 0.3), (3.0, 2.0)])
def test_tv_distance_of_two_gaussians_matches_closed_form(delta_mu, sigma):
    p_mix = (np.array([1.0]), np.array([[0.0]]), np.array([[sigma**2]]))
    q_mix = (np.array([1.0]), np.array([[delta_mu]]), np.array([[sigma**2]]))
    tv, se = mixture_tv_distance(p_mix, q_mix, n_mc=200_000, rng=np.random.default_rng(145))
    exact = 2.0 * stats.norm.cdf(abs(delta_mu) / (2.0 * sigma)) - 1.0
    # Monte Carlo: |tv − exact| < 4.5 se fails with probability < 1e-5; se ≤ 0.5/√n_mc
    assert 0 < se < 0.5 / math.sqrt(200_000) + 1e-12
    assert abs(tv - exact) < 4.5 * se


def test_tv_distance_of_identical_and_relabelled_mixtures_is_zero():
    w = np.array([0.3, 0.7])
    m = np.array([[0.0, 1.0], [3.0, -1.0]])
    v = np.array([[1.0, 0.5], [0.2, 2.0]])
    tv, se = mixture_tv_distance((w, m, v), (w, m, v), n_mc=5000, rng=1)
    assert tv < 1e-12 and se < 1e-12
    tv, _ = mixture_tv_distance((w, m, v), (w[::-1], m[::-1], v[::-1]), n_mc=5000, rng=1)
    assert tv < 1e-12


def test_max_centre_error_matches_by_components():
    true = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    est = np.array([[0.1, 9.6], [10.0, 0.2], [-0.3, 0.0]])
    # matched: (−0.3, 0) ↔ (0, 0), (10, 0.2) ↔ (10, 0), (0.1, 9.6) ↔ (0, 10), the largest error
    assert max_centre_error(true, est) == pytest.approx(math.hypot(0.1, 0.4), rel=1e-12)
    assert max_centre_error(true, true[[2, 0, 1]]) == 0.0


# ---------------------------------------------------------------------------------------------
# fits: bookkeeping, closed forms, edge cases
# ---------------------------------------------------------------------------------------------


def test_kmeans_one_centre_is_the_dr_mean():
    rng = np.random.default_rng(150)
    mech, _x, x1, x2 = _clusters(rng, 4000)
    d = mech.zero_prob
    fit = fit_kmeans(x1, x2, k=1, low=LOW, high=HIGH, zero_prob=d)
    pseudo = (x1 - (1 - d) * x2) / d
    np.testing.assert_allclose(fit.centres[0], pseudo.mean(axis=0), rtol=0, atol=1e-10)
    np.testing.assert_allclose(fit.stderr, pseudo.std(axis=0) / math.sqrt(4000), rtol=1e-6)
    sq = m_estimate(SquaredLoss(2), x1, x2, zero_prob=d)
    np.testing.assert_allclose(fit.value, sq.theta, rtol=0, atol=1e-10)
    np.testing.assert_allclose(fit.stderr, sq.stderr, rtol=1e-6)
    assert fit.converged and fit.unidentified == {}


def test_kmeans_fit_bookkeeping():
    rng = np.random.default_rng(151)
    _mech, _x, x1, x2 = _clusters(rng, 6000)
    fit = fit_kmeans(x1, x2, k=3, low=LOW, high=HIGH, zero_prob=0.2, fields=("lat", "lon"))
    assert fit.kind == "kmeans" and fit.method == "dr" and fit.k == 3 and fit.n == 6000
    assert fit.params == ("0.lat", "0.lon", "1.lat", "1.lon", "2.lat", "2.lon")
    assert fit.centres.shape == (3, 2) and np.all(np.diff(fit.centres[:, 0]) > 0)
    lo, hi = fit.ci()
    z = stats.norm.ppf(0.975)
    np.testing.assert_allclose(hi - lo, 2 * z * fit.stderr, rtol=1e-12)
    assert np.all(np.isfinite(fit.stderr)) and np.all(fit.stderr > 0)
    np.testing.assert_allclose(np.sqrt(np.diag(fit.cov)), fit.stderr, rtol=1e-12)
    again = fit_kmeans(x1, x2, k=3, low=LOW, high=HIGH, zero_prob=0.2, fields=("lat", "lon"))
    np.testing.assert_array_equal(again.value, fit.value)  # a deterministic function of the reports
    with pytest.raises(ParameterError, match="centres only"):
        _ = fit.weights


def test_mixture_fit_bookkeeping_and_parameter_names():
    rng = np.random.default_rng(152)
    n = 3000
    x = CENTRES[rng.integers(3, size=n)] + rng.standard_normal((n, 2))
    fit = fit_gaussian_mixture(x, k=3, low=LOW, high=HIGH, method="oracle", fields=("a", "b"))
    assert fit.params[:3] == ("0.weight", "1.weight", "2.weight")
    assert fit.params[3:5] == ("0.mean.a", "0.mean.b") and fit.params[9:11] == ("0.var.a", "0.var.b")
    assert fit.weights.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(np.diff(fit.centres[:, 0]) > 0)
    assert max_centre_error(CENTRES, fit.centres) < 0.15
    np.testing.assert_allclose(fit.variances, 1.0, atol=0.15)


@pytest.mark.parametrize(("k", "n", "seed"), [(8, 3000, 153), (5, 3000, 1), (5, 3000, 2)])
def test_too_many_centres_name_exactly_the_components_the_data_do_not_place(k, n, seed):
    """k > 3 on 3 clusters with strong privacy noise: whatever components the fit names as not
    determined by the data have inf standard errors and a reason that holds at the fit; the
    others' are finite, and nothing is NaN (test_kmeans_restarts.py: the restarts that move such
    centres)."""
    mech, _x, x1, x2 = _clusters(np.random.default_rng(seed), n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fit = fit_kmeans(x1, x2, k=k, low=LOW, high=HIGH, zero_prob=0.2, n_init=2)
    assert set(fit.unidentified) <= set(range(k))
    assert all(isinstance(why, str) and why for why in fit.unidentified.values())
    for arr in (fit.value, fit.stderr, fit.cov):
        assert not np.any(np.isnan(arr))
    assert np.all(np.isfinite(fit.value))
    assert np.all(np.diff(fit.centres[:, 0]) >= 0)
    se = fit.stderr.reshape(k, 2)
    for j in range(k):
        assert np.all(np.isinf(se[j])) if j in fit.unidentified else np.all(np.isfinite(se[j]))
    # the reasons refer to the components in canonical order: recompute them from the centres
    # (cells in the box-standardized coordinates the fit works in)
    d = mech.zero_prob
    mid, half = (LOW + HIGH) / 2, (HIGH - LOW) / 2
    z = (np.vstack([x1, x2]) - mid) / half
    w = np.r_[np.full(n, 1 / d), np.full(n, -(1 - d) / d)]
    a = ((z[:, None, :] - ((fit.centres - mid) / half)[None]) ** 2).sum(axis=2).argmin(axis=1)
    cell = np.bincount(a, w, minlength=k)
    for j, why in fit.unidentified.items():
        if "held on the fields' bounds" in why:  # the fit keeps centres in the box
            on = np.isclose(fit.centres[j], LOW) | np.isclose(fit.centres[j], HIGH)
            assert np.any(on), (j, fit.centres[j])
        elif "cell weight" in why:
            assert cell[j] <= 0, (j, cell)
    for j in set(range(k)) - set(fit.unidentified):
        assert cell[j] > 0 and np.all((fit.centres[j] >= LOW) & (fit.centres[j] <= HIGH))


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [KMeansLoss, GaussianMixtureLoss])
@pytest.mark.parametrize(("k", "p", "match"), [
    (0, 2, r"k must be an integer in \[1, 50\], got 0"),
    (51, 2, "k must be an integer in"),
    (2.5, 2, "k must be an integer in"),
    (True, 2, "k must be an integer in"),
    (2, 0, "p must be an integer >= 1"),
    (2, 1.0, "p must be an integer >= 1"),
])
def test_bad_k_and_p(cls, k, p, match):
    with pytest.raises(ParameterError, match=match):
        cls(k, p)


def test_bad_loss_options():
    with pytest.raises(ParameterError, match="n_init"):
        KMeansLoss(2, 2, n_init=0)
    with pytest.raises(ParameterError, match="box"):
        KMeansLoss(2, 2, box=(1.0, 1.0))
    with pytest.raises(ParameterError, match="box"):
        GaussianMixtureLoss(2, 2, box=([0.0, 1.0], [1.0, np.nan]))
    with pytest.raises(ParameterError, match="zero_prob"):
        DeconvolutionMixtureLoss(2, 1, zero_prob=1.0, noise_var=1.0)
    with pytest.raises(ParameterError, match="noise_var"):
        DeconvolutionMixtureLoss(2, 1, zero_prob=0.2, noise_var=0.0)
    with pytest.raises(ParameterError, match="noise_var"):
        DeconvolutionMixtureLoss(2, 2, zero_prob=0.2, noise_var=[1.0, 1.0, 1.0])
    with pytest.raises(ParameterError, match="x must have exactly 2 column"):
        KMeansLoss(2, 2).check_x(np.zeros((5, 3)))


def _small_reports():
    rng = np.random.default_rng(160)
    _mech, _x, x1, x2 = _clusters(rng, 300)
    return x1, x2


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"low": None, "high": None}, "low and high"),
    ({"high": None}, "low and high"),
    ({"low": HIGH, "high": LOW}, "low < high"),
    ({"low": [0.0, 0.0], "high": [1.0, 0.0]}, "low < high"),
    ({"low": [0.0, np.inf], "high": [1.0, 1.0]}, "low must contain only finite"),
    ({"x1": "nan"}, "x1 must contain only finite"),
    ({"x2": "nan"}, "x2 must contain only finite"),
    ({"x1": "3col"}, r"x1 must have 2 column\(s\)"),
    ({"x2": "short"}, "x2 must have the shape of x1"),
    ({"method": "sdr"}, "method must be one of"),
    ({"method": "sl"}, "method must be one of"),
    ({"method": "deconvolution"}, "method must be one of"),
    ({"x2": None}, "method 'dr' needs x2"),
    ({"zero_prob": None}, "zero_prob"),
    ({"zero_prob": 1.0}, r"zero_prob must be in \(0, 1\)"),
    ({"k": 0}, "k must be an integer"),
    ({"k": 51}, "k must be an integer"),
    ({"k": 2.5}, "k must be an integer"),
    ({"x1": "few"}, "need at least 20 reports"),
    ({"fields": ("a",)}, "fields must name 2"),
    ({"level": 1.0}, "level must be in"),
])
def test_fit_kmeans_bad_input(kwargs, match):
    x1, x2 = _small_reports()
    args = {"x1": x1, "x2": x2, "k": 3, "low": LOW, "high": HIGH, "zero_prob": 0.2}
    special = {
        "nan": lambda a: np.where(np.arange(a.size).reshape(a.shape) == 7, np.nan, a),
        "3col": lambda a: np.c_[a, a[:, :1]],
        "short": lambda a: a[:-1],
        "few": lambda a: a[:19],
    }
    for key, val in kwargs.items():
        args[key] = special[val](args[key]) if isinstance(val, str) and val in special else val
    if kwargs.get("x1") == "few":
        args["x2"] = args["x2"][:19]
    with pytest.raises(ParameterError, match=match):
        fit_kmeans(args.pop("x1"), args.pop("x2"), **args)


def test_sdr_and_sl_are_refused_for_kmeans_and_mixtures():
    for loss in (KMeansLoss(3, 2), GaussianMixtureLoss(3, 2)):
        for method in ("sdr", "sl"):
            with pytest.raises(ParameterError, match="DR is required"):
                corrected_loss(loss, method, 0.2, [0.1, 0.1])
    x1, x2 = _small_reports()
    with pytest.raises(ParameterError, match="DR is required"):
        m_estimate(KMeansLoss(3, 2), x1, x2, zero_prob=0.2, scale=[1.0, 1.0], method="sdr")
    # forced past the smoothness check, the batch fit still refuses
    forced = corrected_loss(KMeansLoss(3, 2), "sdr", 0.2, [0.1, 0.1], force=True)
    with pytest.raises(ParameterError, match="use 'dr'"):
        KMeansLoss(3, 2).minimise(forced, x1, x2, None)
    with pytest.raises(ParameterError, match="use 'dr'"):
        GaussianMixtureLoss(3, 2).minimise(forced, x1, x2, None)


def test_kmeans_minimise_needs_as_many_reports_as_centres():
    loss = KMeansLoss(5, 1)
    with pytest.raises(ParameterError, match="k = 5 centres need at least 5 reports, got 4"):
        loss.minimise(corrected_loss(loss, "naive"), np.arange(4.0)[:, None], None, None)


def test_mixture_fit_bad_input():
    x1, x2 = _small_reports()
    common = {"k": 3, "low": LOW, "high": HIGH, "zero_prob": 0.2}
    with pytest.raises(ParameterError, match="noise scale"):
        fit_gaussian_mixture(x1, **common)  # deconvolution needs scale
    with pytest.raises(ParameterError, match="zero_prob"):
        fit_gaussian_mixture(x1, k=3, low=LOW, high=HIGH, scale=[8.0, 7.5])
    with pytest.raises(ParameterError, match="scale"):
        fit_gaussian_mixture(x1, **common, scale=[8.0, 0.0])
    with pytest.raises(ParameterError, match="method must be one of"):
        fit_gaussian_mixture(x1, x2, **common, method="sdr")
    with pytest.raises(ParameterError, match="needs x2"):
        fit_gaussian_mixture(x1, **common, method="dr")
    with pytest.raises(ParameterError, match="need at least 50 reports"):
        fit_gaussian_mixture(x1[:49], **common, scale=[8.0, 7.5])


@pytest.mark.parametrize("method", ["dr", "oracle"])
def test_deconvolution_loss_in_m_estimate_needs_naive(method):
    x1, x2 = _small_reports()
    loss = DeconvolutionMixtureLoss(3, 2, zero_prob=0.2, noise_var=[64.0, 56.0])
    with pytest.raises(ParameterError, match="use method='naive'"):
        m_estimate(loss, x1, x2, zero_prob=0.2, method=method)


def test_component_helpers_bad_input():
    with pytest.raises(ParameterError, match="centres must have the shape of reference"):
        match_components(np.zeros((3, 2)), np.zeros((2, 2)))
    with pytest.raises(ParameterError, match="centres must contain only finite"):
        match_components(np.zeros((2, 2)), np.array([[0.0, np.nan], [1.0, 1.0]]))
    mix = (np.array([1.0]), np.zeros((1, 1)), np.ones((1, 1)))
    with pytest.raises(ParameterError, match="n_mc must be >= 1000"):
        mixture_tv_distance(mix, mix, n_mc=999)
    with pytest.raises(ParameterError, match="weights must be >= 0 and sum to 1"):
        mixture_density(np.zeros((1, 1)), [0.5, 0.6], np.zeros((2, 1)), np.ones((2, 1)))
    with pytest.raises(ParameterError, match="variances must be > 0"):
        mixture_density(np.zeros((1, 1)), [1.0], np.zeros((1, 1)), np.zeros((1, 1)))
    with pytest.raises(ParameterError, match="disagree"):
        mixture_density(np.zeros((1, 1)), [1.0], np.zeros((1, 2)), np.ones((1, 1)))
