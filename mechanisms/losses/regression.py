"""Single-index losses ``ℓ(x, θ) = φ(zᵀθ, y)``: linear, logistic, hinge, Huber and quantile
regression (Lu, Chen & Qiu 2025, §5–§6)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mechanisms._validate import check_open_unit, check_positive
from mechanisms.errors import ParameterError
from mechanisms.losses.base import _SQRT_2PI, Loss, _check_indices, _robust_spread

# ---------------------------------------------------------------------------------------------
# single-index (regression / classification) losses
# ---------------------------------------------------------------------------------------------


class _IndexLoss(Loss):
    """``ℓ(x, θ) = φ(η, y)`` with ``η = zᵀθ``, ``z = [1?, x_covariates]``.

    Record layout: with ``label=None`` the last column is the response ``y`` and the covariates are
    the other columns (or ``covariates``); with a ``label`` callable, ``y = label(x)`` and the
    covariates default to every column.
    """

    _label_may_be_noised = True
    _phi_smooth = True  # φ twice continuously differentiable in η (and y)

    def __init__(
        self,
        *,
        intercept: bool = True,
        noised: Sequence[int] = (),
        covariates: Sequence[int] | None = None,
        label: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        if label is not None and not callable(label):
            raise ParameterError(f"label must be callable or None, got {label!r}")
        self.intercept = bool(intercept)
        self.noised = _check_indices("noised", noised)
        self.covariates = None if covariates is None else _check_indices("covariates", covariates)
        self.label = label
        self.smooth = self._phi_smooth and label is None
        self._cache_p: int | None = None

    # layout -----------------------------------------------------------------------------
    def _cov_cols(self, p: int) -> tuple[int, ...]:
        if self.covariates is not None:
            return self.covariates
        return tuple(range(p - 1 if self.label is None else p))

    def n_params(self, p):
        return len(self._cov_cols(p)) + int(self.intercept)

    def min_columns(self):
        top = max(self.noised, default=-1) + 1
        if self.label is None:
            cov_need = max(self.covariates, default=-1) + 2 if self.covariates else 2
            return max(cov_need, top)
        return max(max(self.covariates or (0,)) + 1, top, 1)

    def _check_records(self, x, name):
        p = x.shape[1]
        cov = self._cov_cols(p)
        if self.label is None:
            if any(c >= p - 1 for c in cov):
                raise ParameterError(f"covariates must be in [0, {p - 2}] (last column is y), got {cov}")
            if (p - 1) in self.noised and not self._label_may_be_noised:
                raise ParameterError(
                    f"the label column {p - 1} cannot be noised for {self.name}; "
                    "pass label=callable to derive it from a noised column (DR only)"
                )
            self._check_labels(x[:, -1], name)
        else:
            if any(c >= p for c in cov):
                raise ParameterError(f"covariates must be in [0, {p - 1}], got {cov}")
            self._check_labels(self._y(x), f"label({name})")
        if any(j >= p for j in self.noised):
            raise ParameterError(f"noised indices must be < {p} (record width), got {self.noised}")

    def _check_labels(self, y: np.ndarray, name: str) -> None:
        if not np.all(np.isfinite(y)):
            raise ParameterError(f"{name}: the response must be finite")

    def _cols(self, x: np.ndarray) -> np.ndarray:
        """Covariate block of ``x`` (a view when the covariates are the leading columns)."""
        p = x.shape[1]
        if self.covariates is None:
            return x[:, : p - 1] if self.label is None else x
        return x[:, list(self.covariates)]

    def _design(self, x: np.ndarray) -> np.ndarray:
        cols = self._cols(x)
        if self.intercept:
            z = np.empty((x.shape[0], cols.shape[1] + 1))
            z[:, 0] = 1.0
            z[:, 1:] = cols
            return z
        return cols

    def _eta(self, x: np.ndarray, theta: np.ndarray) -> np.ndarray:
        if self.intercept:
            return self._cols(x) @ theta[1:] + theta[0]
        return self._cols(x) @ theta

    def _y(self, x: np.ndarray) -> np.ndarray:
        if self.label is None:
            return x[:, -1]
        y = np.asarray(self.label(x), dtype=np.float64).reshape(-1)
        if y.shape != (x.shape[0],):
            raise ParameterError(f"label must return shape ({x.shape[0]},), got {y.shape}")
        return y

    def _noise_map(self, p: int) -> tuple[np.ndarray, np.ndarray, int | None]:
        """(positions in ``noised`` of noised covariates, their coefficient indices, position of
        the noised response column or None)."""
        cov = self._cov_cols(p)
        pos, coef = [], []
        ypos = None
        for i, j in enumerate(self.noised):
            if j in cov:
                pos.append(i)
                coef.append(cov.index(j) + int(self.intercept))
            elif self.label is None and j == p - 1:
                ypos = i
        return np.array(pos, dtype=np.intp), np.array(coef, dtype=np.intp), ypos

    # φ and its derivatives (subclasses) ------------------------------------------------
    def _phi(self, eta, y):
        raise NotImplementedError

    def _phi_eta(self, eta, y):
        raise NotImplementedError

    def _phi_ee(self, eta, y):
        raise NotImplementedError

    def _phi_eee(self, eta, y):
        raise NotImplementedError

    def _phi_yy(self, eta, y):
        raise NotImplementedError

    def _phi_yye(self, eta, y):
        raise NotImplementedError

    # Loss API --------------------------------------------------------------------------
    def initial_theta(self, x):
        z, y = self._design(x), self._y(x)
        coef, *_ = np.linalg.lstsq(z, y, rcond=None)
        return coef

    def value(self, x, theta):
        return self._phi(self._eta(x, theta), self._y(x))

    def grad(self, x, theta):
        pe = self._phi_eta(self._eta(x, theta), self._y(x))
        cols = self._cols(x)
        if not self.intercept:
            return pe[:, None] * cols
        out = np.empty((x.shape[0], cols.shape[1] + 1))
        out[:, 0] = pe
        np.multiply(pe[:, None], cols, out=out[:, 1:])
        return out

    def laplacian_x(self, x, theta, weights):
        if not self.smooth:
            return super().laplacian_x(x, theta, weights)
        w = self.weights_array(weights)
        pos, coef, ypos = self._noise_map(x.shape[1])
        z, y = self._design(x), self._y(x)
        eta = z @ theta
        s = float(np.sum(w[pos] * theta[coef] ** 2)) if pos.size else 0.0
        out = self._phi_ee(eta, y) * s
        if ypos is not None:
            out = out + w[ypos] * self._phi_yy(eta, y)
        return out

    def grad_laplacian_x(self, x, theta, weights):
        if not self.smooth:
            return super().grad_laplacian_x(x, theta, weights)
        w = self.weights_array(weights)
        pos, coef, ypos = self._noise_map(x.shape[1])
        z, y = self._design(x), self._y(x)
        eta = z @ theta
        s = float(np.sum(w[pos] * theta[coef] ** 2)) if pos.size else 0.0
        out = (self._phi_eee(eta, y) * s)[:, None] * z
        if pos.size:
            vec = np.zeros(theta.shape[0])
            np.add.at(vec, coef, 2.0 * w[pos] * theta[coef])
            out = out + self._phi_ee(eta, y)[:, None] * vec
        if ypos is not None:
            out = out + (w[ypos] * self._phi_yye(eta, y))[:, None] * z
        return out

    def _kink(self, eta, y):
        """Argument at which φ kinks (residual or margin); None for smooth φ."""
        return None

    def smoothed_hessian(self, x, theta, bandwidth):
        eta, y = self._eta(x, theta), self._y(x)
        k = self._kink(eta, y)
        if k is None:
            return None
        u = k / bandwidth
        w = np.exp(-0.5 * u * u) / (bandwidth * _SQRT_2PI)
        z = self._design(x)
        return (z * w[:, None]).T @ z / x.shape[0]

    def _phi_ee_theta(self, eta, y):
        """``∂²φ/∂η²`` for the θ-Hessian (a.e.), or None when φ kinks in η."""
        if not self.smooth_theta:
            return None
        try:
            return self._phi_ee(eta, y)
        except NotImplementedError:
            return None

    def mean_hessian_theta(self, x, theta):
        z = self._design(x)
        w = self._phi_ee_theta(z @ theta, self._y(x))
        if w is None:
            return None
        return (z * w[:, None]).T @ z / x.shape[0]

    def smoothed_hessians(self, x, theta, bandwidths):
        eta, y = self._eta(x, theta), self._y(x)
        k = self._kink(eta, y)
        if k is None:
            return None
        h = np.asarray(bandwidths, dtype=np.float64).reshape(-1)
        u = k[:, None] / h
        w = np.exp(-0.5 * u * u) / (h * _SQRT_2PI)  # (n, K)
        z = self._design(x)
        n, q = z.shape
        zz = (z[:, :, None] * z[:, None, :]).reshape(n, q * q)
        return (w.T @ zz).reshape(h.size, q, q) / n

    def residual_spread(self, x, theta):
        k = self._kink(self._eta(x, theta), self._y(x))
        return 1.0 if k is None else float(_robust_spread(k[:, None])[0])

    def theta_scale(self, x, theta):
        z, y = self._design(x), self._y(x)
        r = _robust_spread((y - z @ theta)[:, None])[0]
        zs = _robust_spread(z)
        if self.intercept:
            zs[0] = 1.0
        return r / zs

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(intercept={self.intercept}, noised={self.noised}, "
            f"covariates={self.covariates}, label={'callable' if self.label else None})"
        )


class LinearRegressionLoss(_IndexLoss):
    """Squared-error regression loss ``ℓ = (y − zᵀβ)²``, ``z = [1, x_cov]`` (docs/mechanisms.md §3.4).

    Parameters
    ----------
    intercept : bool
        Prepend a constant (θ[0] is the intercept, never noised).
    noised : sequence of int
        Noised record columns (covariates, and possibly the response: its correction is a
        constant in β).
    covariates : sequence of int, optional
        Covariate columns (default all but the last).
    label : callable, optional
        ``y = label(x)`` instead of the last column (makes the loss non-smooth: DR only).

    Notes
    -----
    ``∂²ℓ/∂x_j² = 2β_j²`` → SDR closed form ``(Z̃₁ᵀZ̃₁/n − (1−δ)D_σ²) β = Z̃₁ᵀy/n``
    (docs/mechanisms.md §3.4; paper §6).

    Raises
    ------
    ParameterError
        On invalid index lists or a non-callable label.
    """

    name = "linear_regression"

    def _phi(self, eta, y):
        r = y - eta
        return r * r

    def _phi_eta(self, eta, y):
        return -2.0 * (y - eta)

    def _phi_ee(self, eta, y):
        return np.full(eta.shape, 2.0)

    def _phi_eee(self, eta, y):
        return np.zeros(eta.shape)

    def _phi_yy(self, eta, y):
        return np.full(eta.shape, 2.0)

    def _phi_yye(self, eta, y):
        return np.zeros(eta.shape)


class LogisticLoss(_IndexLoss):
    """Logistic (binary cross-entropy) loss ``ℓ = log(1 + e^η) − y η``, ``η = zᵀβ`` (paper §7.2).

    Parameters
    ----------
    intercept : bool
        Prepend a constant.
    noised : sequence of int
        Noised covariate columns.
    covariates : sequence of int, optional
        Covariate columns (default all but the last with ``label=None``, else all columns).
    label : callable, optional
        Derive ``y ∈ {0, 1}`` from the record, e.g. ``lambda x: x[:, 2] > 15`` when the label is a
        function of a noised field. The loss is then not smooth in x → DR only.

    Notes
    -----
    ``∂²ℓ/∂x_j² = β_j² p(1 − p)``, ``p = 1/(1 + e^(−η))``.

    Raises
    ------
    ParameterError
        On invalid index lists, a noised label column (without ``label``), or labels ∉ {0, 1}
        (at :meth:`check_x`).
    """

    name = "logistic"
    _label_may_be_noised = False

    def _check_labels(self, y, name):
        if not np.all((y == 0) | (y == 1)):
            raise ParameterError(f"{name}: logistic labels must be 0 or 1")

    def initial_theta(self, x):
        return np.zeros(self.n_params(x.shape[1]))

    @staticmethod
    def _p(eta):
        return 0.5 * (1.0 + np.tanh(0.5 * eta))

    def _phi(self, eta, y):
        return np.logaddexp(0.0, eta) - y * eta

    def _phi_eta(self, eta, y):
        return self._p(eta) - y

    def _phi_ee(self, eta, y):
        p = self._p(eta)
        return p * (1.0 - p)

    def _phi_eee(self, eta, y):
        p = self._p(eta)
        return p * (1.0 - p) * (1.0 - 2.0 * p)

    def theta_scale(self, x, theta):
        zs = _robust_spread(self._design(x))
        if self.intercept:
            zs[0] = 1.0
        return 1.0 / zs


class NoisedLabelLogisticLoss(LogisticLoss):
    """Logistic loss whose 0/1 label is a released (noised) record column.

    ``ℓ = log(1 + e^η) − y η`` is linear in ``y``, so the DR and SDR corrected losses stay
    unbiased when the label column itself carries ZIL noise (``∂²ℓ/∂y² = 0``); the labels are
    then not checked to be 0 or 1. Parameters as :class:`LogisticLoss` (``label`` must be None
    and the label column may be in ``noised``).
    """

    _label_may_be_noised = True

    def _check_labels(self, y, name):
        return None

    def _phi_yy(self, eta, y):
        return np.zeros(eta.shape)

    def _phi_yye(self, eta, y):
        return np.zeros(eta.shape)


class HingeLoss(_IndexLoss):
    """Hinge (SVM) loss ``ℓ = max(0, 1 − ỹ η)``, ``ỹ = ±1`` (labels 0/1 or −1/+1; paper §1).

    Parameters
    ----------
    intercept, noised, covariates, label
        As in :class:`LogisticLoss`.

    Notes
    -----
    Not differentiable (in x or θ) on ``ỹη = 1`` → DR only, ``smooth_theta = False``.

    Raises
    ------
    ParameterError
        On invalid index lists, a noised label column, or labels outside {0, 1} / {−1, 1}.
    """

    name = "hinge"
    smooth_theta = False
    _phi_smooth = False
    _label_may_be_noised = False

    def _check_labels(self, y, name):
        if not (np.all((y == 0) | (y == 1)) or np.all((y == -1) | (y == 1))):
            raise ParameterError(f"{name}: hinge labels must be 0/1 or -1/+1")

    def initial_theta(self, x):
        return np.zeros(self.n_params(x.shape[1]))

    @staticmethod
    def _sign(y):
        return np.where(y > 0, 1.0, -1.0)

    def _phi(self, eta, y):
        return np.maximum(0.0, 1.0 - self._sign(y) * eta)

    def _phi_eta(self, eta, y):
        s = self._sign(y)
        return -s * (s * eta < 1.0)

    def _kink(self, eta, y):
        return 1.0 - self._sign(y) * eta

    def theta_scale(self, x, theta):
        zs = _robust_spread(self._design(x))
        if self.intercept:
            zs[0] = 1.0
        return 1.0 / zs


class HuberLoss(_IndexLoss):
    """Huber regression loss ``ℓ = H_c(y − zᵀβ)``: ``r²/2`` for ``|r| ≤ c``, else ``c(|r| − c/2)``.

    Parameters
    ----------
    c : float
        Threshold > 0 in units of y (default 1.345).
    intercept, noised, covariates, label
        As in :class:`LinearRegressionLoss`.

    Notes
    -----
    Once differentiable: the x-Hessian jumps at ``|r| = c`` → ``smooth = False`` (DR only); the
    θ-gradient is continuous (``smooth_theta = True``).

    Raises
    ------
    ParameterError
        If ``c`` ≤ 0 or on invalid index lists.
    """

    name = "huber"
    _phi_smooth = False

    def __init__(self, c: float = 1.345, **kwargs) -> None:
        super().__init__(**kwargs)
        self.c = check_positive("c", c)

    def _phi(self, eta, y):
        a = np.abs(y - eta)
        return np.where(a <= self.c, 0.5 * a * a, self.c * (a - 0.5 * self.c))

    def _phi_eta(self, eta, y):
        return -np.clip(y - eta, -self.c, self.c)

    def _phi_ee_theta(self, eta, y):
        return (np.abs(y - eta) <= self.c).astype(np.float64)


class QuantileRegressionLoss(_IndexLoss):
    """Quantile-regression check loss ``ℓ = ρ_τ(y − zᵀβ)``, ``ρ_τ(r) = r(τ − 1{r < 0})``
    (paper §7.3; τ = 0.5 is median regression).

    Parameters
    ----------
    tau : float
        Quantile level in (0, 1).
    intercept, noised, covariates, label
        As in :class:`LinearRegressionLoss`.

    Notes
    -----
    Not differentiable → DR only; ``smooth_theta = False`` (derivative-free optimiser,
    numerical V with step ``~ n^(−1/3)``).

    Raises
    ------
    ParameterError
        If ``tau`` ∉ (0, 1) or on invalid index lists.
    """

    name = "quantile_regression"
    smooth_theta = False
    _phi_smooth = False

    def __init__(self, tau: float = 0.5, **kwargs) -> None:
        super().__init__(**kwargs)
        self.tau = check_open_unit("tau", tau)

    def _phi(self, eta, y):
        r = y - eta
        return r * (self.tau - (r < 0))

    def _phi_eta(self, eta, y):
        return (y < eta).astype(np.float64) - self.tau

    def _kink(self, eta, y):
        return y - eta
