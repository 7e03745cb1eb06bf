"""SDR linear regression from mergeable Gram matrices (docs/mechanisms.md §6.3; closed form of §3.4).

With design ``z = (1, x̃_cov)`` (intercept optional) and response ``ỹ`` — all released ``X̃₁`` values
in original units — the SDR estimate solves::

    (Σ z zᵀ / n − (1−δ) D) β = Σ z ỹ / n,      D = diag(σ_j² on covariates, 0 on the intercept)

with ``σ_j² = (λ·range_j)²``. Noise on the response needs no correction (the squared loss's
Laplacian in y is a constant) and is uncorrelated with the covariate noise (Σ is diagonal).

Sandwich covariance ``V⁻¹ A V⁻¹ / n`` with ``V = Σ z zᵀ/n − (1−δ)D`` and
``A = (1/n) Σ ψ_i ψ_iᵀ``, ``ψ_i = z_i (z_iᵀβ − ỹ_i) − (1−δ) D β``. ``A`` needs fourth moments:
the state keeps, for ``w = (z, ỹ)`` (m = q + 1 entries), ``S2 = Σ w wᵀ`` (m, m) and
``S4 = Σ (w⊗w)(w⊗w)ᵀ`` (m², m²); both are plain sums and merge exactly. ``Σ r_i² z_j z_k`` with
``r = wᵀ(β, −1)`` is then a contraction of ``S4``. At most 20 covariates (S4 has m⁴ entries).
"""

from __future__ import annotations

import numpy as np

from aggregator.errors import ConfigError, StateError
from aggregator.state._fields import numeric_columns, zil_of
from aggregator.state.base import EmptyStateError, Estimate, State, normal_critical

__all__ = ["MAX_COVARIATES", "GramState"]

MAX_COVARIATES = 20


class GramState(State):
    """Gram sums of ``w = (1, x̃_cov, ỹ)`` for the SDR least-squares closed form.

    Parameters
    ----------
    query : LinearRegressionQuery
    schema : TelemetrySchema

    Notes
    -----
    ``params`` = ``("intercept", *covariates)`` (no intercept entry when ``intercept = false``),
    coefficients in original units. ``x2`` is not used. Normal CIs from the sandwich stderr.

    Raises
    ------
    ConfigError
        If a field is not numeric or there are more than ``MAX_COVARIATES`` covariates.
    """

    kinds = ("linear_regression",)

    def __init__(self, query, schema) -> None:
        super().__init__(query, schema)
        q = self.query
        if len(q.covariates) > MAX_COVARIATES:
            raise ConfigError(f"queries.{self.name}.covariates: at most {MAX_COVARIATES} covariates, "
                              f"got {len(q.covariates)}")
        self.cov_cols = numeric_columns(schema, q.covariates, self.name, "covariates")
        self.y_col = int(numeric_columns(schema, [q.response], self.name, "response")[0])
        zil = zil_of(schema, self.name)
        self.zero_prob = float(zil.zero_prob)
        dvec = zil.noise_variance[self.cov_cols]
        self.dvec = np.concatenate([[0.0], dvec]) if q.intercept else np.asarray(dvec, dtype=np.float64)
        self.q = self.dvec.size
        m = self.q + 1
        self.s2 = np.zeros((m, m))
        self.s4 = np.zeros((m * m, m * m))
        self.params = (("intercept",) if q.intercept else ()) + tuple(q.covariates)

    def _w(self, x: np.ndarray) -> np.ndarray:
        parts = [x[:, self.cov_cols], x[:, [self.y_col]]]
        if self.query.intercept:
            parts.insert(0, np.ones((x.shape[0], 1)))
        return np.hstack(parts)

    def _update(self, batch, x2) -> None:
        w = self._w(batch.numeric)
        self.s2 += w.T @ w
        ww = (w[:, :, None] * w[:, None, :]).reshape(w.shape[0], -1)
        self.s4 += ww.T @ ww

    def _merge(self, other: GramState) -> None:
        self.s2 += other.s2
        self.s4 += other.s4

    def coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        """``(β̂ (q,), sandwich covariance (q, q))`` in original units.

        Raises
        ------
        EmptyStateError
            With fewer than q + 1 reports, or if the corrected Gram matrix is singular.
        """
        q, n = self.q, self._n
        self._require_n(q + 1)
        c = 1.0 - self.zero_prob
        V = self.s2[:q, :q] / n - c * np.diag(self.dvec)
        rhs = self.s2[:q, q] / n
        try:
            beta = np.linalg.solve(V, rhs)
            Vinv = np.linalg.inv(V)
        except np.linalg.LinAlgError:
            raise EmptyStateError(f"query {self.name!r}: the corrected Gram matrix is singular "
                                  f"(n={n}); need more varied reports") from None
        b = np.concatenate([beta, [-1.0]])
        m = q + 1
        s4 = self.s4.reshape(m, m, m, m)
        rr_zz = np.einsum("a,c,acjk->jk", b, b, s4)[:q, :q] / n  # (1/n) Σ r² z zᵀ
        mz = (self.s2[:q, :] @ b) / n                             # (1/n) Σ r z
        cd = c * self.dvec * beta
        A = rr_zz - np.outer(mz, cd) - np.outer(cd, mz) + np.outer(cd, cd)
        cov = Vinv @ A @ Vinv.T / n
        return beta, (cov + cov.T) / 2

    def estimate(self) -> Estimate:
        """SDR coefficients with sandwich standard errors and normal CIs.

        Raises
        ------
        EmptyStateError
            See :meth:`coefficients`.
        """
        beta, cov = self.coefficients()
        se = np.sqrt(np.maximum(np.diag(cov), 0.0))
        z = normal_critical(self.query.level)
        if not np.all(np.isfinite(beta)):  # pragma: no cover - guarded by solve
            raise StateError(f"query {self.name!r}: non-finite coefficients")
        return Estimate(self.name, self.params, beta, se, beta - z * se, beta + z * se, self._n,
                        self.query.level, "sdr")

    def _get_data(self) -> dict:
        return {"s2": self.s2, "s4": self.s4}

    def _set_data(self, data: dict) -> None:
        s2, s4 = np.asarray(data["s2"], np.float64), np.asarray(data["s4"], np.float64)
        if s2.shape != self.s2.shape or s4.shape != self.s4.shape:
            raise ValueError(f"Gram sums have shapes {s2.shape}, {s4.shape}; expected "
                             f"{self.s2.shape}, {self.s4.shape}")
        self.s2, self.s4 = s2.copy(), s4.copy()

    def __repr__(self) -> str:
        try:
            return (f"GramState(query={self.name!r}, {self.query.response} ~ "
                    f"{' + '.join(self.query.covariates) or '1'}, n={self._n})")
        except Exception:
            return "<GramState (unprintable)>"
