"""Renewable DR M-estimation: the state of ``logistic_regression``, ``quantile_regression`` and
``custom`` queries (docs/mechanisms.md §6.5–§6.8).

Per partition the state is a :class:`mechanisms.renewable.RenewableFit` (θ̂, H, A, n) and a
buffer of standardized reports not yet fitted:

* **warm-up** — the first ``renewable.warm_up`` reports wait in the buffer; then they are fitted
  in batch (the same M-estimation as ``ldp-stream analyze``);
* **renewal** — every later block of exactly ``renewable.batch_size`` reports, cut by count in
  offset order, renews the fit (Newton steps on the block's corrected loss plus the quadratic
  that carries the past); fewer wait in the buffer. A partition's state is therefore a function
  of its reports alone, however the polls grouped them;
* **merge** — fits pool exactly (``H = ΣH_k``, ``θ̂ = H⁻¹ΣH_kθ̂_k``, ``A = ΣA_k``); buffers are
  pooled;
* **estimate** — the buffered reports, sorted into a canonical order (so that the order of
  merging does not matter), renew a copy of the fit as one more block; with no fit yet (every
  partition still warming up) they are fitted in batch. ``Cov = H⁻¹AH⁻¹``, Wald intervals.

For logistic and quantile regression with the DR (or naive) gradient the renewal runs compiled
(:mod:`aggregator.state._renewable_kernel`), with the same steps as the Python path of
:class:`mechanisms.renewable.Renewable` that custom losses and SDR use.

Coordinates: regression fields are standardized by the schema bounds,
``u = (x − mid)/(range/2) ∈ [−1, 1]`` (``mid`` = centre of the box; scale only, no shift, without
an intercept); the SL noise variance there is ``(2λ)²``. Estimates are mapped back to original
units (``β = Mθ + a``, covariance ``M Cov Mᵀ``). Custom losses run in original units with
``σ_j² = (λ·range_j)²``.
"""

from __future__ import annotations

import logging

import numpy as np

from aggregator.errors import ConfigError, StateError
from aggregator.state._fields import numeric_columns, zil_of
from aggregator.state.base import EmptyStateError, Estimate, State, normal_critical

__all__ = ["MAX_WARM_UP_FACTOR", "MIN_REPORTS_PER_PARAM", "RenewableState"]

log = logging.getLogger(__name__)

#: An estimate needs at least this many reports per parameter.
MIN_REPORTS_PER_PARAM = 10
#: A warm-up whose fits keep failing buffers at most this many times ``warm_up`` reports.
MAX_WARM_UP_FACTOR = 4


class RenewableState(State):
    """Renewable M-estimate of a regression or user loss (module docstring).

    Parameters
    ----------
    query : LogisticRegressionQuery, QuantileRegressionQuery or CustomQuery
    schema : TelemetrySchema
    loss : loss object, optional
        A custom query's loss, already resolved from ``query.loss``; None: it is imported here
        (:func:`aggregator.custom_loss.load_custom_loss`). Only for custom queries.

    Attributes
    ----------
    fit : mechanisms.renewable.RenewableFit or None
        The fit of the reports past the warm-up (None while warming up), standardized units.
    guarded : int
        How often the positive-definiteness guard of H acted (docs/mechanisms.md §6.6).

    Notes
    -----
    ``update`` needs ``x2`` for dr/sdr/sl. ``params``: ``("intercept", *covariates)`` for
    regressions, ``query.params`` or ``theta0 …`` for custom losses.

    Raises
    ------
    ConfigError
        Unknown/non-numeric fields, a loss that does not fit the estimator.
    """

    kinds = ("logistic_regression", "quantile_regression", "custom")

    def __init__(self, query, schema, *, loss=None) -> None:
        super().__init__(query, schema)
        from mechanisms.corrected import corrected_loss
        from mechanisms.errors import ParameterError
        from mechanisms.renewable import Renewable

        q = self.query
        zil = zil_of(schema, self.name)
        self.zero_prob = float(zil.zero_prob)
        self.opts = q.renewable
        noise_var, init, method = self._setup(q, zil, loss)
        try:
            self.closs = corrected_loss(self.loss, method, self.zero_prob,
                                        noise_var if method in ("sdr", "sl") else None)
            self.engine = Renewable(self.closs, self.cols.size, theta0=init)
        except ParameterError as exc:
            raise ConfigError(f"queries.{self.name}.estimator: {exc}") from None
        self.fit = None
        #: Buffered reports the next warm-up fit needs (``warm_up``, doubled after a failed fit).
        self.warm_target = int(self.opts.warm_up)
        #: Reports dropped after warm-up fits that kept failing (docs/mechanisms.md §6.6).
        self.dropped = 0
        self.buf1 = np.zeros((0, self.cols.size))
        self.buf2 = self.buf1
        self._kernel = self._kernel_spec()

    def _setup(self, q, zil, loss) -> tuple[np.ndarray | None, np.ndarray | None, str]:
        """Set the columns, standardization (``shift``, ``scale``), ``loss``, ``params`` and
        back-transform (``M``, ``a``) of the query; returns ``(noise_var, init, method)``: the SL
        noise variance per noised column in the loss's units, the warm-up fit's start (or None)
        and the corrected-loss method."""
        init = None
        if q.kind == "custom":
            self.cols = numeric_columns(self.schema, q.fields, self.name, "fields")
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
            if q.init is not None:
                init = np.asarray(q.init, dtype=np.float64)
                if init.shape != (p,):
                    raise ConfigError(f"queries.{self.name}.init: must have {p} entries, got {init.size}")
            self.M, self.a = np.eye(p), np.zeros(p)
        else:
            if loss is not None:
                raise ConfigError(f"queries.{self.name}: a loss object is only for custom queries, "
                                  f"not {q.kind!r}")
            noise_var = self._regression_setup(q, zil)
        return noise_var, init, q.estimator

    def _regression_setup(self, q, zil) -> np.ndarray:
        """Columns, standardization, loss and back-transform of a regression query; returns the
        SL noise variance per noised column in standardized units."""
        from mechanisms.losses import LogisticLoss, NoisedLabelLogisticLoss, QuantileRegressionLoss

        ycol_name = q.label if q.kind == "logistic_regression" else q.response
        self.cols = np.concatenate([
            numeric_columns(self.schema, q.covariates, self.name, "covariates"),
            numeric_columns(self.schema, [ycol_name], self.name,
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
                self.loss = LogisticLoss(noised=tuple(range(k)), label=_Threshold(k, t_u), **common)
                noise_var = noise_var[:k]
            else:
                self.shift[k], self.scale[k] = 0.0, 1.0  # the label is used as is (0/1 scale)
                self.loss = NoisedLabelLogisticLoss(noised=tuple(range(k + 1)), **common)
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
        return noise_var

    def _kernel_spec(self) -> tuple | None:
        """Arguments of the compiled renewal (:mod:`aggregator.state._renewable_kernel`) when it
        serves this query — logistic or quantile regression with the dr/naive gradient — else
        None (the Python path runs)."""
        from mechanisms.losses import LogisticLoss, QuantileRegressionLoss

        L, method = self.loss, self.closs.method
        if self.query.kind == "custom" or method not in ("dr", "naive"):
            return None
        from aggregator.state import _index_kernel as ik
        from aggregator.state import _renewable_kernel as rk

        if isinstance(L, LogisticLoss):
            code, tau = ik.PHI_LOGISTIC, 0.0
        elif isinstance(L, QuantileRegressionLoss):
            code, tau = ik.PHI_QUANTILE, float(L.tau)
        else:
            return None
        k = self.cols.size - 1
        if isinstance(L.label, _Threshold) and L.label.col == k:
            label_mode, t_label = ik.LABEL_THRESHOLD, L.label.t
        elif L.label is None:
            label_mode, t_label = ik.LABEL_RAW, 0.0
        else:
            return None
        if L.covariates != tuple(range(k)):
            return None
        a, b = ((1.0 / self.zero_prob, (1.0 - self.zero_prob) / self.zero_prob) if method == "dr"
                else (1.0, 0.0))
        rk.warm()
        return code, tau, a, b, label_mode, float(t_label)

    def _kernel_uses_x2(self) -> bool:
        """Whether the compiled renewal reads ``X̃₂`` (DR; not naive)."""
        return self._kernel[3] != 0.0

    def _run_kernel(self, ub1, x1, ub2, x2, block: int, full: int, theta, H, A, sc, spread: float) -> None:
        """Call the compiled renewal over stream rows ``[0, full)``; ``theta``, ``H``, ``A`` and
        ``sc = [n, guarded]`` are updated in place (:func:`renew_blocks`)."""
        from aggregator.state._renewable_kernel import renew_blocks
        from mechanisms import renewable as rn

        code, tau, a, b, label_mode, t_label = self._kernel
        renew_blocks(ub1, x1, ub2, x2, self.cols.astype(np.int64), np.asarray(self.shift, np.float64),
                     np.asarray(self.scale, np.float64), bool(self.query.intercept), label_mode, t_label,
                     a, b, code, tau, block, full, theta, H, A, sc, spread, rn.BANDWIDTH_C,
                     rn.BANDWIDTH_POWER, 1 if self.engine.kinked else rn.MAX_NEWTON, rn.NEWTON_TOL)

    # ------------------------------------------------------------------ streaming
    def _std(self, x: np.ndarray) -> np.ndarray:
        return (x[:, self.cols] - self.shift) / self.scale

    @property
    def _two(self) -> bool:
        return self.closs.needs_x2

    def _update(self, batch, x2) -> None:
        x1 = batch.numeric
        x2 = self._require_x2(x2) if self._two else None
        if self.fit is None:
            u1, u2 = self._std(x1), self._std(x2) if self._two else None
            if self.query.kind == "custom":
                self._probe(u1, u2)
            self._buffer(u1, u2)
            while self.fit is None and self.buf1.shape[0] >= self.warm_target:
                self._warm_up()
            if self.fit is None:
                return
            x1 = x2 = None  # the rest of the buffer, if any, is renewed below
        fresh = 0 if x1 is None else x1.shape[0]  # reports of this update not probed yet
        if self._kernel is not None:
            self._renew_kernel(x1, x2)
        else:
            if x1 is not None:
                self._buffer(self._std(x1), self._std(x2) if self._two else None)
            self._renew_python()
        left = min(fresh, self.buf1.shape[0])  # of them, still buffered (fewer than batch_size)
        if left and self.query.kind == "custom":
            self._probe(self.buf1[-left:], self.buf2[-left:] if self._two else None)

    def _probe(self, u1: np.ndarray, u2: np.ndarray | None) -> None:
        """Evaluate the custom loss's gradient on reports that enter a buffer unevaluated — the
        warm-up's (at the query's ``init``, else zero) and, after it, those left over a renewal's
        last full batch (at the current estimate) — so that a loss that refuses an input raises
        in the update that carries it: the worker then dead-letters that record
        (docs/reliability.md §9), not the later one whose fit reads the buffer. At most one
        extra gradient per report of the warm-up and fewer than ``batch_size`` per update after
        it; the renewal evaluates the others anyway."""
        if u1.shape[0] == 0:
            return
        if self.fit is not None:
            theta = self.fit.theta
        else:
            theta = self.engine.theta0 if self.engine.theta0 is not None else np.zeros(self.engine.q)
        for u in (u1,) if u2 is None or u2 is u1 else (u1, u2):
            self.loss.grad(u, theta)

    def _buffer(self, u1: np.ndarray, u2: np.ndarray | None) -> None:
        self.buf1 = np.vstack([self.buf1, u1]) if self.buf1.shape[0] else u1
        if self._two:
            self.buf2 = np.vstack([self.buf2, u2]) if self.buf2.shape[0] else u2
        else:
            self.buf2 = self.buf1

    def _warm_up(self) -> None:
        """Fit the buffered reports (at least ``warm_up``) in batch; the rest of the buffer after
        ``warm_target`` reports stays buffered. A block that determines no fit — a diverging DR
        fit, or a corrected Hessian that is not positive definite (a renewal from it would take
        run-away steps) — extends the warm-up: the reports stay and the fit is tried again on
        twice as many, up to ``MAX_WARM_UP_FACTOR · warm_up``. There a Hessian that is not
        positive definite has its eigenvalues floored (counted in ``guarded``), and a fit that is
        still not finite has the oldest reports dropped (counted in ``dropped``, logged) so that
        the buffer stays bounded (docs/mechanisms.md §6.6)."""
        m0 = self.warm_target
        cap = MAX_WARM_UP_FACTOR * self.opts.warm_up
        w1, w2 = self.buf1[:m0], self.buf2[:m0]
        fit, converged = self.engine.warm_start(w1, w2 if self._two else None, floor=m0 >= cap)
        if fit is None:
            if m0 < cap:
                self.warm_target = min(2 * m0, cap)
                log.warning("query %r: the warm-up fit of %d reports is not finite or its Hessian is not "
                            "positive definite; trying again with %d", self.name, m0, self.warm_target)
            else:
                drop = self.opts.warm_up
                self.dropped += drop
                self._drop_buffered(drop)
                log.error("query %r: no finite warm-up fit from %d reports; the oldest %d are dropped "
                          "(%d in all) and the fit is tried again with the next ones", self.name, m0, drop,
                          self.dropped)
            return
        if not converged:
            log.warning("query %r: the warm-up fit of %d reports did not meet its convergence check; "
                        "the renewal goes on from it", self.name, m0)
        self.fit = fit
        self._note_guard(0)
        self._drop_buffered(m0)

    @property
    def guarded(self) -> int:
        """How often the positive-definiteness guard of H acted (the fit's count; 0 without a fit)."""
        return 0 if self.fit is None else self.fit.guarded

    def _note_guard(self, before: int) -> None:
        if self.guarded > before:
            log.info("query %r: the positive-definiteness guard of H acted (%d times in all)", self.name,
                     self.guarded)

    def _drop_buffered(self, k: int) -> None:
        """Remove the first ``k`` buffered reports (fitted, or dropped by the warm-up)."""
        self.buf1 = self.buf1[k:].copy()
        self.buf2 = self.buf2[k:].copy() if self._two else self.buf1

    def _renew_python(self) -> None:
        B = self.opts.batch_size
        full = (self.buf1.shape[0] // B) * B
        before = self.fit.guarded
        fit = self.fit
        for s in range(0, full, B):
            fit = self.engine.renew(fit, self.buf1[s:s + B], self.buf2[s:s + B] if self._two else None)
        self.fit = fit
        self._note_guard(before)
        self._drop_buffered(full)

    def _renew_kernel(self, x1: np.ndarray | None, x2: np.ndarray | None) -> None:
        """Renew with the compiled loop: the buffered rows, then ``x1``/``x2`` (n, d) in original
        units, standardized inside the loop; the remainder becomes the new buffer."""
        from mechanisms.renewable import RenewableFit

        two = self._kernel_uses_x2()
        if x1 is None:  # only the buffer (right after the warm-up)
            x1 = x2 = np.zeros((0, int(self.cols.max()) + 1))
        x1 = np.ascontiguousarray(x1, dtype=np.float64)
        x2 = np.ascontiguousarray(x2, dtype=np.float64) if two else x1
        r, n, B = self.buf1.shape[0], x1.shape[0], int(self.opts.batch_size)
        full = ((r + n) // B) * B
        if full:
            fit = self.fit
            theta, H, A = fit.theta.copy(), fit.H.copy(), fit.A.copy()
            sc = np.array([fit.n, fit.guarded], dtype=np.float64)
            ub1 = np.ascontiguousarray(self.buf1, dtype=np.float64)
            ub2 = np.ascontiguousarray(self.buf2, dtype=np.float64) if two else ub1
            self._run_kernel(ub1, x1, ub2, x2, B, full, theta, H, A, sc, float(fit.spread))
            before = fit.guarded
            self.fit = RenewableFit(theta, H, A, int(sc[0]), fit.spread, int(sc[1]))
            self._note_guard(before)

        def tail(buf, x):
            if full >= r:
                return self._std(x[full - r:])
            return np.vstack([buf[full:], self._std(x)]) if x.shape[0] else buf[full:].copy()

        self.buf1 = tail(self.buf1, x1)
        self.buf2 = tail(self.buf2, x2) if self._two else self.buf1

    def _merge(self, other: RenewableState) -> None:
        from mechanisms.renewable import pool

        theirs = other.fit
        if self.fit is not None and theirs is not None:
            theirs = self._aligned(theirs)
        fits = [f for f in (self.fit, theirs) if f is not None]
        self.fit = pool(fits) if fits else None
        self.dropped += other.dropped
        self.warm_target = max(self.warm_target, other.warm_target)
        if other.buf1.shape[0]:
            self.buf1 = np.vstack([self.buf1, other.buf1])
            self.buf2 = np.vstack([self.buf2, other.buf2]) if self._two else self.buf1

    def _aligned(self, fit):
        """``fit`` (another partition's) with its parameters in this state's order before pooling
        (k-means and mixtures match components; identity here)."""
        return fit

    # ------------------------------------------------------------------ estimate
    def current_fit(self):
        """The fit of every report folded in, standardized units: the state's fit renewed with
        the buffered reports in canonical order, or (no fit yet) their batch fit.

        Returns
        -------
        mechanisms.renewable.RenewableFit

        Raises
        ------
        EmptyStateError
            Fewer than ``MIN_REPORTS_PER_PARAM · q`` reports, or a fit that is not identified yet.
        """
        p = len(self.params)
        need = MIN_REPORTS_PER_PARAM * p
        if self._n < need:
            raise EmptyStateError(f"query {self.name!r} has {self._n} report(s); an estimate needs at "
                                  f"least {need} ({MIN_REPORTS_PER_PARAM} per parameter)")
        fit = self.fit
        r = self.buf1.shape[0]
        if r:
            order = np.lexsort(np.hstack([self.buf1, self.buf2]).T[::-1]) if self._two else \
                np.lexsort(self.buf1.T[::-1])
            u1 = self.buf1[order]
            u2 = self.buf2[order] if self._two else None
            with np.errstate(all="ignore"):
                try:
                    fit = self.engine.warm_start(u1, u2)[0] if fit is None else self.engine.renew(fit, u1, u2)
                except (np.linalg.LinAlgError, ValueError) as exc:
                    raise EmptyStateError(f"query {self.name!r}: no fit from {self._n} reports yet "
                                          f"({exc}); more reports are needed") from None
        if fit is None:
            raise EmptyStateError(f"query {self.name!r}: the batch fit of the {r} buffered reports is not "
                                  "finite yet (a DR objective of few reports can be unbounded); more "
                                  "reports are needed")
        return fit

    @property
    def costly_estimate(self) -> bool:
        """True while :meth:`estimate` runs a batch fit (no fit yet: the buffered reports of the
        warm-up are fitted on every call); serve then computes it off its refresh thread."""
        return self.fit is None and self.buf1.shape[0] > 0

    def estimate(self) -> Estimate:
        """Estimate in original units with Wald intervals from ``Cov = H⁻¹AH⁻¹``.

        Returns
        -------
        Estimate
            ``value`` (q,), ``stderr`` (q,), ``ci_low``/``ci_high`` (q,) in the units of the
            coefficients (response units per covariate unit).

        Raises
        ------
        EmptyStateError
            Too few reports (:meth:`current_fit`).
        StateError
            The estimate is not finite.
        """
        fit = self.current_fit()
        with np.errstate(all="ignore"):
            cov = fit.cov()
            value = self.M @ fit.theta + self.a
            var = np.diag(self.M @ cov @ self.M.T)
        if not (np.all(np.isfinite(value)) and np.all(np.isfinite(var))):
            raise StateError(f"query {self.name!r}: the estimate from {self._n} reports is not finite "
                             f"(value {value}, variance {var})")
        se = np.sqrt(np.maximum(var, np.finfo(float).tiny))
        half = normal_critical(self.query.level) * se
        return Estimate(self.name, self.params, value, se, value - half, value + half, self._n,
                        self.query.level, self.query.estimator)

    # ------------------------------------------------------------------ serialization
    def _resolved_loss(self):
        return self.loss if self.query.kind == "custom" else None

    def _get_data(self) -> dict:
        f = self.fit
        p = len(self.params)
        return {
            "fitted": f is not None,
            "theta": f.theta if f else np.zeros(p), "H": f.H if f else np.zeros((p, p)),
            "A": f.A if f else np.zeros((p, p)), "n_fit": f.n if f else 0,
            "spread": f.spread if f else 1.0, "guarded": f.guarded if f else 0,
            "buf1": self.buf1, "buf2": self.buf2 if self._two else np.zeros((0, self.cols.size)),
            "warm_target": self.warm_target, "dropped": self.dropped,
        }

    def _set_data(self, data: dict) -> None:
        from mechanisms.renewable import RenewableFit

        p, d = len(self.params), self.cols.size
        arrs = {k: np.asarray(data[k], dtype=np.float64) for k in ("theta", "H", "A", "buf1", "buf2")}
        for k, shp in {"theta": (p,), "H": (p, p), "A": (p, p)}.items():
            if arrs[k].shape != shp:
                raise ValueError(f"renewable state {k} has shape {arrs[k].shape}, expected {shp}")
        for k in ("buf1", "buf2"):
            if arrs[k].ndim != 2 or arrs[k].shape[1] != d:
                raise ValueError(f"renewable state {k} has shape {arrs[k].shape}, expected (m, {d})")
        if self._two and arrs["buf2"].shape != arrs["buf1"].shape:
            raise ValueError("renewable state buffers have different shapes")
        self.fit = None
        if data["fitted"]:
            self.fit = RenewableFit(arrs["theta"], arrs["H"], arrs["A"], int(data["n_fit"]),
                                    float(data["spread"]), int(data["guarded"]))
        self.warm_target, self.dropped = int(data["warm_target"]), int(data["dropped"])
        self.buf1 = arrs["buf1"]
        self.buf2 = arrs["buf2"] if self._two else self.buf1

    def __repr__(self) -> str:
        try:
            return (f"RenewableState(query={self.name!r}, kind={self.query.kind}, "
                    f"estimator={self.query.estimator}, n={self._n}, "
                    f"fitted={0 if self.fit is None else self.fit.n}, buffered={self.buf1.shape[0]}, "
                    f"guarded={self.guarded}, dropped={self.dropped}, compiled={self._kernel is not None})")
        except Exception:
            return "<RenewableState (unprintable)>"


class _Threshold:
    """Picklable label ``y = 1{u[:, col] > t}`` (standardized units)."""

    def __init__(self, col: int, t: float) -> None:
        self.col, self.t = col, float(t)

    def __call__(self, u: np.ndarray) -> np.ndarray:
        return (u[:, self.col] > self.t).astype(np.float64)
