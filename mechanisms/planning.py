"""Predicted confidence-interval half-widths of the project's estimators, for planning a deployment.

Given a numeric field's ZIL parameters (``zero_prob`` δ, ``scale`` λ, box ``[low, high]``) or a
categorical field's mechanism (uRR / uRAP, ε, k, the size of the sensitive set), an assumed data
distribution and an expected number n of reports, these functions predict the half-width
``z_{(1+level)/2}·SE`` of the interval that the aggregator reports for

* a ``mean`` query (:class:`aggregator.state.moments.MomentsState`; docs/mechanisms.md §3.1, §6.1),
* a ``quantiles`` query (:class:`aggregator.state.histogram.HistogramState`, the DR quantile of
  docs/mechanisms.md §3.6, §6.2; asymptotic sandwich of the DR check loss, paper §5),
* one category of a ``frequency`` query (the empirical uRR / uRAP estimator, docs/frequency.md
  §2–§5).

The formulas are stated in docs/mechanisms.md §8 ("Predicting interval widths"), with the
simulations that check them (``tests/mechanisms/test_planning.py``).

Data assumption (numeric fields): by default the raw values are **uniform on the box**. Give
``data_sd`` (and optionally ``data_mean``, default the box centre) for a normal distribution
``N(data_mean, data_sd²)`` clipped into the box (the clipped mass sits on the bounds, as the
client's clipping puts it), or ``data_sample`` (raw values, clipped into the box) for an empirical
distribution. Predictions are for one field: the marginal of one field of the joint SL_d draw is
SL_1 with that field's variance ``(λ·range)²`` (docs/mechanisms.md §1.1), so they do not depend
on how many other numeric fields the schema has — that enters only through the privacy
calibration of λ.

Pure mathematics: no I/O; imports neither ``ingest`` nor ``aggregator``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import special

from mechanisms._validate import check_finite_array, check_open_unit, check_positive
from mechanisms.errors import ParameterError
from mechanisms.uldp import URAP, URR

__all__ = [
    "FREQUENCY_MECHANISMS",
    "MEAN_ESTIMATORS",
    "QuantileSandwich",
    "dr_quantile_sandwich",
    "mean_variance_per_report",
    "predict_frequency_halfwidth",
    "predict_mean_halfwidth",
    "predict_quantile_halfwidth",
]

#: Estimators of a ``mean`` query (``aggregator.queries.MeanQuery``; ``sdr`` is its default).
MEAN_ESTIMATORS = ("sdr", "naive", "sl", "dr")
#: Categorical mechanisms (``urr`` with every value sensitive is k-ary RR, ``urap`` is RAPPOR).
FREQUENCY_MECHANISMS = ("urr", "urap")
#: Histogram bins a ``quantiles`` query allows (``aggregator.queries.QuantilesQuery.bins``).
_BINS_RANGE = (16, 100_000)

# Gauss–Legendre rule per sub-interval of the composite quadrature over the box.
_GL_X, _GL_W = np.polynomial.legendre.leggauss(24)


class QuantileSandwich(NamedTuple):
    """The pieces of the DR quantile's asymptotic variance ``A / (n H²)``.

    Attributes
    ----------
    quantile : float
        ξ, the q-quantile of the clipped raw values, units of x.
    density : float
        H = f(ξ), the density of the raw values at ξ (the Hessian of the expected check loss),
        1 / units of x.
    score_variance : float
        A = Var g(ξ), the per-report variance of the DR indicator
        ``g(t) = [1{X̃₁ ≤ t} − (1 − δ)·1{X̃₂ ≤ t}]/δ`` (the corrected check-loss gradient up to the
        constant q), dimensionless.
    """

    quantile: float
    density: float
    score_variance: float


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------


def mean_variance_per_report(zero_prob: float, scale: float, low: float, high: float, *,
                             estimator: str = "sdr", data_sd: float | None = None,
                             data_mean: float | None = None, data_sample=None) -> float:
    """Per-report variance of the mean estimator of a ``mean`` query (SE² = this / n).

    With ``σ = λ·(high − low)`` (the field's noise standard deviation in original units) and
    ``Var X`` the variance of the clipped raw values:

    * ``sdr`` (the default of a ``mean`` query) and ``naive``, mean X̃₁: ``Var X + (1 − δ)σ²``;
    * ``sl``, mean X̃₂: ``Var X + σ²``;
    * ``dr``, mean of ``[X̃₁ − (1 − δ)X̃₂]/δ = X̃₁ − (1 − δ)S′/δ``: ``Var X + (1 − δ)σ²/δ``.

    Parameters
    ----------
    zero_prob : float
        δ ∈ (0, 1).
    scale : float
        λ > 0, noise standard deviation per unit of range.
    low, high : float
        The field's bounds, original units, ``low < high``.
    estimator : {"sdr", "naive", "sl", "dr"}
        The query's estimator.
    data_sd, data_mean, data_sample
        The data assumption (module docstring); default uniform on the box (``Var X = range²/12``).

    Returns
    -------
    float
        Units of x².

    Raises
    ------
    ParameterError
        An argument outside its range (the message names it).

    Notes
    -----
    docs/mechanisms.md §3.1, §6.1, §8.1. Exact for any n (not an asymptotic formula).
    """
    d, lam, lo, hi = _check_zil(zero_prob, scale, low, high)
    if estimator not in MEAN_ESTIMATORS:
        raise ParameterError(f"estimator must be one of {MEAN_ESTIMATORS}, got {estimator!r}")
    var_x = _data(lo, hi, data_sd, data_mean, data_sample).variance()
    sigma2 = (lam * (hi - lo)) ** 2
    noise = {"sdr": (1.0 - d), "naive": (1.0 - d), "sl": 1.0, "dr": (1.0 - d) / d}[estimator]
    return var_x + noise * sigma2


def predict_mean_halfwidth(zero_prob: float, scale: float, low: float, high: float, n, *,
                           estimator: str = "sdr", data_sd: float | None = None,
                           data_mean: float | None = None, data_sample=None,
                           level: float = 0.95) -> float:
    """Predicted half-width ``z·SE`` of a ``mean`` query's interval after n reports.

    ``SE = sqrt(V / n)`` with V from :func:`mean_variance_per_report`; for the default SDR
    estimator ``SE = sqrt(Var X + (1 − δ)λ²(high − low)²)/√n``.

    Parameters
    ----------
    zero_prob : float
        δ ∈ (0, 1).
    scale : float
        λ > 0 (noise standard deviation per unit of range; in original units ``λ·(high − low)``).
    low, high : float
        The field's bounds, original units, ``low < high``.
    n : int
        Expected number of reports in the window, ≥ 2.
    estimator : {"sdr", "naive", "sl", "dr"}
        The query's estimator (default ``sdr``, as ``MeanQuery``).
    data_sd, data_mean, data_sample
        The data assumption (module docstring): default uniform on the box; ``data_sd`` (> 0,
        units of x) and ``data_mean`` (units of x, default the box centre) for a normal
        distribution clipped into the box; ``data_sample`` (array of raw values, ≥ 2 values) for
        the empirical distribution of the clipped values.
    level : float
        Confidence level in (0, 1).

    Returns
    -------
    float
        Half-width in units of x.

    Raises
    ------
    ParameterError
        An argument outside its range (the message names it and the allowed range).

    Notes
    -----
    docs/mechanisms.md §8.1. The noise of one field is the marginal of the joint SL_d draw,
    SL_1 with variance ``(λ·range)²``, whatever d is.
    """
    n = _check_n(n)
    z = _z(level)
    v = mean_variance_per_report(zero_prob, scale, low, high, estimator=estimator, data_sd=data_sd,
                                 data_mean=data_mean, data_sample=data_sample)
    return z * math.sqrt(v / n)


def dr_quantile_sandwich(zero_prob: float, scale: float, low: float, high: float, q: float = 0.5, *,
                         data_sd: float | None = None, data_mean: float | None = None,
                         data_sample=None) -> QuantileSandwich:
    """The sandwich ``H⁻¹AH⁻¹`` of the DR check loss at the q-quantile, per report.

    For the corrected check loss the θ-gradient of a report is ``g(θ) − q`` with
    ``g(t) = [1{X̃₁ ≤ t} − (1 − δ)1{X̃₂ ≤ t}]/δ``, so ``A = Var g(ξ)`` and ``H = f(ξ)``, the density
    of the raw values (paper §5, docs/mechanisms.md §3.6, §8.2). With ``F₁, F₂`` the CDFs of X̃₁,
    X̃₂ and ``F_max(t) = P(X̃₁ ≤ t, X̃₂ ≤ t)`` at ξ,
    ``A = [F₁ + (1 − δ)²F₂ − 2(1 − δ)F_max]/δ² − q²``. Given the raw value x and ``u = ξ − x``,
    with L ~ Laplace(b), ``b = λ·range/√2`` (the SL_1 noise) and S′ ~ Laplace(√δ·b) (the doubling):
    ``P(X̃₂ ≤ ξ) = F_L(u)``, ``P(X̃₁ ≤ ξ) = δ·1{u ≥ 0} + (1 − δ)F_L(u)`` and
    ``F_max = δ·1{u ≥ 0}F_S′(u) + (1 − δ)·½[F_L(u) + F_{L+E}(u)]`` (both below ξ means
    ``X̃₁ + max(0, S′) ≤ ξ``; E ~ Exp with mean √δ·b, the positive part of S′), in closed form;
    the expectation over x is a composite Gauss–Legendre rule refined around ξ (or the sample
    mean for ``data_sample``).

    Parameters
    ----------
    zero_prob, scale, low, high
        As in :func:`predict_quantile_halfwidth`.
    q : float
        Quantile level in (0, 1).
    data_sd, data_mean, data_sample
        The data assumption (module docstring); default uniform on the box.

    Returns
    -------
    QuantileSandwich
        ``(quantile, density, score_variance)``; the asymptotic variance of the DR quantile is
        ``score_variance / (n · density²)``.

    Raises
    ------
    ParameterError
        An argument outside its range, or a q-quantile that falls on the mass clipped onto a
        bound (it then is the bound itself and has no normal interval).
    """
    d, lam, lo, hi = _check_zil(zero_prob, scale, low, high)
    q = check_open_unit("q", q)
    return _sandwich(d, lam, lo, hi, q, _data(lo, hi, data_sd, data_mean, data_sample))


def _sandwich(d: float, lam: float, lo: float, hi: float, q: float, data: _Data) -> QuantileSandwich:
    """:func:`dr_quantile_sandwich` on checked arguments."""
    xi = data.quantile(q)
    b = lam * (hi - lo) / math.sqrt(2.0)  # Laplace scale of the SL_1 noise, units of x
    b2 = math.sqrt(d) * b  # Laplace scale of the doubling draw S′
    x, w = data.nodes(xi, (b, b2))
    u = xi - x
    below = u >= 0
    t1 = float(w @ _laplace_cdf(u, b))  # P(X + L ≤ ξ) = F₂(ξ)
    t2 = float(w @ below)  # F_X(ξ)
    t3 = float(w @ np.where(below, _laplace_cdf(u, b2), 0.0))  # P(X + max(0, S′) ≤ ξ)
    t5 = float(w @ _laplace_plus_exp_cdf(u, b, b2))  # P(X + L + E ≤ ξ)
    f1 = d * t2 + (1.0 - d) * t1
    f2 = t1
    fmax = d * t3 + (1.0 - d) * 0.5 * (t1 + t5)
    eg2 = (f1 + (1.0 - d) ** 2 * f2 - 2.0 * (1.0 - d) * fmax) / d**2
    return QuantileSandwich(xi, data.density(xi), max(eg2 - t2 * t2, 0.0))


def predict_quantile_halfwidth(zero_prob: float, scale: float, low: float, high: float, n,
                               q: float = 0.5, *, bins: int | None = 2000, data_sd: float | None = None,
                               data_mean: float | None = None, data_sample=None,
                               level: float = 0.95) -> float:
    """Predicted half-width of a ``quantiles`` query's interval (the DR quantile) after n reports.

    With A and H = f(ξ) from :func:`dr_quantile_sandwich` and ``s = sqrt(A/n)`` (the standard
    error of the DR CDF at ξ):

    * the streaming state (``bins`` given; what serve reports): its Woodruff interval
      ``[F⁻¹(q − z·s), F⁻¹(q + z·s)]`` with the limits rounded outwards to the histogram's bin
      edges, predicted as ``½[F⁻¹(q + z·s) − F⁻¹(q − z·s)] + ½·(high − low)/bins`` with F the
      assumed distribution (each limit moves out by half a bin on average);
    * the batch estimator (``bins=None``; ``dr_quantile``, ``ldp-stream analyze``): the Wald
      half-width ``z·s/H``.

    For small s both are ``z·sqrt(A/n)/f(ξ)``, the asymptotic half-width of the sandwich
    ``H⁻¹AH⁻¹`` (paper §5).

    Parameters
    ----------
    zero_prob : float
        δ ∈ (0, 1).
    scale : float
        λ > 0, noise standard deviation per unit of range.
    low, high : float
        The field's bounds, original units, ``low < high``.
    n : int
        Expected number of reports in the window, ≥ 2.
    q : float
        Quantile level in (0, 1); default the median.
    bins : int or None
        The query's ``bins`` (16 … 100000, default 2000 as ``QuantilesQuery``); None for the
        unbinned batch estimator (``mechanisms.estimation.dr_quantile``).
    data_sd, data_mean, data_sample
        The data assumption (module docstring); default uniform on the box. The prediction
        assumes a continuous distribution near the quantile: for ``data_sample`` the density is
        a Gaussian kernel estimate (Silverman's bandwidth).
    level : float
        Confidence level in (0, 1).

    Returns
    -------
    float
        Half-width in units of x.

    Raises
    ------
    ParameterError
        An argument outside its range (the message names it), or a q-quantile on the mass
        clipped onto a bound.

    Notes
    -----
    docs/mechanisms.md §8.2. The prediction is of the interval the estimator reports. Where the
    DR quantile is far from its normal limit (z·s not small against min(q, 1 − q), or the SE
    comparable to the doubling noise's scale ``√δ·λ·range``: small δ with small n) its actual
    spread is smaller than this (the interval over-covers), and with z·s ≳ 0.3 the Woodruff
    interval is wider than predicted (docs/mechanisms.md §8.4).
    """
    n = _check_n(n)
    z = _z(level)
    d, lam, lo, hi = _check_zil(zero_prob, scale, low, high)
    q = check_open_unit("q", q)
    if bins is not None and (isinstance(bins, (bool, np.bool_)) or not isinstance(bins, (int, np.integer))
                             or not _BINS_RANGE[0] <= bins <= _BINS_RANGE[1]):
        raise ParameterError(f"bins must be None or an integer in [{_BINS_RANGE[0]}, {_BINS_RANGE[1]}], "
                             f"got {bins!r}")
    data = _data(lo, hi, data_sd, data_mean, data_sample)
    sw = _sandwich(d, lam, lo, hi, q, data)
    zs = z * math.sqrt(sw.score_variance / n)
    if bins is None:  # dr_quantile: a Wald interval
        return zs / sw.density
    limits = data.inverse(np.clip([q - zs, q + zs], 0.0, 1.0))
    return 0.5 * float(limits[1] - limits[0]) + 0.5 * (hi - lo) / int(bins)


def predict_frequency_halfwidth(mechanism: str, epsilon: float, k: int, sensitive_size: int, p: float, n, *,
                                sensitive: bool = True, theta: float | None = None,
                                level: float = 0.95) -> float:
    """Predicted half-width of one category's interval in a ``frequency`` query after n reports.

    The empirical estimator ``p̂ = (m̂ − a)/b`` with the output frequency ``m̂`` of the category's
    code (uRR) or bit (uRAP) has variance ``m(1 − m)/(n b²)``, ``m = a + b·p`` — exact, as
    ``n·m̂`` is binomial. serve reports ``z·sqrt(m̂(1 − m̂)/n)/b`` for every method (for
    ``threshold``, ``projected`` and ``em`` the interval is then clipped to [0, 1]). Intercept a
    and slope b (docs/frequency.md §2, §3):

    ============  =====================  ===================  ===============  ===============
    mechanism     sensitive: a           sensitive: b         non-sens.: a     non-sens.: b
    ============  =====================  ===================  ===============  ===============
    ``urr``       c₂ = 1/(s + e^ε − 1)   c₃ = 1 − s·c₂        0                c₃
    ``urap``      d₁                     θ − d₁               0                1 − d₂
    ============  =====================  ===================  ===============  ===============

    with ``d₁ = θ/((1 − θ)e^ε + θ)``, ``d₂ = ((1 − θ)e^ε + θ)/e^ε`` and by default
    ``θ = e^{ε/2}/(e^{ε/2} + 1)``.

    Parameters
    ----------
    mechanism : {"urr", "urap"}
        The field's mechanism (with ``sensitive_size == k``: k-ary RR, RAPPOR).
    epsilon : float
        ε > 0 of the field.
    k : int
        Number of categories, ≥ 2.
    sensitive_size : int
        s, the size of the sensitive set, 1 … k.
    p : float
        The category's true frequency, in [0, 1].
    n : int
        Expected number of reports in the window, ≥ 2.
    sensitive : bool
        Whether the category is in the sensitive set (default True: for frequencies well below
        ½ the wider interval, with both mechanisms). uRR and uRAP treat the two kinds
        differently: a non-sensitive value is revealed with some probability and estimated with
        intercept 0.
    theta : float, optional
        uRAP's θ ∈ (0, 1); not allowed for uRR.
    level : float
        Confidence level in (0, 1).

    Returns
    -------
    float
        Half-width, in units of frequency (a probability).

    Raises
    ------
    ParameterError
        An argument outside its range (the message names it), a non-sensitive category when
        every value is sensitive, or ``theta`` with uRR.

    Notes
    -----
    docs/frequency.md §5 (standard error of the empirical estimator), docs/mechanisms.md §8.3;
    Murakami & Kawamoto (2019) §4.3.
    """
    if mechanism not in FREQUENCY_MECHANISMS:
        raise ParameterError(f"mechanism must be one of {FREQUENCY_MECHANISMS}, got {mechanism!r}")
    n = _check_n(n)
    z = _z(level)
    kk = _check_int("k", k, 2)
    s = _check_int("sensitive_size", sensitive_size, 1)
    if s > kk:
        raise ParameterError(f"sensitive_size must be an integer in [1, k] = [1, {kk}], got {s}")
    if not isinstance(sensitive, (bool, np.bool_)):
        raise ParameterError(f"sensitive must be True or False, got {sensitive!r}")
    if not sensitive and s == kk:
        raise ParameterError(f"sensitive must be True when sensitive_size == k (= {kk}): "
                             "every category is sensitive")
    pp = _as_real("p", p)
    if not 0.0 <= pp <= 1.0:
        raise ParameterError(f"p must be a frequency in [0, 1], got {p!r}")
    if mechanism == "urr":
        if theta is not None:
            raise ParameterError("theta applies to uRAP only; it must be None for mechanism 'urr'")
        m = URR(kk, range(s), epsilon)
        a, slope = (m.c2 if sensitive else 0.0), m.c3
    else:
        m = URAP(kk, range(s), epsilon, theta, max_patterns=0)
        a, slope = (m.d1, m.theta - m.d1) if sensitive else (0.0, 1.0 - m.d2)
    out = a + slope * pp
    return z * math.sqrt(out * (1.0 - out) / n) / slope


# ---------------------------------------------------------------------------------------------
# the data assumption
# ---------------------------------------------------------------------------------------------


class _Data:
    """The distribution of the clipped raw values ``clip(X, low, high)`` of one field.

    ``kind`` "uniform" (on the box), "normal" (N(mean, sd²) clipped: atoms on the bounds) or
    "sample" (the empirical distribution of the clipped sample; density by a Gaussian kernel).
    """

    def __init__(self, low: float, high: float, kind: str, mean: float = 0.0, sd: float = 1.0,
                 sample: np.ndarray | None = None) -> None:
        self.low, self.high, self.kind = low, high, kind
        self.mean, self.sd = mean, sd
        self.sample = sample
        if kind == "normal":
            self.mass_low = float(special.ndtr((low - mean) / sd))
            self.mass_high = float(special.ndtr(-(high - mean) / sd))
        elif kind == "sample":
            self.mass_low = float(np.mean(sample == low))
            self.mass_high = float(np.mean(sample == high))
            q75, q25 = np.percentile(sample, [75, 25])
            spread = min(float(np.std(sample, ddof=1)), float(q75 - q25) / 1.349) or float(np.std(sample))
            self.bandwidth = 0.9 * spread * sample.size ** (-0.2)
        else:
            self.mass_low = self.mass_high = 0.0

    def variance(self) -> float:
        """Var of the clipped values, units of x²."""
        if self.kind == "uniform":
            return (self.high - self.low) ** 2 / 12.0
        if self.kind == "sample":
            return float(np.var(self.sample, ddof=1))
        x, w = self.nodes(self.mean, ())
        m1 = float(w @ x)
        return float(w @ (x - m1) ** 2)

    def quantile(self, q: float) -> float:
        """The q-quantile ξ, strictly inside the box (else ``ParameterError``)."""
        if q <= self.mass_low or q >= 1.0 - self.mass_high:
            raise ParameterError(
                f"q = {q!r} falls on the values clipped onto a bound (P(X <= low) = {self.mass_low:.4g}, "
                f"P(X >= high) = {self.mass_high:.4g} under the data assumption): that quantile is the "
                f"bound itself and has no normal interval; choose q in ({self.mass_low:.4g}, "
                f"{1.0 - self.mass_high:.4g}) or widen the box")
        if self.kind == "uniform":
            return self.low + q * (self.high - self.low)
        if self.kind == "normal":
            return float(self.mean + self.sd * special.ndtri(q))
        return float(np.quantile(self.sample, q))

    def inverse(self, p: np.ndarray) -> np.ndarray:
        """The quantile function at probabilities p ∈ [0, 1] (the bounds on the clipped mass)."""
        p = np.asarray(p, dtype=np.float64)
        if self.kind == "uniform":
            return self.low + p * (self.high - self.low)
        if self.kind == "normal":
            return np.clip(self.mean + self.sd * special.ndtri(p), self.low, self.high)
        return np.quantile(self.sample, p)

    def density(self, t: float) -> float:
        """Density of the continuous part at an interior point t, 1 / units of x."""
        if self.kind == "uniform":
            return 1.0 / (self.high - self.low)
        if self.kind == "normal":
            zz = (t - self.mean) / self.sd
            return math.exp(-0.5 * zz * zz) / (self.sd * math.sqrt(2.0 * math.pi))
        h = self.bandwidth
        zz = (self.sample - t) / h
        return float(np.mean(np.exp(-0.5 * zz * zz)) / (h * math.sqrt(2.0 * math.pi)))

    def nodes(self, centre: float, scales) -> tuple[np.ndarray, np.ndarray]:
        """Points and weights ``(x, w)`` with ``Σ w·φ(x) ≈ E φ(X)`` (Σ w = 1).

        For the continuous kinds: the atoms on the bounds plus a composite Gauss–Legendre rule
        over the box whose sub-intervals end at ``centre`` (where the integrands jump or kink)
        and are refined geometrically around it on the length ``scales`` (the noise's Laplace
        scales). For a sample: its points with equal weights.
        """
        if self.kind == "sample":
            return self.sample, np.full(self.sample.size, 1.0 / self.sample.size)
        lo, hi = self.low, self.high
        cuts = [np.linspace(lo, hi, 17), [centre]]
        for s in scales:
            steps = s * 2.0 ** np.arange(-6, 60)
            steps = steps[steps < hi - lo]
            cuts += [centre - steps, centre + steps]
        if self.kind == "normal":
            cuts.append(self.mean + self.sd * np.arange(-12, 13) / 2.0)
        br = np.unique(np.clip(np.concatenate(cuts), lo, hi))
        a, b = br[:-1], br[1:]
        half, mid = 0.5 * (b - a), 0.5 * (a + b)
        x = (mid[:, None] + half[:, None] * _GL_X).ravel()
        w = (half[:, None] * _GL_W).ravel()
        if self.kind == "uniform":
            return x, w / (hi - lo)
        zz = (x - self.mean) / self.sd
        w = w * np.exp(-0.5 * zz * zz) / (self.sd * math.sqrt(2.0 * math.pi))
        return np.concatenate([[lo, hi], x]), np.concatenate([[self.mass_low, self.mass_high], w])


def _data(low: float, high: float, data_sd, data_mean, data_sample) -> _Data:
    """The data assumption from the user's arguments (module docstring)."""
    if data_sample is not None:
        if data_sd is not None or data_mean is not None:
            raise ParameterError("give either data_sample or data_sd (with data_mean), not both")
        a = check_finite_array("data_sample", data_sample, ndim=(1,))
        if a.size < 2 or np.ptp(a) == 0:
            raise ParameterError(f"data_sample must hold at least 2 distinct values, got {a.size} value(s)"
                                 + (" all equal" if a.size >= 2 else ""))
        a = np.clip(a, low, high)
        if np.ptp(a) == 0:
            raise ParameterError(f"data_sample must have at least 2 distinct values inside [low, high] = "
                                 f"[{low}, {high}] after clipping")
        return _Data(low, high, "sample", sample=a)
    if data_sd is None:
        if data_mean is not None:
            raise ParameterError("data_mean needs data_sd (a normal data assumption); got data_sd=None")
        return _Data(low, high, "uniform")
    sd = check_positive("data_sd", data_sd)
    mean = 0.5 * (low + high) if data_mean is None else _as_real("data_mean", data_mean)
    if not math.isfinite(mean):
        raise ParameterError(f"data_mean must be a finite number, got {data_mean!r}")
    return _Data(low, high, "normal", mean=mean, sd=sd)


# ---------------------------------------------------------------------------------------------
# Laplace CDFs
# ---------------------------------------------------------------------------------------------


def _laplace_cdf(u: np.ndarray, b: float) -> np.ndarray:
    """CDF of Laplace(0, b) at u."""
    e = 0.5 * np.exp(-np.abs(u) / b)
    return np.where(u < 0, e, 1.0 - e)


def _laplace_plus_exp_cdf(u: np.ndarray, b: float, b2: float) -> np.ndarray:
    """CDF at u of L + E, L ~ Laplace(0, b) and E ~ Exp(mean b2) independent (b2 < b).

    With α = 1/b, β = 1/b2: ``½β/(α+β)·e^{αu}`` for u < 0, and for u ≥ 0
    ``1 − e^{−βu} − ½β(e^{−βu} − e^{−αu})/(α − β) + ½β e^{−βu}/(α + β)``
    (the difference written with expm1, stable for β close to α).
    """
    al, be = 1.0 / b, 1.0 / b2
    neg = 0.5 * be / (al + be) * np.exp(al * np.minimum(u, 0.0))
    up = np.maximum(u, 0.0)
    eb = np.exp(-be * up)
    diff = np.exp(-al * up) * np.expm1((al - be) * up) / (al - be)  # (e^{−βu} − e^{−αu})/(α − β)
    pos = 1.0 - eb - 0.5 * be * diff + 0.5 * be * eb / (al + be)
    return np.where(u < 0, neg, pos)


# ---------------------------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------------------------


def _check_zil(zero_prob, scale, low, high) -> tuple[float, float, float, float]:
    d = check_open_unit("zero_prob", zero_prob)
    lam = check_positive("scale", scale)
    lo, hi = _as_real("low", low), _as_real("high", high)
    for name, v in (("low", lo), ("high", hi)):
        if not math.isfinite(v):
            raise ParameterError(f"{name} must be a finite number, got {v!r}")
    if not lo < hi:
        raise ParameterError(f"low must be < high, got low={low!r} >= high={high!r}")
    return d, lam, lo, hi


def _check_n(n) -> int:
    """n ≥ 2 reports, an integer (an integral float such as 1e5 is accepted)."""
    if isinstance(n, (bool, np.bool_)):
        raise ParameterError(f"n must be an integer >= 2 (reports per window), got {n!r}")
    if isinstance(n, (float, np.floating)) and math.isfinite(n) and n == int(n):
        n = int(n)
    if not isinstance(n, (int, np.integer)) or n < 2:
        raise ParameterError(f"n must be an integer >= 2 (reports per window), got {n!r}")
    return int(n)


def _check_int(name: str, v, minimum: int) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ParameterError(f"{name} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _as_real(name: str, v) -> float:
    if isinstance(v, (bool, np.bool_)):
        raise ParameterError(f"{name} must be a real number, got {v!r}")
    try:
        out = float(v)
    except (TypeError, ValueError):
        raise ParameterError(f"{name} must be a real number, got {v!r}") from None
    if math.isnan(out):
        raise ParameterError(f"{name} must be a real number, got NaN")
    return out


def _z(level) -> float:
    """Two-sided normal critical value ``z_{(1+level)/2}``."""
    lv = check_open_unit("level", level)
    return float(special.ndtri(0.5 + 0.5 * lv))
