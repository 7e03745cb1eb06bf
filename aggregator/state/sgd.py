"""Online averaged SGD on a corrected gradient, with one-step (plug-in) or random-scaling CIs.

Serves ``logistic_regression``, ``quantile_regression`` and ``custom`` queries (docs/mechanisms.md
§6.5–§6.10). The state is mergeable and serializable like every state (:mod:`aggregator.state.base`); its
measured accuracy and speed are in docs/benchmarks.md §2 and §3.

Iterates (Polyak–Ruppert averaged SGD): reports are grouped into mini-batches of
``sgd.batch_size`` (a remainder is buffered until the next update); step ``t`` moves
``θ ← θ − γ_t ĝ_t`` with ``γ_t = γ₀ t^(−a)`` and ``ĝ_t`` the mean DR/SDR corrected gradient of the
mini-batch (``mechanisms.corrected``); the average ``θ̄_s`` of the iterates after ``burn_in``
steps is the random-scaling estimate. For logistic and quantile regression with the DR gradient
the mini-batch loop runs compiled (:mod:`aggregator.state._sgd_kernel`), with the same steps,
anchors and sums as the Python loop that the other estimators and custom losses use.

One-step estimate (``sgd.ci = "plugin"``; the default for losses with a continuous θ-gradient):
after ``burn_in`` steps, every mini-batch adds exact sums at an anchor ``a_t`` — the running
average ``θ̄_{t−1}`` (the iterate for the first accumulated batch) — of the corrected gradient
``G = Σ g_i(a_t)`` (q), the corrected θ-Hessian ``H = Σ H_i(a_t)`` (q×q), ``Hθ = Σ H_i(a_t) a_t``
(q), ``S = Σ g_i g_iᵀ`` (q×q) and the count ``m``. ``H_i`` is the DR combination
``[H(x₁) − (1−δ)H(x₂)]/δ`` (unbiased for ``E ∇²θ ℓ(X, θ)``, docs/mechanisms.md §6.6) of the analytic Hessian
(``Loss.mean_hessian_theta``), of a central difference of the corrected gradient (smooth custom
losses without one), or of a Gaussian-kernel smoothed Hessian (kinked losses) kept for a ladder
of bandwidths ``2^(−k/2)`` and chosen at estimate time (:meth:`SGDState.bandwidth`). The estimate
solves the linearized estimating equation ``G + Hθ − Hθ_sum = 0``: ``θ̂ = H⁻¹(Hθ − G)`` with the
plug-in sandwich ``Cov = H⁻¹ (S − G Gᵀ/m) H⁻ᵀ`` (``V⁻¹AV⁻¹/n``), Wald intervals ``θ̂ ± z·SE``.
All sums merge exactly by addition, so merged partitions give the pooled one-step estimate.
Kinked losses default to random scaling, whose validity does not rest on the linearization.

Random scaling (Lee, Liao, Seo & Shin 2022, "Fast and robust online inference with stochastic
gradient descent via random scaling", AAAI): ``V̂ = s⁻² Σ_{r≤s} r² (θ̄_r − θ̄_s)(θ̄_r − θ̄_s)ᵀ``
from the O(q²) running sums ``Σ r² θ̄_r θ̄_rᵀ``, ``Σ r² θ̄_r`` and ``Σ r²``; the interval is
``θ̄_j ± c_level·sqrt(V̂_jj/s)`` with ``c_0.95 = 6.747`` (the 97.5 % point of
``|W(1)| / sqrt(∫(W(r) − rW(1))² dr)``; other levels in
:data:`aggregator.state.random_scaling.RS_CRITICAL`). ``stderr`` is the half-width /
z_{(1+level)/2}, so that ``value ± z·stderr`` is the same interval.

Merging random-scaling runs: a state keeps the summaries ``(θ̄, V̂, s, n)`` of the runs merged
into it and combines them with its own by their numbers of averaged steps: ``θ = Σ_k ω_k θ̄_k``
with ``ω_k = s_k / Σ s``, variance ``Σ_k ω_k² V̂_k / s_k`` and the critical value of K combined
random-scaling ratios (:func:`rs_critical` with ``K_eff = 1/Σ ω_k²``). Step-count weights, not
inverse-variance ones: a run's ``V̂`` is itself a noisy estimate, and weighting by it favours the
run whose ``V̂`` came out small by chance. This merge agrees with one pass over all reports to
within sampling error, not exactly.

Coordinates: for regression queries the fields are standardized by the schema bounds,
``u = (x − mid)/(range/2) ∈ [−1, 1]`` (``mid`` = centre of the box; scale only, no shift, without
an intercept); the SL noise variance there is ``(2λ)²``. Estimates are mapped back to original
units (``β = M θ + a``, covariance ``M V̂ Mᵀ``). Custom losses run in original units with
``σ_j² = (λ·range_j)²``.
"""

from __future__ import annotations

import logging

import numpy as np

from aggregator.errors import ConfigError, StateError
from aggregator.state._fields import numeric_columns, zil_of
from aggregator.state.base import EmptyStateError, Estimate, State, normal_critical
from aggregator.state.random_scaling import rs_critical

__all__ = ["DEFAULT_STEP0", "N_BANDWIDTHS", "REL_NOISE", "SGDState"]

log = logging.getLogger(__name__)

#: γ₀ by query kind when ``sgd.step0`` is not given (standardized coordinates; logistic losses
#: have small curvature there, p(1−p)·E u² ≈ 0.05, so they need a larger step).
DEFAULT_STEP0 = {"logistic_regression": 10.0, "quantile_regression": 2.0, "custom": 0.5}

#: Rungs of the bandwidth ladder ``ref · 2^(−k/2)``, k = 0 … 19, of kinked losses' smoothed
#: Hessians (ref = 1 in standardized units: a factor 724 from the widest to the narrowest).
N_BANDWIDTHS = 20
#: Bandwidth rule: the narrowest rung whose Hessian trace has a relative standard error (from
#: the between-batch spread of the per-batch traces) at most this.
REL_NOISE = 0.05


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
    """Averaged SGD on the DR/SDR corrected gradient with one-step or random-scaling CIs.

    Parameters
    ----------
    query : LogisticRegressionQuery, QuantileRegressionQuery or CustomQuery
    schema : TelemetrySchema
    loss : loss object, optional
        A custom query's loss, already resolved from ``query.loss``; None: it is imported here
        (:func:`aggregator.custom_loss.load_custom_loss`). Only for custom queries.

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

    def __init__(self, query, schema, *, loss=None) -> None:
        super().__init__(query, schema)
        from mechanisms.corrected import corrected_loss
        from mechanisms.errors import ParameterError

        q = self.query
        zil = zil_of(schema, self.name)
        self.zero_prob = float(zil.zero_prob)
        self.crit = rs_critical(q.level)  # one run's value; also refuses a level out of range
        self.opts = q.sgd
        self.step0 = q.sgd.step0 if q.sgd.step0 is not None else DEFAULT_STEP0[q.kind]
        #: Why this query's SGD stopped (a non-finite iterate), or None. A diverged state takes
        #: no more steps, stays diverged through merges and checkpoints, and ``estimate``
        #: raises :class:`StateError` with this text — the worker and the other queries go on.
        self.diverged: str | None = None
        if q.kind == "custom":
            self.cols = numeric_columns(schema, q.fields, self.name, "fields")
            if loss is None:
                from aggregator.custom_loss import load_custom_loss

                loss = load_custom_loss(q.loss, key=f"queries.{self.name}.loss")
            self.loss = loss
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

            if loss is not None:
                raise ConfigError(f"queries.{self.name}: a loss object is only for custom queries, "
                                  f"not {q.kind!r}")

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
        self._init_plugin(init, noise_var if method in ("sdr", "sl") else None)
        self._kernel = self._kernel_spec()
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

    # ------------------------------------------------------------------ one-step machinery
    def _init_plugin(self, init: np.ndarray, _noise_var) -> None:
        """Pick how per-batch θ-Hessians are formed and allocate the one-step sums."""
        L = self.loss
        p = len(self.params)
        probe = np.zeros((2, self.cols.size))
        probe[1] = 0.5
        th = init.astype(np.float64)
        self.hmode: str | None = None
        self.bw = np.ones(1)
        try:
            if L.smooth_theta:
                self.hmode = "analytic" if L.mean_hessian_theta(probe, th) is not None else "numeric"
            else:
                ref = 1.0 if self.query.kind != "custom" else float(
                    np.max(zil_of(self.schema, self.name).ranges[self.cols]))
                bw = ref * 2.0 ** (-np.arange(N_BANDWIDTHS) / 2.0)
                if L.smoothed_hessians(probe, th, bw) is not None:
                    self.hmode, self.bw = "ladder", bw
        except Exception as exc:  # a user loss that cannot be probed: random scaling only
            log.debug("query %r: no θ-Hessian for the one-step estimate (%r)", self.name, exc)
            self.hmode = None
        K = self.bw.size
        # "auto": the one-step estimate where the θ-gradient is smooth (analytic/numeric
        # Hessian); random scaling for kinked losses, whose linearization needs the SGD anchor
        # within the residual scale of θ̂
        ci = self.opts.ci
        if ci == "auto":
            ci = "plugin" if self.hmode in ("analytic", "numeric") else "random_scaling"
        self.ci = ci
        self.plugin = ci == "plugin" and self.hmode is not None
        if ci == "plugin" and self.hmode is None:
            log.warning("query %r: the loss offers no θ-Hessian; using random-scaling intervals",
                        self.name)
        self.os_m = 0.0
        self.os_g = np.zeros(p)
        self.os_s = np.zeros((p, p))
        self.os_h = np.zeros((K, p, p))
        self.os_ht = np.zeros((K, p))
        self.os_t1 = np.zeros(K)
        self.os_t2 = np.zeros(K)
        self.os_nb = 0.0

    def _kernel_spec(self) -> tuple | None:
        """Arguments of the compiled loop (:mod:`aggregator.state._sgd_kernel`) when it serves this
        query — logistic or quantile regression with the dr/naive/oracle gradient and an analytic
        or ladder Hessian — else None (the Python loop runs)."""
        from mechanisms.losses import LogisticLoss, QuantileRegressionLoss

        L, method = self.loss, self.closs.method
        if self.query.kind == "custom" or method not in ("dr", "naive", "oracle") or self.hmode == "numeric":
            return None
        from aggregator.state import _sgd_kernel as kern

        if isinstance(L, LogisticLoss):
            code, tau = kern.PHI_LOGISTIC, 0.0
        elif isinstance(L, QuantileRegressionLoss):
            code, tau = kern.PHI_QUANTILE, float(L.tau)
        else:
            return None
        k = self.cols.size - 1
        if isinstance(L.label, _Threshold) and L.label.col == k:
            label_mode, t_label = kern.LABEL_THRESHOLD, L.label.t
        elif L.label is None:
            label_mode, t_label = kern.LABEL_RAW, 0.0
        else:
            return None
        if L.covariates != tuple(range(k)):
            return None
        hmode = kern.HESS_LADDER if self.hmode == "ladder" else kern.HESS_ANALYTIC
        if method == "dr":
            a, b = 1.0 / self.zero_prob, (1.0 - self.zero_prob) / self.zero_prob
        else:
            a, b = 1.0, 0.0
        kern.warm()
        return code, tau, a, b, hmode, label_mode, float(t_label)

    def _update_kernel(self, x1: np.ndarray, x2: np.ndarray | None) -> None:
        """:meth:`_update` with the compiled loop: the buffered rows, then ``x1``/``x2`` (n, d) in
        original units, standardized inside the loop; the remainder becomes the new buffer."""
        from aggregator.state._sgd_kernel import run_steps

        code, tau, a, b, hmode, label_mode, t_label = self._kernel
        m, n, B = self.buf1.shape[0], x1.shape[0], int(self.opts.batch_size)
        full = ((m + n) // B) * B
        x1 = np.ascontiguousarray(x1, dtype=np.float64)
        x2 = np.ascontiguousarray(x2, dtype=np.float64) if b != 0.0 else x1
        ub1 = np.ascontiguousarray(self.buf1, dtype=np.float64)
        ub2 = np.ascontiguousarray(self.buf2, dtype=np.float64) if b != 0.0 else ub1
        sc = np.array([self.t, self.s, self.rs_c, self.os_m, self.os_nb], dtype=np.float64)
        o = {k: np.array(getattr(self, k), dtype=np.float64) for k in
             ("theta", "avg", "rs_a", "rs_b", "os_g", "os_s", "os_h", "os_ht", "os_t1", "os_t2")}
        run_steps(ub1, x1, ub2, x2, self.cols.astype(np.int64), np.asarray(self.shift, np.float64),
                  np.asarray(self.scale, np.float64), bool(self.query.intercept), label_mode, t_label, a, b,
                  code, tau, B, full, o["theta"], o["avg"], sc, float(self.step0),
                  float(self.opts.step_power), float(self.opts.burn_in), o["rs_a"], o["rs_b"],
                  bool(self.plugin), hmode, np.ascontiguousarray(self.bw, np.float64),
                  o["os_g"], o["os_s"], o["os_h"], o["os_ht"], o["os_t1"], o["os_t2"])
        for k, v in o.items():
            setattr(self, k, v)
        self.t, self.s, self.rs_c = int(sc[0]), int(sc[1]), float(sc[2])
        self.os_m, self.os_nb = float(sc[3]), float(sc[4])

        def tail(buf, x):
            if full >= m:
                return self._std(x[full - m:])
            return np.vstack([buf[full:], self._std(x)])

        self.buf1 = tail(self.buf1, x1)
        self.buf2 = tail(self.buf2, x2) if self.closs.needs_x2 else self.buf1

    def _batch_hessian(self, x1: np.ndarray, x2: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """Corrected θ-Hessian summed over one mini-batch, shape (K, q, q).

        DR form ``[H(x₁) − (1−δ)H(x₂)]/δ`` for dr/sdr/sl (unbiased for ``E ∇²θ ℓ(X, θ)``,
        docs/mechanisms.md §6.6), ``H(x₁)`` for naive; K = number of bandwidths of the ladder (1 otherwise).
        """
        L, n = self.loss, x1.shape[0]
        if self.hmode == "numeric":
            q = theta.size
            out = np.empty((q, q))
            for k in range(q):
                e = np.zeros(q)
                e[k] = 1e-5 * max(1.0, abs(theta[k]))
                out[:, k] = (self.closs.grad(x1, x2, theta + e).sum(axis=0)
                             - self.closs.grad(x1, x2, theta - e).sum(axis=0)) / (2 * e[k])
            return (0.5 * (out + out.T))[None]
        if self.hmode == "analytic":
            def hess(x):
                return L.mean_hessian_theta(x, theta)[None]
        else:
            def hess(x):
                return L.smoothed_hessians(x, theta, self.bw)
        h1 = hess(x1) * n
        if self.closs.method in ("naive", "oracle"):
            return h1
        d = self.zero_prob
        return (h1 - (1.0 - d) * n * hess(x2)) / d

    def _accumulate(self, x1, x2, theta, g) -> None:
        """Add one mini-batch's exact sums at the iterate ``theta`` (before the step)."""
        H = self._batch_hessian(x1, x2, theta)
        self.os_m += g.shape[0]
        self.os_g += g.sum(axis=0)
        self.os_s += g.T @ g
        self.os_h += H
        self.os_ht += H @ theta
        tr = np.trace(H, axis1=1, axis2=2)
        self.os_t1 += tr
        self.os_t2 += tr * tr
        self.os_nb += 1.0

    def bandwidth(self) -> float:
        """Kernel bandwidth the one-step Hessian uses now (kinked losses; 1.0 otherwise).

        The narrowest rung of the ladder ``ref · 2^(−k/2)``, k = 0 … 19 (ref = 1 in standardized
        units) whose summed Hessian trace ``T_k = Σ_b tr H_b,k`` has relative standard error
        ``sqrt(Σ_b tr² − T_k²/n_b)/T_k ≤`` :data:`REL_NOISE` (between-batch spread over the
        ``n_b`` mini-batches; mergeable sums), else the widest. The kernel bias of the smoothed
        Hessian is ``O(h²)`` relative to the scale of the *true* residual, while its noise is
        set by the noised one: the narrowest bandwidth the data can afford minimizes the bias
        (a rule from the noised residual's spread, as in ``mechanisms.estimation.m_estimate``,
        is too wide when the noise dominates that spread).
        """
        return float(self.bw[self._rung()])

    def _rung(self) -> int:
        if self.hmode != "ladder" or self.os_nb < 2:
            return 0
        t1 = self.os_t1
        var = np.maximum(self.os_t2 - t1 * t1 / self.os_nb, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(t1 > 0, np.sqrt(var) / np.where(t1 > 0, t1, 1.0), np.inf)
        ok = np.flatnonzero(rel <= REL_NOISE)
        return int(ok.max()) if ok.size else 0

    # ------------------------------------------------------------------ streaming
    def _std(self, x: np.ndarray) -> np.ndarray:
        return (x[:, self.cols] - self.shift) / self.scale

    def _update(self, batch, x2) -> None:
        if self.diverged is not None:
            return  # the reports are counted (n), no step is taken
        need_x2 = self.closs.needs_x2
        if self._kernel is not None:
            self._update_kernel(batch.numeric, self._require_x2(x2) if need_x2 else None)
            self._check_finite()
            return
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # → _check_finite
            self._update_python(batch, x2, need_x2)
        self._check_finite()

    def _update_python(self, batch, x2, need_x2: bool) -> None:
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
        acc = self.plugin
        for start in range(0, full, B):
            x1b, x2b = u1[start:start + B], u2[start:start + B]
            gi = grad(x1b, x2b, theta)
            if acc and self.t >= burn:
                # linearize at the running Polyak average θ̄_{t−1} once there is one: it is
                # F_{t−1}-measurable and far closer to θ̂ than the fluctuating iterate, so the
                # second-order remainder of the linearization shrinks; costs one more gradient
                # per batch
                anc = avg if self.s >= 1 else theta
                self._accumulate(x1b, x2b, anc, gi if self.s < 1 else grad(x1b, x2b, anc))
            g = gi.mean(axis=0)
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
        self.theta, self.avg = theta, avg
        self.buf1 = u1[full:].copy()
        self.buf2 = u2[full:].copy() if need_x2 else self.buf1

    def _check_finite(self) -> None:
        """Mark the state diverged (and log it once) when the iterate, its average or the sums
        behind the intervals are no longer finite (a run-away iterate overflows the sums before
        the iterate itself)."""
        if self.diverged is None and not all(
                np.all(np.isfinite(a)) for a in (self.theta, self.avg, self.rs_a, self.rs_b, self.os_g,
                                                  self.os_s, self.os_h, self.os_ht)):
            self.diverged = (f"query {self.name!r}: SGD diverged (non-finite iterate or sums at step "
                             f"{self.t} with sgd.step0 = {self.step0:g}); lower sgd.step0 (the "
                             "workers then rebuild the query from the earliest retained report)")
            log.error("%s; this query takes no more steps, the others go on", self.diverged)

    def _own_summary(self) -> tuple[np.ndarray, np.ndarray, int] | None:
        if self.s < 2:
            return None
        s = self.s
        av = self.avg
        V = (self.rs_a - np.outer(av, self.rs_b) - np.outer(self.rs_b, av) + self.rs_c * np.outer(av, av))
        return av.copy(), (V + V.T) / (2.0 * s * s), s

    def _merge(self, other: SGDState) -> None:
        if self.diverged is None and other.diverged is not None:
            self.diverged = other.diverged  # a merge over a diverged partition has no estimate
        # one-step sums: exact, by addition
        self.os_m += other.os_m
        self.os_g = self.os_g + other.os_g
        self.os_s = self.os_s + other.os_s
        self.os_h = self.os_h + other.os_h
        self.os_ht = self.os_ht + other.os_ht
        self.os_t1 = self.os_t1 + other.os_t1
        self.os_t2 = self.os_t2 + other.os_t2
        self.os_nb += other.os_nb
        # random-scaling summaries: kept per component (combined by step counts at estimate time)
        th, vv, ss = [self.comp_theta], [self.comp_v], [self.comp_s]
        with np.errstate(all="ignore"):  # a diverged partition's sums: its estimate is refused
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
        """Estimate in original units with Wald (``ci="plugin"``) or random-scaling intervals.

        Returns
        -------
        Estimate
            ``value`` (q,), ``stderr`` (q,), ``ci_low``/``ci_high`` (q,) in the units of the
            coefficients (response units per covariate unit).

        Raises
        ------
        EmptyStateError
            plugin: fewer than ``q + 1`` reports in the one-step sums, or a corrected Hessian
            that is not yet positive definite; random scaling: fewer than two averaged SGD
            steps (in every merged component).
        StateError
            The SGD diverged (``diverged``) in this state or in one merged into it, or the
            estimate is not finite.
        """
        if self.diverged is not None:
            raise StateError(self.diverged)
        with np.errstate(all="ignore"):  # a run-away iterate: refused below, no warning lines
            est = self._plugin_estimate() if self.plugin else self._rs_estimate()
        if not (np.all(np.isfinite(est.value)) and np.all(np.isfinite(est.stderr))):
            raise StateError(f"query {self.name!r}: the estimate is not finite (value {est.value}, "
                             f"stderr {est.stderr}): the SGD ran away; lower sgd.step0 "
                             f"(now {self.step0:g}; the workers then rebuild the query)")
        return est

    def one_step(self) -> tuple[np.ndarray, np.ndarray]:
        """One-step estimate and its plug-in sandwich covariance, in the SGD coordinates.

        Solves the linearized estimating equation ``G + H θ − Hθ = 0`` from the sums
        ``G = Σ g_i(θ_t)``, ``H = Σ H_i(θ_t)``, ``Hθ = Σ H_i(θ_t) θ_t``, ``S = Σ g_i g_iᵀ`` over
        the ``m`` reports after burn-in: ``θ̂ = H⁻¹(Hθ − G)``, ``Cov = H⁻¹ (S − G Gᵀ/m) H⁻ᵀ``
        (docs/mechanisms.md §6.6: the sandwich V⁻¹AV⁻¹/n of §4.2 with sums in place of means).

        Returns
        -------
        theta : ndarray (q,)
        cov : ndarray (q, q)

        Raises
        ------
        EmptyStateError
            Fewer than ``q + 1`` reports in the sums, or no positive definite Hessian.
        """
        p = len(self.params)
        if self.hmode is None or self.os_m < p + 1:
            raise EmptyStateError(
                f"query {self.name!r} has {int(self.os_m)} report(s) after burn-in "
                f"({self._n} in all; burn_in {self.opts.burn_in} steps of {self.opts.batch_size}); "
                f"the one-step estimate needs at least {p + 1}")
        k0 = self._rung()
        for k in range(k0, -1, -1):  # a wider bandwidth if the chosen one is not yet p.d.
            H = 0.5 * (self.os_h[k] + self.os_h[k].T)
            eig = np.linalg.eigvalsh(H)
            if np.all(eig > 1e-10 * max(1.0, float(np.abs(eig).max()))):
                break
        else:
            raise EmptyStateError(
                f"query {self.name!r}: the corrected Hessian from {int(self.os_m)} reports is not "
                "positive definite yet; more reports are needed")
        Hinv = np.linalg.inv(H)
        theta = Hinv @ (self.os_ht[k] - self.os_g)
        Sc = self.os_s - np.outer(self.os_g, self.os_g) / self.os_m
        cov = Hinv @ Sc @ Hinv.T
        return theta, 0.5 * (cov + cov.T)

    def _plugin_estimate(self) -> Estimate:
        theta, cov = self.one_step()
        value = self.M @ theta + self.a
        var = np.diag(self.M @ cov @ self.M.T)
        se = np.sqrt(np.maximum(var, np.finfo(float).tiny))
        half = normal_critical(self.query.level) * se
        return Estimate(self.name, self.params, value, se, value - half, value + half, self._n,
                        self.query.level, self.query.estimator)

    def _rs_estimate(self) -> Estimate:
        comps = []
        own = self._own_summary()
        if own is not None:
            comps.append(own)
        comps += [(self.comp_theta[i], self.comp_v[i], self.comp_s[i]) for i in range(self.comp_s.size)]
        if not comps:
            raise EmptyStateError(
                f"query {self.name!r} has taken {self.s} averaged SGD step(s) ({self._n} reports, "
                f"batch_size {self.opts.batch_size}); an estimate needs at least 2")
        # step-count weights ω_k = s_k/Σs: θ = Σ ω_k θ̄_k, Var = Σ ω_k² V̂_k/s_k, and the critical
        # value of K combined random-scaling ratios (rs_critical). Weights 1/V̂_k (inverse
        # variance) would let the run whose V̂ came out smallest by chance dominate and the
        # merged intervals under-cover (docs/mechanisms.md §6.8; coverage checked in
        # tests/aggregator/test_state_stats.py)
        vals = np.array([self.M @ theta + self.a for theta, _V, _s in comps])
        var = np.array([np.diag(self.M @ V @ self.M.T) / s for _theta, V, s in comps])
        steps = np.array([s for _theta, _V, s in comps], dtype=np.float64)
        omega = steps / steps.sum()
        value = omega @ vals
        half = rs_critical(self.query.level, 1.0 / float(omega @ omega)) * np.sqrt(
            np.maximum(omega**2 @ var, np.finfo(float).tiny))
        se = half / normal_critical(self.query.level)
        return Estimate(self.name, self.params, value, se, value - half, value + half, self._n,
                        self.query.level, self.query.estimator)

    # ------------------------------------------------------------------ serialization
    def _resolved_loss(self):
        return self.loss if self.query.kind == "custom" else None

    def _get_data(self) -> dict:
        return {
            "theta": self.theta, "t": self.t, "s": self.s, "avg": self.avg,
            "rs_a": self.rs_a, "rs_b": self.rs_b, "rs_c": self.rs_c,
            "buf1": self.buf1, "buf2": self.buf2 if self.closs.needs_x2 else np.zeros((0, self.cols.size)),
            "comp_theta": self.comp_theta, "comp_v": self.comp_v, "comp_s": self.comp_s,
            "os_m": self.os_m, "os_g": self.os_g, "os_s": self.os_s, "os_h": self.os_h,
            "os_ht": self.os_ht, "os_t1": self.os_t1, "os_t2": self.os_t2, "os_nb": self.os_nb,
            "diverged": self.diverged,
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
        K = self.bw.size
        os = {k: np.asarray(data[k], dtype=np.float64)
              for k in ("os_g", "os_s", "os_h", "os_ht", "os_t1", "os_t2")}
        for k, shp in {"os_g": (p,), "os_s": (p, p), "os_h": (K, p, p), "os_ht": (K, p),
                       "os_t1": (K,), "os_t2": (K,)}.items():
            if os[k].shape != shp:
                raise ValueError(f"SGD state {k} has shape {os[k].shape}, expected {shp}")
        self.os_g, self.os_s, self.os_h, self.os_ht = os["os_g"], os["os_s"], os["os_h"], os["os_ht"]
        self.os_t1, self.os_t2 = os["os_t1"], os["os_t2"]
        self.os_m, self.os_nb = float(data["os_m"]), float(data["os_nb"])
        diverged = data.get("diverged")  # absent in checkpoints written before it existed
        if diverged is not None and not isinstance(diverged, str):
            raise ValueError(f"SGD state 'diverged' must be a string or null, got {diverged!r}")
        self.diverged = diverged

    def __repr__(self) -> str:
        try:
            return (f"SGDState(query={self.name!r}, kind={self.query.kind}, "
                    f"estimator={self.query.estimator}, "
                    f"n={self._n}, steps={self.t}, averaged={self.s}, one_step_reports={int(self.os_m)}, "
                    f"ci={self.ci}, merged={self.comp_s.size})")
        except Exception:
            return "<SGDState (unprintable)>"


class _Threshold:
    """Picklable label ``y = 1{u[:, col] > t}`` (standardized units)."""

    def __init__(self, col: int, t: float) -> None:
        self.col, self.t = col, float(t)

    def __call__(self, u: np.ndarray) -> np.ndarray:
        return (u[:, self.col] > self.t).astype(np.float64)
