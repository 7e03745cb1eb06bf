"""The state of ``kmeans`` and ``gaussian_mixture`` queries: renewable estimation of the DR k-means
risk or of a mixture likelihood, with components matched across partitions (docs/mechanisms.md
§7.6).

Everything :mod:`aggregator.state.renewable` does — a warm-up batch fit per partition
(:func:`mechanisms.estimation.m_estimate` with the loss's own fit: DR-Lloyd, DR-EM or the
report likelihood), renewal by blocks of ``batch_size`` reports cut in offset order, exact
pooling — applies; on top:

* **coordinates** — the fields are box-standardized, ``u = (x − mid)/half`` with ``mid``,
  ``half`` the centre and half-width of the schema bounds (the SL noise standard deviation there
  is ``2λ`` in every field);
* **merge** — another partition's components are matched to this state's (Hungarian matching of
  the centres, :func:`mechanisms.mixtures.components.match_components`) and its θ, H and A
  permuted before pooling, so labels never switch;
* **renewal** — DR and naive k-means renew compiled (:mod:`aggregator.state._kmeans_kernel`, the
  same steps as the Python path, which Gaussian mixtures take);
* **estimate** — components ascending by the first field's centre, original units (delta method
  for weights and variances), and the components the data do not determine named in
  ``Estimate.notes`` with infinite standard errors
  (:func:`mechanisms.mixtures.fit.unidentified_components`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from aggregator.errors import ConfigError, StateError
from aggregator.state._fields import numeric_columns
from aggregator.state.base import Estimate, normal_critical
from aggregator.state.renewable import RenewableState

__all__ = ["MixtureState"]


class MixtureState(RenewableState):
    """k-means centres or a diagonal Gaussian mixture of numeric fields (module docstring).

    Parameters
    ----------
    query : KMeansQuery or GaussianMixtureQuery
    schema : TelemetrySchema

    Notes
    -----
    ``params`` are :func:`mechanisms.mixtures.fit.parameter_names`. ``update`` needs ``x2`` for
    the DR estimators (not for ``deconvolution`` and ``naive``).

    Raises
    ------
    ConfigError
        Unknown or non-numeric fields.
    """

    kinds = ("kmeans", "gaussian_mixture")

    def _setup(self, q, zil, loss):
        from mechanisms.mixtures.fit import mixture_loss, parameter_names

        if loss is not None:
            raise ConfigError(f"queries.{self.name}: a loss object is only for custom queries, "
                              f"not {q.kind!r}")
        self.cols = numeric_columns(self.schema, q.fields, self.name, "fields")
        low = np.asarray(zil.low, dtype=np.float64)[self.cols]
        high = np.asarray(zil.high, dtype=np.float64)[self.cols]
        self.shift, self.scale = (low + high) / 2.0, (high - low) / 2.0
        p = self.cols.size
        self.loss, method = mixture_loss(q.kind, q.estimator, q.k, p, zero_prob=self.zero_prob,
                                         noise_var=np.full(p, (2.0 * float(zil.scale)) ** 2))
        self.params = parameter_names(q.kind, q.k, q.fields)
        return None, None, method

    def _kernel_spec(self) -> tuple | None:
        """``(w₁, w₂, box_low, box_high)`` of the compiled k-means renewal
        (:mod:`aggregator.state._kmeans_kernel`) for DR or naive k-means, else None (mixtures
        renew on the Python path)."""
        from mechanisms.mixtures.kmeans import KMeansLoss, corrected_weights

        if not isinstance(self.loss, KMeansLoss) or self.closs.method not in ("dr", "naive"):
            return None
        from aggregator.state import _kmeans_kernel as kk

        w1, w2 = corrected_weights(self.closs)
        p = self.cols.size
        lo, hi = self.loss.box if self.loss.box is not None else (np.full(p, -np.inf), np.full(p, np.inf))
        kk.warm()
        return float(w1), float(w2), np.asarray(lo, np.float64).copy(), np.asarray(hi, np.float64).copy()

    def _kernel_uses_x2(self) -> bool:
        return self._kernel[1] != 0.0

    def _run_kernel(self, ub1, x1, ub2, x2, block: int, full: int, theta, H, A, sc, spread: float) -> None:
        from aggregator.state._kmeans_kernel import renew_kmeans_blocks
        from mechanisms import renewable as rn

        w1, w2, lo, hi = self._kernel
        renew_kmeans_blocks(ub1, x1, ub2, x2, self.cols.astype(np.int64), np.asarray(self.shift, np.float64),
                            np.asarray(self.scale, np.float64), int(self.loss.k), w1, w2, lo, hi, block, full,
                            theta, H, A, sc, spread, rn.BANDWIDTH_C, rn.BANDWIDTH_POWER)

    def _aligned(self, fit):
        from mechanisms.mixtures.components import match_components, permute_fit

        perm = match_components(self.loss.centres(self.fit.theta), self.loss.centres(fit.theta))
        theta, H, A = permute_fit(perm, self.loss.widths, fit.theta, fit.H, fit.A)
        return replace(fit, theta=theta, H=H, A=A)

    def estimate(self) -> Estimate:
        """Components in canonical order, original units, Wald intervals from ``H⁻¹AH⁻¹``.

        Returns
        -------
        Estimate
            ``notes`` names every component the data do not determine (its parameters have an
            infinite ``stderr``).

        Raises
        ------
        EmptyStateError
            Too few reports, or no finite fit yet.
        StateError
            The estimate is not finite.
        """
        from mechanisms.mixtures.fit import present, unidentified_components

        fit = self.current_fit()
        with np.errstate(all="ignore"):
            cov = fit.cov()
        bad = unidentified_components(self.loss, fit.theta, fit.H, fit.n)
        if not np.all(np.isfinite(cov)):
            for j in range(self.loss.k):
                bad.setdefault(j, "its covariance is not finite")
        value, cov_out, bad = present(self.loss, fit.theta, np.where(np.isfinite(cov), cov, 0.0),
                                      self.shift, self.scale, bad)
        if not np.all(np.isfinite(value)):
            raise StateError(f"query {self.name!r}: the estimate from {self._n} reports is not finite")
        var = np.diag(cov_out)
        se = np.where(np.isinf(var), np.inf, np.sqrt(np.maximum(var, np.finfo(float).tiny)))
        half = normal_critical(self.query.level) * se
        notes = tuple(f"component {j}: {why}" for j, why in sorted(bad.items()))
        return Estimate(self.name, self.params, value, se, value - half, value + half, self._n,
                        self.query.level, self.query.estimator, notes)

    def __repr__(self) -> str:
        try:
            return (f"MixtureState(query={self.name!r}, kind={self.query.kind}, k={self.query.k}, "
                    f"estimator={self.query.estimator}, n={self._n}, "
                    f"fitted={0 if self.fit is None else self.fit.n}, buffered={self.buf1.shape[0]})")
        except Exception:
            return "<MixtureState (unprintable)>"
