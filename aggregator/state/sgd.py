"""Online averaged SGD on a corrected gradient, with random-scaling confidence intervals.

Serves ``logistic_regression``, ``quantile_regression`` and ``custom`` queries (DESIGN §5).

Algorithm (Polyak–Ruppert averaged SGD; Lee, Liao, Seo & Shin 2022, "Fast and robust online
inference with stochastic gradient descent via random scaling", AAAI):

* reports are grouped into mini-batches of ``sgd.batch_size`` (a remainder is buffered in the
  state until the next update); step ``t`` moves ``θ ← θ − γ_t ĝ_t`` with ``γ_t = γ₀ t^(−a)`` and
  ``ĝ_t`` the mean DR/SDR corrected gradient of the mini-batch (``mechanisms.corrected``);
* the estimate is the running average ``θ̄_s`` of the iterates after ``burn_in`` steps;
* random scaling: ``V̂ = s⁻² Σ_{r≤s} r² (θ̄_r − θ̄_s)(θ̄_r − θ̄_s)ᵀ`` from the O(q²) running sums
  ``Σ r² θ̄_r θ̄_rᵀ``, ``Σ r² θ̄_r`` and ``Σ r²``; the interval is ``θ̄_j ± c_level·sqrt(V̂_jj/s)``
  with ``c_0.95 = 6.747`` (the 97.5 % point of ``|W(1)| / sqrt(∫(W(r) − rW(1))² dr)``; other levels
  from :data:`RS_CRITICAL`, simulated). ``stderr`` is reported as half-width / z_{(1+level)/2}, so
  that ``value ± z·stderr`` is the same interval.

Coordinates: for regression queries the fields are standardized by the schema bounds,
``u = (x − mid)/(range/2) ∈ [−1, 1]`` (``mid`` = centre of the box; scale only, no shift, without
an intercept) for stable, well-conditioned steps; the SL noise variance there is ``(2λ)²``.
Estimates are mapped back to original units
(``β = M θ + a``, covariance ``M V̂ Mᵀ``). Custom losses run in original units with
``σ_j² = (λ·range_j)²``.

Merging partitions: a state keeps the summaries ``(θ̄, V̂, s, n)`` of the runs merged into it
and combines them with its own by per-coordinate inverse-variance weighting
``θ = Σ_k w_k θ_k / Σ_k w_k``, ``w_k = s_k / V̂_k,jj``, with the interval ``θ ± c·(Σ w_k)^(−1/2)``
(an approximation: each component is a random-scaling t-ratio, the combination is not exactly).
Unlike sufficient statistics, an SGD merge is **not** bit-identical to (nor statistically the
same as) one pass over all reports; it agrees to within sampling error.
"""

from __future__ import annotations

import logging

import numpy as np

from aggregator.config import load_custom_loss
from aggregator.errors import ConfigError, StateError
from aggregator.state._fields import numeric_columns, zil_of
from aggregator.state.base import EmptyStateError, Estimate, State, normal_critical

__all__ = ["DEFAULT_STEP0", "RS_CRITICAL", "SGDState", "rs_critical"]

log = logging.getLogger(__name__)

#: γ₀ by query kind when ``sgd.step0`` is not given (standardized coordinates; logistic losses
#: have small curvature there, p(1−p)·E u² ≈ 0.05, so they need a larger step).
DEFAULT_STEP0 = {"logistic_regression": 10.0, "quantile_regression": 2.0, "custom": 0.5}

#: Two-sided critical values of the random-scaling t-ratio by confidence level: 0.95 from
#: Lee et al. (2022) / Abadir & Paruolo (1997); the others from 2·10⁵ simulated Brownian paths
#: on a 2000-point grid (the simulation gives 6.731 at 0.95).
RS_CRITICAL = {
    0.5: 1.858, 0.6: 2.367, 0.7: 3.003, 0.8: 3.868, 0.85: 4.475, 0.9: 5.314,
    0.95: 6.747, 0.975: 8.114, 0.99: 9.933, 0.995: 11.325, 0.999: 14.641,
}


def rs_critical(level: float) -> float:
    """Random-scaling critical value at ``level`` (interpolated in :data:`RS_CRITICAL`).

    Raises
    ------
    ConfigError
        If ``level`` is outside [0.5, 0.999].
    """
    keys = np.array(sorted(RS_CRITICAL))
    if not keys[0] <= level <= keys[-1]:
        raise ConfigError(f"level must be in [0.5, 0.999] for random-scaling intervals, got {level}")
    return float(np.interp(level, keys, [RS_CRITICAL[k] for k in keys]))


def _noised_label_logistic():
    from mechanisms.losses import LogisticLoss

    class _LinearLabelLogistic(LogisticLoss):
        """Logistic loss whose (noised) label column enters linearly: ∂²ℓ/∂y² = 0."""

        _label_may_be_noised = True

        def _check_labels(self, y, name):
            return None

        def _phi_yy(self, eta, y):
            return np.zeros(eta.shape)

        def _phi_yye(self, eta, y):
            return np.zeros(eta.shape)

    return _LinearLabelLogistic


class SGDState(State):
    """Averaged SGD with random-scaling CIs on the DR/SDR corrected gradient.

    Parameters
    ----------
    query : LogisticRegressionQuery, QuantileRegressionQuery or CustomQuery
    schema : TelemetrySchema

    Notes
    -----
    ``update`` needs ``x2`` for dr/sdr/sl. ``params``: ``("intercept", *covariates)`` for
    regressions, ``query.params`` or ``theta0 …`` for custom losses. See the module docstring.

    Raises
    ------
    ConfigError
        Unknown/non-numeric fields, a loss that does not fit the estimator, a level above 0.999.
    """

    kinds = ("logistic_regression", "quantile_regression", "custom")

    def __init__(self, query, schema) -> None:
        super().__init__(query, schema)
        from mechanisms.corrected import corrected_loss
        from mechanisms.errors import ParameterError

        q = self.query
        zil = zil_of(schema, self.name)
        self.zero_prob = float(zil.zero_prob)
        self.crit = rs_critical(q.level)
        self.opts = q.sgd
        self.step0 = q.sgd.step0 if q.sgd.step0 is not None else DEFAULT_STEP0[q.kind]
        if q.kind == "custom":
            self.cols = numeric_columns(schema, q.fields, self.name, "fields")
            self.loss = load_custom_loss(q.loss, key=f"queries.{self.name}.loss")
            self.shift = np.zeros(self.cols.size)
            self.scale = np.ones(self.cols.size)
            noise_var = zil.noise_variance[self.cols][list(self.loss.noised)]
            p = self.loss.n_params(self.cols.size)
            self.params = q.params or tuple(f"theta{i}" for i in range(p))
            if len(self.params) != p:
                raise ConfigError(f"queries.{self.name}.params: the loss has {p} parameters, "
                                  f"got {len(self.params)} names")
            init = np.zeros(p) if q.init is None else np.asarray(q.init, dtype=np.float64)
            if init.shape != (p,):
                raise ConfigError(f"queries.{self.name}.init: must have {p} entries, got {init.size}")
            self.M, self.a = np.eye(p), np.zeros(p)
        else:
            from mechanisms.losses import QuantileRegressionLoss

            ycol_name = q.label if q.kind == "logistic_regression" else q.response
            self.cols = np.concatenate([
                numeric_columns(schema, q.covariates, self.name, "covariates"),
                numeric_columns(schema, [ycol_name], self.name,
                                "label" if q.kind == "logistic_regression" else "response"),
            ])
            k = len(q.covariates)
            # centre on the box midpoint and scale to [-1, 1]: a well-conditioned design
            self.scale = zil.ranges[self.cols].astype(np.float64) / 2.0
            mid = (zil.low[self.cols] + zil.high[self.cols]) / 2.0
            self.shift = mid.astype(np.float64) if q.intercept else np.zeros(k + 1)
            noise_var = np.full(k + 1, (2.0 * zil.scale) ** 2)
            common = dict(intercept=q.intercept, covariates=tuple(range(k)))
            if q.kind == "logistic_regression":
                if q.threshold is not None:
                    t_u = (q.threshold - self.shift[k]) / self.scale[k]
                    from mechanisms.losses import LogisticLoss

                    self.loss = LogisticLoss(noised=tuple(range(k)), label=_Threshold(k, t_u), **common)
                    noise_var = noise_var[:k]
                else:
                    self.shift[k], self.scale[k] = 0.0, 1.0  # the label is used as is (0/1 scale)
                    self.loss = _noised_label_logistic()(noised=tuple(range(k + 1)), **common)
                yscale, yshift = 1.0, 0.0
            else:
                self.loss = QuantileRegressionLoss(tau=q.tau, noised=tuple(range(k + 1)), **common)
                yscale, yshift = self.scale[k], self.shift[k]
            self.params = (("intercept",) if q.intercept else ()) + tuple(q.covariates)
            p = len(self.params)
            # η_u = θ0 + Σ θ_j (x_j − shift_j)/scale_j ; response y = yshift + yscale·η_u
            M = np.zeros((p, p))
            a = np.zeros(p)
            off = 1 if q.intercept else 0
            for j in range(k):
                M[off + j, off + j] = yscale / self.scale[j]
                if q.intercept:
                    M[0, off + j] = -yscale * self.shift[j] / self.scale[j]
            if q.intercept:
                M[0, 0] = yscale
                a[0] = yshift
            self.M, self.a = M, a
            init = np.zeros(p)
        method = q.estimator
        try:
            self.closs = corrected_loss(self.loss, method, self.zero_prob,
                                        noise_var if method in ("sdr", "sl") else None)
        except ParameterError as exc:
            raise ConfigError(f"queries.{self.name}.estimator: {exc}") from None
        p = len(self.params)
        self.theta = init.astype(np.float64).copy()
        self.t = 0
        self.s = 0
        self.avg = np.zeros(p)
        self.rs_a = np.zeros((p, p))
        self.rs_b = np.zeros(p)
        self.rs_c = 0.0
        self.buf1 = np.zeros((0, self.cols.size))
        self.buf2 = np.zeros((0, self.cols.size))
        self.comp_theta = np.zeros((0, p))
        self.comp_v = np.zeros((0, p, p))
        self.comp_s = np.zeros(0)

    # ------------------------------------------------------------------ streaming
    def _std(self, x: np.ndarray) -> np.ndarray:
        return (x[:, self.cols] - self.shift) / self.scale

    def _update(self, batch, x2) -> None:
        need_x2 = self.closs.needs_x2
        u1 = self._std(batch.numeric)
        u2 = self._std(self._require_x2(x2)) if need_x2 else u1
        if self.buf1.shape[0]:
            u1 = np.vstack([self.buf1, u1])
            u2 = np.vstack([self.buf2, u2]) if need_x2 else u1
        B = self.opts.batch_size
        full = (u1.shape[0] // B) * B
        g0, a_pow, burn = self.step0, self.opts.step_power, self.opts.burn_in
        grad = self.closs.grad
        theta, avg = self.theta, self.avg
        for start in range(0, full, B):
            g = grad(u1[start:start + B], u2[start:start + B], theta).mean(axis=0)
            self.t += 1
            theta = theta - g0 * self.t ** (-a_pow) * g
            if self.t > burn:
                self.s += 1
                s = self.s
                avg = avg + (theta - avg) / s
                s2 = float(s) * s
                self.rs_a += s2 * np.outer(avg, avg)
                self.rs_b += s2 * avg
                self.rs_c += s2
        if not np.all(np.isfinite(theta)):
            raise StateError(f"query {self.name!r}: SGD diverged (non-finite iterate at step {self.t}); "
                             "lower sgd.step0")
        self.theta, self.avg = theta, avg
        self.buf1 = u1[full:].copy()
        self.buf2 = u2[full:].copy() if need_x2 else self.buf1

    def _own_summary(self) -> tuple[np.ndarray, np.ndarray, int] | None:
        if self.s < 2:
            return None
        s = self.s
        av = self.avg
        V = (self.rs_a - np.outer(av, self.rs_b) - np.outer(self.rs_b, av) + self.rs_c * np.outer(av, av))
        return av.copy(), (V + V.T) / (2.0 * s * s), s

    def _merge(self, other: SGDState) -> None:
        th, vv, ss = [self.comp_theta], [self.comp_v], [self.comp_s]
        own = other._own_summary()
        if own is not None:
            th.append(own[0][None])
            vv.append(own[1][None])
            ss.append(np.array([own[2]], dtype=np.float64))
        th.append(other.comp_theta)
        vv.append(other.comp_v)
        ss.append(other.comp_s)
        self.comp_theta = np.concatenate(th)
        self.comp_v = np.concatenate(vv)
        self.comp_s = np.concatenate(ss)

    # ------------------------------------------------------------------ estimate
    def estimate(self) -> Estimate:
        """Averaged-SGD estimate (original units) with random-scaling intervals.

        Raises
        ------
        EmptyStateError
            If fewer than two averaged SGD steps have been taken (in every merged component).
        """
        comps = []
        own = self._own_summary()
        if own is not None:
            comps.append(own)
        comps += [(self.comp_theta[i], self.comp_v[i], self.comp_s[i]) for i in range(self.comp_s.size)]
        if not comps:
            raise EmptyStateError(
                f"query {self.name!r} has taken {self.s} averaged SGD step(s) ({self._n} reports, "
                f"batch_size {self.opts.batch_size}); an estimate needs at least 2")
        vals, var = [], []
        for theta, V, s in comps:
            vals.append(self.M @ theta + self.a)
            var.append(np.diag(self.M @ V @ self.M.T) / s)
        vals, var = np.array(vals), np.array(var)
        if np.any(var <= 0):
            var = np.maximum(var, np.finfo(float).tiny)
        w = 1.0 / var
        value = (w * vals).sum(axis=0) / w.sum(axis=0)
        half = self.crit * np.sqrt(1.0 / w.sum(axis=0))
        se = half / normal_critical(self.query.level)
        return Estimate(self.name, self.params, value, se, value - half, value + half, self._n,
                        self.query.level, self.query.estimator)

    # ------------------------------------------------------------------ serialization
    def _get_data(self) -> dict:
        return {
            "theta": self.theta, "t": self.t, "s": self.s, "avg": self.avg,
            "rs_a": self.rs_a, "rs_b": self.rs_b, "rs_c": self.rs_c,
            "buf1": self.buf1, "buf2": self.buf2 if self.closs.needs_x2 else np.zeros((0, self.cols.size)),
            "comp_theta": self.comp_theta, "comp_v": self.comp_v, "comp_s": self.comp_s,
        }

    def _set_data(self, data: dict) -> None:
        p, d = len(self.params), self.cols.size
        arrs = {k: np.asarray(data[k], dtype=np.float64) for k in
                ("theta", "avg", "rs_a", "rs_b", "buf1", "buf2", "comp_theta", "comp_v", "comp_s")}
        shapes = {"theta": (p,), "avg": (p,), "rs_a": (p, p), "rs_b": (p,)}
        for k, shp in shapes.items():
            if arrs[k].shape != shp:
                raise ValueError(f"SGD state {k} has shape {arrs[k].shape}, expected {shp}")
        if arrs["buf1"].ndim != 2 or arrs["buf1"].shape[1] != d:
            raise ValueError(f"SGD buffer has shape {arrs['buf1'].shape}, expected (m, {d})")
        K = arrs["comp_s"].shape[0]
        if arrs["comp_theta"].shape != (K, p) or arrs["comp_v"].shape != (K, p, p):
            raise ValueError("SGD merged components have inconsistent shapes")
        self.theta, self.avg = arrs["theta"], arrs["avg"]
        self.rs_a, self.rs_b, self.rs_c = arrs["rs_a"], arrs["rs_b"], float(data["rs_c"])
        self.t, self.s = int(data["t"]), int(data["s"])
        self.buf1 = arrs["buf1"]
        self.buf2 = arrs["buf2"] if self.closs.needs_x2 else self.buf1
        self.comp_theta, self.comp_v, self.comp_s = arrs["comp_theta"], arrs["comp_v"], arrs["comp_s"]

    def __repr__(self) -> str:
        try:
            return (f"SGDState(query={self.name!r}, kind={self.query.kind}, "
                    f"estimator={self.query.estimator}, "
                    f"n={self._n}, steps={self.t}, averaged={self.s}, merged={self.comp_s.size})")
        except Exception:
            return "<SGDState (unprintable)>"


class _Threshold:
    """Picklable label ``y = 1{u[:, col] > t}`` (standardized units)."""

    def __init__(self, col: int, t: float) -> None:
        self.col, self.t = col, float(t)

    def __call__(self, u: np.ndarray) -> np.ndarray:
        return (u[:, self.col] > self.t).astype(np.float64)
