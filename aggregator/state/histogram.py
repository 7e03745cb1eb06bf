"""DR CDF and quantiles of a numeric field from mergeable histograms (docs/mechanisms.md §6.2).

The state keeps three integer histograms over fixed edges ``e_0 = low < … < e_B = high`` of the
field (``B = query.bins``), each with an underflow (``x ≤ low``) and an overflow (``x > high``)
cell: of ``X̃₁``, of ``X̃₂`` and of ``max(X̃₁, X̃₂)``. Counts merge exactly.

At the edges the empirical CDFs are ``F̂₁``, ``F̂₂`` and ``F̂_max(t) = #{X̃₁ ≤ t and X̃₂ ≤ t}/n``;

* DR CDF (unbiased): ``F̂(t) = [F̂₁(t) − (1−δ) F̂₂(t)] / δ``, with ``F̂(high) := 1`` (the data are
  clipped into the box), made monotone by isotonic (PAVA) regression on the edge grid and clipped
  to [0, 1];
* quantile ``ξ̂_q``: the point where the monotone CDF, interpolated linearly between edges,
  first reaches ``q`` (exact to within one bin width of the unbinned DR quantile);
* variance of the DR CDF: per report ``g(t) = [1{X̃₁ ≤ t} − (1−δ) 1{X̃₂ ≤ t}]/δ`` has
  ``E g² = [F₁ + (1−δ)² F₂ − 2(1−δ) F_max]/δ²``, so ``Var F̂(t) = (E g² − F(t)²)/n`` —
  the ``max`` histogram gives the cross term exactly;
* interval and stderr (Woodruff 1952): ``[F̃⁻¹(q − z·s), F̃⁻¹(q + z·s)]`` with ``s = sd F̂(ξ̂_q)``
  and ``z = z_{(1+level)/2}``. This is the Bahadur interval ``ξ̂ ± z·s/f̂(ξ̂)`` with the density
  estimated by the difference quotient ``f̂ = 2z·s / (ci_high − ci_low)`` of the DR CDF, so the
  reported ``stderr = s / f̂ = (ci_high − ci_low)/(2z)``. It needs no bandwidth and its coverage is
  checked by simulation in ``tests/aggregator/test_state_stats.py``. The limits are rounded
  outwards to the edges of their bins: a histogram cannot place mass within a bin, and with
  discrete data (integer minutes) an interpolated limit would sit strictly inside the bin of the
  atom that *is* the quantile and exclude it.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import isotonic_regression

from aggregator.state import _kernels
from aggregator.state._fields import numeric_columns, zil_of
from aggregator.state.base import Estimate, State, normal_critical

__all__ = ["HistogramState", "dr_cdf_from_counts", "quantile_from_cdf"]


def dr_cdf_from_counts(c1: np.ndarray, c2: np.ndarray, zero_prob: float) -> tuple[np.ndarray, np.ndarray]:
    """Raw and monotone DR CDF at the ``B + 1`` edges from two ``(B + 2,)`` histograms.

    Returns
    -------
    raw : ndarray (B + 1,)
        ``[F̂₁ − (1−δ)F̂₂]/δ`` (last entry forced to 1).
    monotone : ndarray (B + 1,)
        Isotonic regression of ``raw`` clipped to [0, 1].
    """
    n = c1.sum()
    f1 = np.cumsum(c1)[:-1] / n
    f2 = np.cumsum(c2)[:-1] / n
    raw = (f1 - (1.0 - zero_prob) * f2) / zero_prob
    raw[-1] = 1.0
    mono = np.clip(isotonic_regression(raw).x, 0.0, 1.0)
    return raw, mono


def quantile_from_cdf(edges: np.ndarray, cdf: np.ndarray, q) -> np.ndarray:
    """Generalized inverse of a monotone CDF given at ``edges``, linear between edges.

    Parameters
    ----------
    edges : ndarray (m,)
    cdf : ndarray (m,), non-decreasing, ``cdf[-1] == 1``
    q : array of probabilities in [0, 1]

    Returns
    -------
    ndarray, shape of ``q``: the smallest ``t`` with ``cdf(t) ≥ q`` (``edges[0]`` for
    ``q ≤ cdf[0]``).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.searchsorted(cdf, q, side="left")  # first index with cdf[k] >= q
    k = np.clip(k, 0, edges.size - 1)
    prev = np.clip(k - 1, 0, edges.size - 1)
    lo_f, hi_f = cdf[prev], cdf[k]
    span = hi_f - lo_f
    frac = np.where(span > 0, (q - lo_f) / np.where(span > 0, span, 1.0), 1.0)
    t = edges[prev] + np.clip(frac, 0.0, 1.0) * (edges[k] - edges[prev])
    return np.where(k == 0, edges[0], t)


def quantile_bin(edges: np.ndarray, cdf: np.ndarray, q) -> tuple[np.ndarray, np.ndarray]:
    """Edges ``(left, right)`` of the histogram bin that holds the ``q``-quantile.

    The histogram cannot place mass within a bin, so an interval endpoint is only known to a
    bin: confidence limits are rounded outwards to these edges (an atom of the data, e.g.
    integer minutes, sits somewhere inside its bin).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.clip(np.searchsorted(cdf, q, side="left"), 0, edges.size - 1)
    return edges[np.clip(k - 1, 0, edges.size - 1)], edges[k]


class HistogramState(State):
    """Histograms of ``X̃₁``, ``X̃₂`` and ``max(X̃₁, X̃₂)`` of one numeric field → DR quantiles.

    Parameters
    ----------
    query : QuantilesQuery
        ``q`` (probabilities), ``bins`` (histogram resolution over [low, high]).
    schema : TelemetrySchema

    Notes
    -----
    ``params`` are ``"q0.5"``, ``"q0.9"``, …; values in the field's original units. ``update``
    requires ``x2``. See the module docstring for the estimator, its variance and the interval.

    Raises
    ------
    ConfigError
        If the field is not numeric.
    """

    kinds = ("quantiles",)

    def __init__(self, query, schema) -> None:
        super().__init__(query, schema)
        self.col = int(numeric_columns(schema, [self.query.field], self.name)[0])
        zil = zil_of(schema, self.name)
        self.zero_prob = float(zil.zero_prob)
        self.low, self.high = float(zil.low[self.col]), float(zil.high[self.col])
        self.edges = np.linspace(self.low, self.high, self.query.bins + 1)
        # edges padded with ∓inf, for the one-step correction of the arithmetic bin index
        self._pad = np.concatenate([[-np.inf], self.edges, [np.inf]])
        self._inv_w = self.query.bins / (self.high - self.low)
        _kernels.warm()
        size = self.query.bins + 2
        self.c1 = np.zeros(size, np.int64)
        self.c2 = np.zeros(size, np.int64)
        self.cmax = np.zeros(size, np.int64)
        self.params = tuple(f"q{p:g}" for p in self.query.q)

    def _update(self, batch, x2) -> None:
        a = batch.numeric[:, self.col]
        b = self._require_x2(x2)[:, self.col]
        # one searchsorted and one bincount for the three histograms (X̃₁, X̃₂, max)
        _kernels.histogram3(a, b, float(self.edges[0]), self._inv_w, self._pad, self.c1, self.c2, self.cmax)

    def _merge(self, other: HistogramState) -> None:
        self.c1 += other.c1
        self.c2 += other.c2
        self.cmax += other.cmax

    def cdf(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(edges, raw DR CDF, monotone DR CDF)`` at the ``bins + 1`` edges.

        Raises
        ------
        EmptyStateError
            With no report.
        """
        self._require_n(1)
        raw, mono = dr_cdf_from_counts(self.c1, self.c2, self.zero_prob)
        return self.edges.copy(), raw, mono

    def cdf_variance(self) -> np.ndarray:
        """Per-report variance of the DR CDF term ``g(t)`` at the edges, shape (bins + 1,)."""
        n = self._n
        d = self.zero_prob
        f1 = np.cumsum(self.c1)[:-1] / n
        f2 = np.cumsum(self.c2)[:-1] / n
        fm = np.cumsum(self.cmax)[:-1] / n
        f = (f1 - (1 - d) * f2) / d
        eg2 = (f1 + (1 - d) ** 2 * f2 - 2 * (1 - d) * fm) / d**2
        return np.maximum(eg2 - f * f, 0.0)

    def estimate(self) -> Estimate:
        """DR quantiles with Woodruff intervals (see the module docstring).

        Raises
        ------
        EmptyStateError
            With no report.
        """
        edges, _, mono = self.cdf()
        q = np.asarray(self.query.q)
        value = quantile_from_cdf(edges, mono, q)
        var_g = np.interp(value, edges, self.cdf_variance())
        s = np.sqrt(var_g / self._n)
        z = normal_critical(self.query.level)
        # Woodruff limits, rounded outwards to bin edges (within-bin position is unknown)
        lo = quantile_bin(edges, mono, np.clip(q - z * s, 0.0, 1.0))[0]
        hi = quantile_bin(edges, mono, np.clip(q + z * s, 0.0, 1.0))[1]
        se = (hi - lo) / (2 * z)
        return Estimate(self.name, self.params, value, se, lo, hi, self._n, self.query.level, "dr")

    def _get_data(self) -> dict:
        return {"c1": self.c1, "c2": self.c2, "cmax": self.cmax}

    def _set_data(self, data: dict) -> None:
        for key in ("c1", "c2", "cmax"):
            arr = np.asarray(data[key], dtype=np.int64)
            if arr.shape != self.c1.shape:
                raise ValueError(f"histogram {key} has shape {arr.shape}, expected {self.c1.shape}")
            setattr(self, key, arr.copy())

    def __repr__(self) -> str:
        try:
            return (f"HistogramState(query={self.name!r}, field={self.query.field!r}, "
                    f"q={list(self.query.q)}, bins={self.query.bins}, n={self._n})")
        except Exception:
            return "<HistogramState (unprintable)>"
