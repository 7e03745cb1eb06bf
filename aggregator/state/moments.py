"""Mean and variance of a numeric field from mergeable moments of X̃₁ and X̃₂
(docs/mechanisms.md §6.1; closed forms §3.1, §3.3).

The state keeps, for the per-report vector ``z = (X̃₁, X̃₂, X̃₁², X̃₂²)`` of the query's field, the
count ``n``, the mean ``z̄`` (4,) and the co-moment matrix ``C = Σ (z − z̄)(z − z̄)ᵀ`` (4, 4),
combined across batches and partitions with the parallel algorithm of Chan, Golub & LeVeque
(1979): ``z̄ = z̄_a + Δ n_b/n``, ``C = C_a + C_b + ΔΔᵀ n_a n_b / n`` with ``Δ = z̄_b − z̄_a``.

Estimators (σ² = λ²·range², the field's SL noise variance in original units; δ = zero_prob):

========  ===============================  ==============================================
          mean                             variance
========  ===============================  ==============================================
sdr       mean X̃₁                          mean X̃₁² − (1−δ)σ² − (mean X̃₁)²
naive     mean X̃₁  (= sdr for the mean)     mean X̃₁² − (mean X̃₁)²  (biased by (1−δ)σ²)
sl        mean X̃₂                          mean X̃₂² − σ² − (mean X̃₂)²
dr        μ = [mean X̃₁ − (1−δ) mean X̃₂]/δ   [mean X̃₁² − (1−δ) mean X̃₂²]/δ − μ²
========  ===============================  ==============================================

Standard errors by the delta method, ``se² = gᵀ Σ̂ g`` with ``Σ̂ = C/((n−1)n)`` and ``g`` the
gradient of the estimator in ``z̄``; CIs are normal ``value ± z_{(1+level)/2}·se``. With a single
report the stderr is ``inf``. The variance estimate is unbiased up to O(1/n) and is not clipped at 0.
"""

from __future__ import annotations

import numpy as np

from aggregator.state import _kernels
from aggregator.state._fields import numeric_columns, zil_of
from aggregator.state.base import Estimate, State, normal_critical

__all__ = ["MomentsState", "chan_merge"]


def chan_merge(na: int, mean_a: np.ndarray, c_a: np.ndarray, nb: int, mean_b: np.ndarray,
               c_b: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """Combine (count, mean (p,), co-moment (p, p)) of two disjoint samples (Chan et al. 1979).

    Returns
    -------
    n : int
    mean : ndarray (p,)
    comoment : ndarray (p, p)
    """
    n = na + nb
    if na == 0:
        return nb, mean_b.copy(), c_b.copy()
    if nb == 0:
        return na, mean_a.copy(), c_a.copy()
    delta = mean_b - mean_a
    mean = mean_a + delta * (nb / n)
    comoment = c_a + c_b + np.outer(delta, delta) * (na * nb / n)
    return n, mean, comoment


class MomentsState(State):
    """Mergeable first and second moments of ``X̃₁`` and ``X̃₂`` of one numeric field.

    Serves ``mean`` and ``variance`` queries with estimators sdr | dr | sl | naive (see the
    module docstring for the formulas).

    Parameters
    ----------
    query : MeanQuery or VarianceQuery
    schema : TelemetrySchema

    Notes
    -----
    ``update`` needs ``x2`` for the dr and sl estimators; for sdr and naive ``x2`` may be
    ``None`` (the X̃₂ moments are then not tracked — filled with X̃₁).

    Raises
    ------
    ConfigError
        If the field is not numeric.
    """

    kinds = ("mean", "variance")

    def __init__(self, query, schema) -> None:
        super().__init__(query, schema)
        self.col = int(numeric_columns(schema, [self.query.field], self.name)[0])
        zil = zil_of(schema, self.name)
        self.zero_prob = float(zil.zero_prob)
        self.noise_var = float(zil.noise_variance[self.col])
        self.mean = np.zeros(4)
        self.comoment = np.zeros((4, 4))
        self.params = (self.query.kind,)
        _kernels.warm()

    def empty_copy(self) -> MomentsState:
        """An empty state of the same query (its moments zero)."""
        out = self._shallow()
        out.mean, out.comoment = np.zeros(4), np.zeros((4, 4))
        return out

    def _update(self, batch, x2) -> None:
        a = batch.numeric[:, self.col]
        if self.query.estimator in ("dr", "sl"):
            b = self._require_x2(x2)[:, self.col]
        else:
            b = a if x2 is None else x2[:, self.col]
        mb, cb = _kernels.moments_batch(a, b)  # mean and centred cross-products of (a, b, a², b²)
        _, self.mean, self.comoment = chan_merge(self._n, self.mean, self.comoment, a.shape[0], mb, cb)

    def _merge(self, other: MomentsState) -> None:
        _, self.mean, self.comoment = chan_merge(self._n, self.mean, self.comoment,
                                                 other._n, other.mean, other.comoment)

    def _value_grad(self) -> tuple[float, np.ndarray]:
        m1, m2, s1, s2 = self.mean
        dl, sv = self.zero_prob, self.noise_var
        est = self.query.estimator
        if self.query.kind == "mean":
            if est in ("sdr", "naive"):
                return m1, np.array([1.0, 0, 0, 0])
            if est == "sl":
                return m2, np.array([0, 1.0, 0, 0])
            return (m1 - (1 - dl) * m2) / dl, np.array([1 / dl, -(1 - dl) / dl, 0, 0])
        # variance
        if est == "sdr":
            return s1 - (1 - dl) * sv - m1 * m1, np.array([-2 * m1, 0, 1.0, 0])
        if est == "naive":
            return s1 - m1 * m1, np.array([-2 * m1, 0, 1.0, 0])
        if est == "sl":
            return s2 - sv - m2 * m2, np.array([0, -2 * m2, 0, 1.0])
        mu = (m1 - (1 - dl) * m2) / dl
        dmu = np.array([1 / dl, -(1 - dl) / dl, 0, 0])
        second = (s1 - (1 - dl) * s2) / dl
        return second - mu * mu, np.array([0, 0, 1 / dl, -(1 - dl) / dl]) - 2 * mu * dmu

    def estimate(self) -> Estimate:
        """The mean or variance of the field in original units (squared units for variance).

        Raises
        ------
        EmptyStateError
            With no report.
        """
        self._require_n(1)
        value, g = self._value_grad()
        n = self._n
        if n > 1:
            cov = self.comoment / ((n - 1) * n)
            se = float(np.sqrt(max(float(g @ cov @ g), 0.0)))
        else:
            se = float("inf")
        z = normal_critical(self.query.level)
        return Estimate(self.name, self.params, [value], [se], [value - z * se], [value + z * se],
                        n, self.query.level, self.query.estimator)

    def _get_data(self) -> dict:
        return {"mean": self.mean, "comoment": self.comoment}

    def _set_data(self, data: dict) -> None:
        mean = np.asarray(data["mean"], dtype=np.float64)
        com = np.asarray(data["comoment"], dtype=np.float64)
        if mean.shape != (4,) or com.shape != (4, 4):
            raise ValueError(f"moments have shapes {mean.shape}, {com.shape}; expected (4,), (4, 4)")
        self.mean, self.comoment = mean, com

    def __repr__(self) -> str:
        try:
            return (f"MomentsState(query={self.name!r}, {self.query.kind}({self.query.field}), "
                    f"estimator={self.query.estimator}, n={self._n}, mean_x1={self.mean[0]:.6g})")
        except Exception:
            return "<MomentsState (unprintable)>"
