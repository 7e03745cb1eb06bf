"""Composition of per-report guarantees over the reports of one privacy unit (docs/privacy.md §7).

A device that sends T reports is protected by the T-fold composition of the per-report trade-off
function, not by the per-report one. The composition is computed with the privacy-loss
distribution (PLD) accountant of Google's ``dp-accounting`` library (Koskela, Jälkö & Honkela
2020; Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022, "Connect the dots"): each report's PLD
is built here from the mechanism's privacy profile, ``dp-accounting`` composes it by FFT and reads
off δ(ε) = E_P[(1 − e^{ε − L})₊] for the composed privacy loss L.

Per-report privacy loss distributions (under the first hypothesis P; the pairs are symmetric, so
one direction serves both):

* ZIL, one numeric field (exact): with probability ``zero_prob`` the report is the exact value and
  the loss is +∞; otherwise it is the loss of unit-variance Laplace noise against a shift c, which
  is ``ε₁ = √2·c`` with probability ½, ``−ε₁`` with probability ½e^{−ε₁}, and continuous in
  between with CDF ½·exp(−(ε₁ − ℓ)/2) (paper Theorem 3.1 with d = 1).
* ZIL, several fields (conservative): the β_c lower bound of the trade-off (paper Proposition 3.2,
  Theorem 3.2) is the trade-off of a Gaussian shift ``c/√W`` with ``W ~ Exp(1)`` revealed, whose
  loss given W is Normal(μ²/2, μ²), μ = c/√W. Composing the bound is valid because f-DP
  composition is monotone (Dong, Roth & Su 2022, Theorem 3.2).
* A pure ε-DP mechanism (the categorical uRR/uRAP fields for their sensitive values): the
  dominating pair of ε-DP, randomized response with ``e^ε`` odds (Kairouz, Oh & Viswanath 2015).

Discretization is pessimistic throughout (losses rounded up to the grid, the tail beyond the grid
counted as +∞), so every δ printed is an upper bound of the true one. The probability that at
least one of T reports is an exact release, ``1 − (1 − zero_prob)^T``, is a floor of every δ.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from mechanisms._validate import check_open_unit, check_positive
from mechanisms.errors import ParameterError
from mechanisms.privacy._numerics import _SQRT2, _check_dim, _check_epsilon_array

__all__ = [
    "COMPOSED_EPSILONS",
    "MAX_REPORTS",
    "ComposedGuarantee",
    "calibrate_composed",
    "calibrate_composed_epsilon",
    "compose_pure",
    "compose_zil",
    "exact_release_prob",
    "pure_pld",
    "zil_pld",
]

#: ε values at which composed statements are reported by default.
COMPOSED_EPSILONS: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0)
#: Largest number of composed reports (beyond it the FFTs cost more than any statement is worth).
MAX_REPORTS = 100_000
#: Grid step of the privacy loss: exact Laplace accounting and the β_c bound. Each composed report
#: can overstate ε by at most one step, so T reports by at most T steps.
LAPLACE_STEP = 1e-4
BETA_STEP = 1e-3
#: β_c losses above this (or above the largest ε asked for + 40) are counted as +∞ (pessimistic).
#: Under P, E[e^{−L}] = 1, so the other reports' losses offset such a loss down to ε only with
#: probability ≤ e^{−(L_TOP − ε)}.
L_TOP = 60.0
#: Largest per-report ε₁ = √2·c of the exact one-field accounting (10⁶ grid bins).
MAX_EPSILON1 = 50.0
_L_BOTTOM = -40.0  # P(L < −40) ≤ e^{−40} under P: the mass below is folded into the lowest bin
_W_STEP = 0.1  # trapezoid step in log w for β_c's CDF (agrees with step 0.025 to 1e-12)
_CHUNK = 4096


def _check_reports(reports) -> int:
    integral = isinstance(reports, (int, np.integer)) and not isinstance(reports, bool)
    if not integral or not 1 <= reports <= MAX_REPORTS:
        raise ParameterError(f"reports must be an integer in [1, {MAX_REPORTS}], got {reports!r}")
    return int(reports)


def exact_release_prob(zero_prob: float, reports: int) -> float:
    """Probability that at least one of ``reports`` ZIL reports is released exactly.

    ``1 − (1 − zero_prob)^T`` (``zero_prob = 0.2``, T = 10 → 0.893): a floor of every δ of the
    composed guarantee, because an exact release is told apart from any other input with
    certainty. Raises ``ParameterError`` for ``zero_prob`` outside (0, 1) or a bad ``reports``.
    """
    z = check_open_unit("zero_prob", zero_prob)
    t = _check_reports(reports)
    return -math.expm1(t * math.log1p(-z))


def _pld_from_cdf_edges(edges_index: np.ndarray, cdf: np.ndarray, step: float, scale: float, infinity: float):
    """A pessimistic PLD: the mass between consecutive edges goes to the upper edge's index."""
    mass = np.diff(cdf) * scale
    idx = edges_index[1:]
    keep = mass > 0.0
    pmf = dict(zip(idx[keep].tolist(), mass[keep].tolist()))
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution as PLD

    return PLD.create_from_rounded_probability(pmf, infinity, step, pessimistic_estimate=True)


def _laplace_cdf(ell: np.ndarray, eps1: float) -> np.ndarray:
    """CDF of the Laplace privacy loss under P (shift ε₁ in loss units), atoms at ±ε₁ included."""
    out = np.where(ell < eps1, 0.5 * np.exp(-0.5 * (eps1 - np.minimum(ell, eps1))), 1.0)
    return np.where(ell < -eps1, 0.0, out)


def _beta_cdf(ell: np.ndarray, c: float) -> np.ndarray:
    """CDF of the β_c privacy loss under P: ``E_W Φ((ℓ − μ²/2)/μ)``, ``μ = c/√W``, at sorted ``ell``.

    Trapezoid in log w (step ``_W_STEP``). Per chunk of ℓ only the nodes whose normal argument is
    within ±9.5 somewhere in the chunk are evaluated; the others contribute their whole weight
    (argument above 9.5: Φ > 1 − 10⁻²⁰) or nothing (below −9.5), each far below the grid's error.
    """
    s = np.arange(-36.0, 3.8 + _W_STEP / 2, _W_STEP)  # the W mass outside is < 1e-15: into the +∞ tail
    w = np.exp(s)
    weights = _W_STEP * np.exp(s - w)
    mu = c / np.sqrt(w)
    half = 0.5 * mu
    out = np.empty(ell.shape)
    chunk = 512
    for start in range(0, ell.size, chunk):
        x = ell[start:start + chunk]
        a_lo, a_hi = x[0] / mu - half, x[-1] / mu - half  # the argument increases with ℓ
        ones = a_lo > 9.5
        band = ~ones & (a_hi >= -9.5)
        base = weights[ones].sum()
        if band.any():
            arg = x[:, None] / mu[band] - half[band]
            out[start:start + chunk] = base + special.ndtr(arg) @ weights[band]
        else:
            out[start:start + chunk] = base
    return np.clip(out, 0.0, 1.0)


@functools.lru_cache(maxsize=64)
def zil_pld(zero_prob: float, c: float, dim: int | None = None, step: float | None = None,
            top: float = L_TOP):
    """The privacy loss distribution of one ZIL report (``dp_accounting`` object).

    Parameters
    ----------
    zero_prob : float
        δ in (0, 1): probability of an exact release (a loss of +∞).
    c : float
        Shift between the hypotheses in noise units, > 0: ``diameter / scale``.
    dim : int or None
        1: the exact one-field (Laplace) loss, grid step ``LAPLACE_STEP``. ``None`` or ≥ 2: the
        β_c bound, valid for every number of fields, grid step ``BETA_STEP``.
    step : float, optional
        Another grid step of the privacy loss (coarser is faster and more pessimistic).
    top : float
        β_c losses above ``top`` count as +∞; δ(ε) is tight for ε up to about ``top − 30``.

    Returns
    -------
    dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution
        Pessimistic (δ's computed from it are upper bounds).

    Raises
    ------
    ParameterError
        ``zero_prob`` outside (0, 1), ``c`` not finite and > 0, ``dim`` not None or ≥ 1, or a
        shift so large (ε₁ = √2·c > ``MAX_EPSILON1``) that the loss grid would not fit in memory.

    Notes
    -----
    Source: docs/privacy.md §2.3, §2.4, §4; the loss distributions are stated in the module
    docstring.
    """
    z = check_open_unit("zero_prob", zero_prob)
    c = check_positive("c", c)
    d = _check_dim(dim)
    if d == 1:
        eps1 = _SQRT2 * c
        if eps1 > MAX_EPSILON1:
            raise ParameterError(f"c must be at most {MAX_EPSILON1 / _SQRT2:.6g} for the exact "
                                 f"accounting (epsilon = sqrt(2)*c <= {MAX_EPSILON1:g}), got {c!r}")
        step = step or LAPLACE_STEP
        lo, hi = math.floor(-eps1 / step) - 1, math.ceil(eps1 / step)
        index = np.arange(lo, hi + 1)
        return _pld_from_cdf_edges(index, _laplace_cdf(index * step, eps1), step, 1.0 - z, z)
    step = step or BETA_STEP
    index = np.arange(math.floor(_L_BOTTOM / step), math.ceil(top / step) + 1)
    cdf = _beta_cdf(index * step, c)
    cdf[0] = 0.0  # the mass below the grid joins the lowest bin (rounded up: pessimistic)
    tail = 1.0 - cdf[-1]  # losses above the top count as +∞
    return _pld_from_cdf_edges(index, cdf, step, 1.0 - z, z + (1.0 - z) * tail)


@functools.lru_cache(maxsize=64)
def pure_pld(epsilon: float):
    """The privacy loss distribution of one ε-DP report (randomized response with e^ε odds).

    The tight dominating pair of every ε-DP mechanism, so its composition is the optimal
    composition of ε-DP (Kairouz, Oh & Viswanath 2015). Raises ``ParameterError`` unless
    ``epsilon`` is finite and > 0. Source: docs/privacy.md §7.
    """
    e = check_positive("epsilon", epsilon)
    from dp_accounting.pld.common import DifferentialPrivacyParameters
    from dp_accounting.pld.privacy_loss_distribution import from_privacy_parameters

    params = DifferentialPrivacyParameters(e, 0.0)
    return from_privacy_parameters(params, value_discretization_interval=LAPLACE_STEP)


@dataclass(frozen=True)
class ComposedGuarantee:
    """(ε, δ) statements for the composition of ``reports`` reports of one mechanism.

    Attributes
    ----------
    reports : int
        T, the number of composed reports.
    epsilons, deltas : tuple of float
        δ(ε) of the T-fold composition, one per ε; upper bounds (pessimistic discretization).
    exact_release_prob : float
        Probability that at least one of the T reports is an exact release (0 for mechanisms
        without exact releases); a floor of every δ.
    accounting : str
        ``"exact_laplace"`` (one numeric field), ``"beta_c_bound"`` (several fields, conservative)
        or ``"pure_epsilon"`` (categorical fields, for their sensitive values).

    Notes
    -----
    Source: docs/privacy.md §7.
    """

    reports: int
    epsilons: tuple[float, ...]
    deltas: tuple[float, ...]
    exact_release_prob: float
    accounting: str

    def to_dict(self) -> dict:
        """``{"reports", "epsilon_delta": [{"epsilon", "delta"}, …], "exact_release_prob",
        "accounting"}`` (the JSON of ``ldp-stream privacy compose``)."""
        return {
            "reports": self.reports,
            "epsilon_delta": [{"epsilon": e, "delta": d} for e, d in zip(self.epsilons, self.deltas)],
            "exact_release_prob": self.exact_release_prob,
            "accounting": self.accounting,
        }


def _deltas(pld, reports: int, epsilons) -> tuple[float, ...]:
    """δ(ε) of the ``reports``-fold composition: ``dp-accounting`` composes, numpy sums.

    ``dp-accounting`` 0.6 evaluates the hockey-stick divergence in a Python loop over the loss
    grid (seconds for a million bins); the sum ``inf + Σ_{ℓ > ε} p(ℓ)(1 − e^{ε − ℓ})`` is the same
    quantity in one vectorised pass over its dense loss grid, used when that grid is available.
    """
    composed = pld.self_compose(reports) if reports > 1 else pld
    pmf = getattr(composed, "_pmf_remove", None)
    probs = getattr(pmf, "_probs", None)
    if probs is None or not hasattr(pmf, "_lower_loss"):  # another dp-accounting layout: its own loop
        values = np.atleast_1d(composed.get_delta_for_epsilon(np.sort(np.asarray(epsilons, dtype=float))))
        order = np.argsort(np.argsort(epsilons))
        return tuple(float(min(max(v, 0.0), 1.0)) for v in values[order])
    probs = np.asarray(probs, dtype=np.float64)
    losses = (np.arange(probs.size) + pmf._lower_loss) * pmf._discretization
    out = []
    for e in epsilons:
        k = int(np.searchsorted(losses, e, side="right"))
        v = pmf._infinity_mass + float(np.dot(probs[k:], -np.expm1(e - losses[k:])))
        out.append(min(max(v, 0.0), 1.0))
    return tuple(out)


def _epsilons(epsilons) -> tuple[float, ...]:
    e = _check_epsilon_array(COMPOSED_EPSILONS if epsilons is None else epsilons)
    if e.ndim != 1 or e.size == 0:
        raise ParameterError("epsilons must be a non-empty sequence of finite numbers >= 0")
    return tuple(float(v) for v in e)


def compose_zil(zero_prob: float, scale: float, *, diameter: float = 1.0, dim: int | None = None,
                reports: int = 1, epsilons=None) -> ComposedGuarantee:
    """The guarantee of ``reports`` ZIL reports of one device, composed.

    Parameters
    ----------
    zero_prob : float
        δ in (0, 1).
    scale : float
        λ > 0, noise std per unit of field range.
    diameter : float, keyword-only
        Diameter of the protected set in standardized units: √d for whole reports of d fields
        (record level), 1 for one field (attribute level). The shift is ``c = diameter/scale``.
    dim : int or None, keyword-only
        1: exact Laplace accounting; None or ≥ 2: the β_c bound (valid for any number of fields).
    reports : int, keyword-only
        T in [1, ``MAX_REPORTS``].
    epsilons : sequence of float, optional
        ε values ≥ 0 at which to report δ; default ``COMPOSED_EPSILONS``.

    Returns
    -------
    ComposedGuarantee

    Raises
    ------
    ParameterError
        On any argument outside its range (the message names it).

    Notes
    -----
    Cost: building the β_c loss grid takes about 0.5 s (cached per (zero_prob, c, dim)); the
    FFT composition well under a second for T ≤ 1000. Source: docs/privacy.md §7.
    """
    lam = check_positive("scale", scale)
    diam = check_positive("diameter", diameter)
    t = _check_reports(reports)
    eps = _epsilons(epsilons)
    d = _check_dim(dim)
    z = check_open_unit("zero_prob", zero_prob)
    return ComposedGuarantee(t, eps, _zil_deltas(z, diam / lam, d, t, eps), exact_release_prob(z, t),
                             "exact_laplace" if d == 1 else "beta_c_bound")


def _zil_deltas(z: float, c: float, d: int | None, t: int, eps: tuple[float, ...],
                step: float | None = None) -> tuple[float, ...]:
    top = max(L_TOP, max(eps) + 40.0)  # the +∞ tail must not reach the ε asked for
    if d != 1 and _beta_cdf(np.array([top]), c)[0] < 1e-12:  # (nearly) every loss is beyond the grid
        return (1.0,) * len(eps)
    return _deltas(zil_pld(z, c, 1 if d == 1 else None, step, top), t, eps)


def compose_pure(epsilon: float, *, reports: int = 1, epsilons=None) -> ComposedGuarantee:
    """The guarantee of ``reports`` reports of an ``epsilon``-DP mechanism, composed optimally.

    For the uRR/uRAP fields this is the guarantee of their sensitive values (docs/frequency.md
    §1). Parameters and errors as :func:`compose_zil`; ``epsilon`` must be finite and > 0.
    Source: docs/privacy.md §7.
    """
    t = _check_reports(reports)
    eps = _epsilons(epsilons)
    return ComposedGuarantee(t, eps, _deltas(pure_pld(float(epsilon)), t, eps), 0.0, "pure_epsilon")


def _largest_ok(delta_at, target: float, lo: float, hi: float, xtol: float = 1e-5) -> float:
    """The largest x in [lo, hi] with ``delta_at(x) <= target``, for ``delta_at`` increasing in x.

    Brent's method on log x to ``xtol`` relative, then a step down until the target holds (the
    discretized δ is a staircase, so the root is only approximately one).
    """
    if delta_at(hi) <= target:
        return hi
    from scipy.optimize import brentq

    x = math.exp(brentq(lambda u: delta_at(math.exp(u)) - target, math.log(lo), math.log(hi), xtol=xtol))
    while delta_at(x) > target and x > lo:
        x = max(lo, x * (1.0 - xtol))
    return x


def calibrate_composed(epsilon: float, delta: float, zero_prob: float, *, diameter: float = 1.0,
                       dim: int | None = None, reports: int = 1, refine: bool = True) -> float:
    """The smallest ZIL scale whose ``reports``-fold composition is (ε, δ)-DP.

    Parameters
    ----------
    epsilon : float
        Target ε > 0 for the whole unit (all T reports).
    delta : float
        Target δ in (0, 1); must exceed ``exact_release_prob(zero_prob, reports)``, the floor
        set by the exact releases.
    zero_prob : float
        δ₀ in (0, 1).
    diameter, dim, reports
        As in :func:`compose_zil`.
    refine : bool
        For the β_c bound: False stops at a 10× coarser loss grid (about 10× faster; the scale is
        slightly larger than needed, still valid).

    Returns
    -------
    float
        λ (to about 10⁻⁴ relative, rounded up so the target holds); any larger λ also meets it.

    Raises
    ------
    ParameterError
        If the target is unreachable (δ at or below the exact-release floor — lower
        ``zero_prob`` or use fewer reports), or an argument is out of range.

    Notes
    -----
    Geometric bisection on c = diameter/λ over the composed δ(ε), which decreases as λ grows
    (docs/privacy.md §2.1, §4).
    """
    e = check_positive("epsilon", epsilon)
    dl = check_open_unit("delta", delta)
    t = _check_reports(reports)
    floor = exact_release_prob(zero_prob, t)
    if dl <= floor:
        raise ParameterError(
            f"delta must exceed {floor:.6g}: with zero_prob = {zero_prob} at least one of {t} reports "
            "is released exactly with that probability, whatever the scale. Lower zero_prob, send "
            "fewer reports per period, or memoize the fields")
    diam = check_positive("diameter", diameter)
    d = _check_dim(dim)
    from mechanisms.privacy.calibration import calibrate_c

    def delta_at(c: float, step: float | None = None) -> float:
        return _zil_deltas(zero_prob, c, d, t, (e,), step)[0]

    # one report is at least as private as T of them: the per-report shift is an upper bracket
    top = MAX_EPSILON1 / _SQRT2 if d == 1 else 1e3
    hi = min(calibrate_c(e, dl, zero_prob, dim=d), top) if dl > zero_prob else top
    lo = hi / t
    while delta_at(lo) > dl:
        if lo < 1e-9:
            raise ParameterError(f"(epsilon={e}, delta={dl}) is out of reach for {t} reports with "
                                 f"zero_prob = {zero_prob}")
        lo /= 4.0
    if d != 1:  # search on a 10x coarser (more pessimistic) grid first, then refine just above it
        lo = _largest_ok(lambda c: delta_at(c, 10 * BETA_STEP), dl, lo, hi, xtol=1e-3)
        if not refine:
            return diam / lo
        hi = min(hi, lo * 1.25)
    return diam / _largest_ok(delta_at, dl, lo, hi, xtol=1e-4)


def calibrate_composed_epsilon(epsilon: float, delta: float, *, reports: int = 1) -> float:
    """The largest per-report ε whose optimal ``reports``-fold composition is (ε, δ)-DP.

    Parameters
    ----------
    epsilon : float
        Target ε > 0 for the unit.
    delta : float
        Target δ in (0, 1) (with δ → 0 this tends to basic composition, ε/T).
    reports : int
        T in [1, ``MAX_REPORTS``].

    Returns
    -------
    float
        The per-report ε of a categorical field (at least ε/T, the basic composition).

    Raises
    ------
    ParameterError
        On arguments out of range. Source: docs/privacy.md §7.
    """
    e = check_positive("epsilon", epsilon)
    dl = check_open_unit("delta", delta)
    t = _check_reports(reports)
    if t == 1:
        return e

    def delta_at(e1: float) -> float:
        return compose_pure(e1, reports=t, epsilons=(e,)).deltas[0]

    return _largest_ok(delta_at, dl, e / t, e)
