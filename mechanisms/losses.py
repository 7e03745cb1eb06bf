"""Loss functions ``ℓ(x, θ)`` for M-estimation on ZIL-privatized records.

Source: Lu, Chen & Qiu, "Versatile differentially private learning for general loss functions"
(arXiv 2501.15127), §4–§7; DESIGN §2.

A *record* is one row of an array ``x`` of shape ``(n, p)`` in original units. Every loss declares

* ``noised`` — the record columns that carry ZIL noise (the others are exact);
* ``smooth`` — whether ``ℓ`` is twice continuously differentiable in every noised column (needed by
  the SL and SDR corrected losses; DR needs only continuity);
* ``smooth_theta`` — whether ``∇θ ℓ`` is continuous in ``θ`` (gradient optimisers and small-step
  numerical Hessians are then appropriate);
* ``value(x, θ) -> (n,)`` and ``grad(x, θ) -> (n, q)`` (gradient in θ);
* where ``smooth``: ``laplacian_x(x, θ, weights) -> (n,)`` ``= Σ_j w_j ∂²ℓ/∂x_j²`` over the noised
  columns (``weights`` aligned with ``noised``; the SL covariance diagonal ``σ_j²`` in use) and
  ``grad_laplacian_x(x, θ, weights) -> (n, q)``, its θ-gradient.

``value``/``grad``/``laplacian_x`` do no validation (they sit in the SGD hot loop); call
:meth:`Loss.check_x` once on a batch first.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np

from mechanisms._validate import check_finite_array, check_open_unit, check_positive
from mechanisms.errors import ParameterError

__all__ = [
    "CheckLoss",
    "HingeLoss",
    "HuberLoss",
    "LinearRegressionLoss",
    "LogisticLoss",
    "Loss",
    "QuantileRegressionLoss",
    "SquaredLoss",
    "TransformSquaredLoss",
    "abs_sin_2pi",
    "abs_sin_2pi_loss",
    "indicator_half_one",
    "indicator_half_one_loss",
    "relu",
    "relu_loss",
]


def _check_indices(name: str, idx) -> tuple[int, ...]:
    if idx is None:
        return ()
    try:
        out = tuple(int(i) for i in idx)
    except (TypeError, ValueError):
        raise ParameterError(f"{name} must be a sequence of column indices >= 0, got {idx!r}") from None
    if any(i < 0 for i in out):
        raise ParameterError(f"{name} must contain column indices >= 0, got {out}")
    if len(set(out)) != len(out):
        raise ParameterError(f"{name} must not repeat a column index, got {out}")
    return out


_SQRT_2PI = float(np.sqrt(2.0 * np.pi))


def _not_smooth_msg(name: str) -> str:
    return f"{name} is not twice differentiable in its noised columns; DR is required (method='dr')"


def _robust_spread(a: np.ndarray) -> np.ndarray:
    """Column-wise IQR/1.349 (falls back to the standard deviation, then 1), shape (p,)."""
    a = np.atleast_2d(a.T).T if a.ndim == 1 else a
    q75, q25 = np.percentile(a, [75, 25], axis=0)
    s = (q75 - q25) / 1.349
    sd = a.std(axis=0)
    s = np.where(s > 0, s, sd)
    return np.where(s > 0, s, 1.0)


class Loss(ABC):
    """Base class of every loss ``ℓ(x, θ)`` (DESIGN §2).

    Attributes
    ----------
    noised : tuple of int
        Record columns carrying ZIL noise. Weights passed to :meth:`laplacian_x` are aligned
        with this tuple.
    smooth : bool
        ``ℓ`` is twice continuously differentiable in every noised column (SL/SDR allowed).
    smooth_theta : bool
        ``∇θ ℓ`` is continuous in θ.
    name : str
        Short name used in messages and reports.
    """

    noised: tuple[int, ...] = ()
    smooth: bool = False
    smooth_theta: bool = True
    name: str = "loss"

    # -- shape contract ---------------------------------------------------------------------
    @abstractmethod
    def n_params(self, p: int) -> int:
        """Number ``q`` of parameters for records with ``p`` columns."""

    def min_columns(self) -> int:
        """Smallest record width ``p`` this loss accepts."""
        return max(self.noised, default=-1) + 1

    def check_x(self, x, name: str = "x") -> np.ndarray:
        """Validate a batch of records.

        Parameters
        ----------
        x : array of shape (n, p) (or (n,) for one-column losses), original units
        name : str
            Argument name used in error messages.

        Returns
        -------
        ndarray of shape (n, p), float64

        Raises
        ------
        ParameterError
            On NaN/inf, wrong number of dimensions, too few columns, an empty batch, or labels
            outside the loss's label set.
        """
        a = check_finite_array(name, x, ndim=(1, 2))
        if a.ndim == 1:
            a = a[:, None]
        if a.shape[0] == 0:
            raise ParameterError(f"{name} must hold at least one record, got shape {a.shape}")
        if a.shape[1] < self.min_columns():
            raise ParameterError(
                f"{name} must have at least {self.min_columns()} column(s) for {self.name}, "
                f"got shape {a.shape}"
            )
        self._check_records(a, name)
        return a

    def _check_records(self, x: np.ndarray, name: str) -> None:  # noqa: B027 - optional hook
        """Subclass hook for extra record checks (labels …)."""

    def check_theta(self, theta, p: int) -> np.ndarray:
        """Validate a parameter vector; returns float64 array of shape (q,).

        Raises
        ------
        ParameterError
            On NaN/inf or a length different from :meth:`n_params`.
        """
        t = np.atleast_1d(check_finite_array("theta", theta, ndim=(0, 1)))
        q = self.n_params(p)
        if t.shape != (q,):
            raise ParameterError(f"theta must have shape ({q},) for {self.name}, got {t.shape}")
        return t

    # -- values -------------------------------------------------------------------------------
    @abstractmethod
    def initial_theta(self, x: np.ndarray) -> np.ndarray:
        """A cheap starting value ``θ⁰`` of shape (q,) computed from records ``x`` (n, p)."""

    @abstractmethod
    def value(self, x: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """``ℓ(x_i, θ)`` for every record: x (n, p), θ (q,) → (n,)."""

    @abstractmethod
    def grad(self, x: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """``∇θ ℓ(x_i, θ)``: x (n, p), θ (q,) → (n, q). A subgradient where ℓ has a kink."""

    def laplacian_x(self, x: np.ndarray, theta: np.ndarray, weights) -> np.ndarray:
        """``Σ_j w_j ∂²ℓ(x_i, θ)/∂x_j²`` over the noised columns ``j`` → (n,).

        Parameters
        ----------
        x : (n, p) records; theta : (q,); weights : scalar or (len(noised),), aligned with
            ``noised`` (the SL covariance diagonal ``σ_j²`` in units of x²).

        Raises
        ------
        ParameterError
            If the loss is not twice differentiable in the noised columns (use DR).
        """
        raise ParameterError(_not_smooth_msg(self.name))

    def grad_laplacian_x(self, x: np.ndarray, theta: np.ndarray, weights) -> np.ndarray:
        """θ-gradient of :meth:`laplacian_x` → (n, q).

        Raises
        ------
        ParameterError
            If the loss is not twice differentiable in the noised columns (use DR).
        """
        raise ParameterError(_not_smooth_msg(self.name))

    def smoothed_hessian(self, x: np.ndarray, theta: np.ndarray, bandwidth: float) -> np.ndarray | None:
        """Mean θ-Hessian of a kernel-smoothed version of ℓ, (q, q), or None if not provided.

        Losses whose θ-gradient jumps (check, hinge) replace the Dirac mass of ``∂²ℓ/∂η²`` by a
        Gaussian kernel of width ``bandwidth`` (units of the residual/margin); used for the
        sandwich's V (DESIGN §2, "smoothed score").
        """
        return None

    def residual_spread(self, x: np.ndarray, theta: np.ndarray) -> float:
        """Robust spread (IQR/1.349) of the quantity the loss kinks in (residual, margin); sets
        the kernel bandwidth of :meth:`smoothed_hessian`."""
        return 1.0

    def mean_hessian_theta(self, x: np.ndarray, theta: np.ndarray) -> np.ndarray | None:
        """Mean analytic θ-Hessian ``(1/n) Σ_i ∇²θ ℓ(x_i, θ)``, shape (q, q), or None.

        Provided where ``∇θ ℓ`` is continuous and piecewise differentiable in θ (squared,
        ``(θ − g(x))²``, linear/logistic/Huber regression); None for kinked losses (use
        :meth:`smoothed_hessians`) and for losses without a closed form. Applied to ``X̃₁`` and
        ``X̃₂`` and DR-combined, ``[H(X̃₁) − (1−δ)H(X̃₂)]/δ``, it is unbiased for ``E ∇²θ ℓ(X, θ)``
        (DESIGN §2); used by the online one-step estimator (``aggregator.state.sgd``).

        Parameters
        ----------
        x : (n, p) records (original or standardized units, as for :meth:`grad`); theta : (q,)

        Returns
        -------
        ndarray (q, q) or None
        """
        return None

    def smoothed_hessians(self, x: np.ndarray, theta: np.ndarray, bandwidths) -> np.ndarray | None:
        """:meth:`smoothed_hessian` for several bandwidths at once, shape (K, q, q), or None.

        Parameters
        ----------
        x : (n, p) records; theta : (q,)
        bandwidths : array (K,) of float > 0
            Kernel widths in units of the kink variable (residual, margin).

        Returns
        -------
        ndarray (K, q, q) or None
            ``out[k] == smoothed_hessian(x, theta, bandwidths[k])``; None if the loss has no
            smoothed Hessian (DESIGN §2, "smoothed score").
        """
        out = []
        for h in np.asarray(bandwidths, dtype=np.float64).reshape(-1):
            v = self.smoothed_hessian(x, theta, float(h))
            if v is None:
                return None
            out.append(v)
        return np.stack(out)

    def theta_scale(self, x: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """A natural unit per parameter, shape (q,), used for numerical-derivative steps and
        optimiser simplex sizes (DESIGN §2: step ``~ n^(−1/3)·scale``)."""
        return np.ones(self.n_params(x.shape[1]))

    def weights_array(self, weights) -> np.ndarray:
        """Broadcast ``weights`` to shape (len(noised),) (float64)."""
        w = np.asarray(weights, dtype=np.float64)
        return np.broadcast_to(w, (len(self.noised),)) if w.ndim == 0 else w

    def __repr__(self) -> str:
        return f"{type(self).__name__}(noised={self.noised})"


# ---------------------------------------------------------------------------------------------
# location losses
# ---------------------------------------------------------------------------------------------


class SquaredLoss(Loss):
    """Squared loss for a mean: ``ℓ(x, θ) = Σ_j (x_j − θ_j)²`` (DESIGN §2, squared loss).

    Parameters
    ----------
    dim : int
        Number of record columns ``p`` (= number of parameters), ≥ 1.
    noised : sequence of int, optional
        Noised columns; default all ``range(dim)``.

    Notes
    -----
    ``∂²ℓ/∂x_j² = 2``, so the SL/SDR corrections are constants in θ: SDR = mean of X̃₁,
    SL = mean of X̃₂, DR = [mean X̃₁ − (1 − δ) mean X̃₂]/δ.

    Raises
    ------
    ParameterError
        If ``dim < 1`` or a noised index is ≥ dim.
    """

    smooth = True
    smooth_theta = True

    def __init__(self, dim: int = 1, noised: Sequence[int] | None = None) -> None:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ParameterError(f"dim must be an integer >= 1, got {dim!r}")
        self.dim = int(dim)
        self.noised = tuple(range(self.dim)) if noised is None else _check_indices("noised", noised)
        if any(j >= self.dim for j in self.noised):
            raise ParameterError(f"noised indices must be in [0, {self.dim - 1}], got {self.noised}")
        self.name = "squared"

    def n_params(self, p: int) -> int:
        return self.dim

    def min_columns(self) -> int:
        return self.dim

    def _check_records(self, x, name):
        if x.shape[1] != self.dim:
            raise ParameterError(f"{name} must have exactly {self.dim} column(s), got shape {x.shape}")

    def initial_theta(self, x):
        return x.mean(axis=0)

    def value(self, x, theta):
        d = x - theta
        return np.einsum("ij,ij->i", d, d)

    def grad(self, x, theta):
        return 2.0 * (theta - x)

    def laplacian_x(self, x, theta, weights):
        return np.full(x.shape[0], 2.0 * float(np.sum(self.weights_array(weights))))

    def grad_laplacian_x(self, x, theta, weights):
        return np.zeros((x.shape[0], self.dim))

    def mean_hessian_theta(self, x, theta):
        return 2.0 * np.eye(self.dim)

    def theta_scale(self, x, theta):
        return _robust_spread(x)

    def __repr__(self) -> str:
        return f"SquaredLoss(dim={self.dim}, noised={self.noised})"


class CheckLoss(Loss):
    """Check (pinball) loss for the τ-quantile of one column: ``ℓ(x, θ) = ρ_τ(x − θ)``,
    ``ρ_τ(r) = r (τ − 1{r < 0})`` (paper §4, quantile estimation).

    Parameters
    ----------
    tau : float
        Quantile level in (0, 1).
    noised : bool
        Whether column 0 is noised (default True).

    Notes
    -----
    Not differentiable in x at ``x = θ`` → ``smooth = False`` (DR only); ``smooth_theta = False``.
    Records have exactly one column.

    Raises
    ------
    ParameterError
        If ``tau`` is not in (0, 1).
    """

    smooth = False
    smooth_theta = False

    def __init__(self, tau: float = 0.5, noised: bool = True) -> None:
        self.tau = check_open_unit("tau", tau)
        self.noised = (0,) if noised else ()
        self.name = f"check(tau={self.tau})"

    def n_params(self, p):
        return 1

    def min_columns(self):
        return 1

    def _check_records(self, x, name):
        if x.shape[1] != 1:
            raise ParameterError(f"{name} must have exactly 1 column for {self.name}, got shape {x.shape}")

    def initial_theta(self, x):
        return np.array([np.quantile(x[:, 0], self.tau)])

    def value(self, x, theta):
        r = x[:, 0] - theta[0]
        return r * (self.tau - (r < 0))

    def grad(self, x, theta):
        r = x[:, 0] - theta[0]
        return ((r < 0).astype(np.float64) - self.tau)[:, None]

    def theta_scale(self, x, theta):
        return _robust_spread(x[:, :1])

    def smoothed_hessian(self, x, theta, bandwidth):
        u = (x[:, 0] - theta[0]) / bandwidth
        return np.array([[float(np.mean(np.exp(-0.5 * u * u))) / (bandwidth * _SQRT_2PI)]])

    def smoothed_hessians(self, x, theta, bandwidths):
        h = np.asarray(bandwidths, dtype=np.float64).reshape(-1)
        u = (x[:, 0] - theta[0])[:, None] / h
        return (np.exp(-0.5 * u * u).mean(axis=0) / (h * _SQRT_2PI))[:, None, None]

    def residual_spread(self, x, theta):
        return float(_robust_spread(x[:, :1])[0])

    def __repr__(self) -> str:
        return f"CheckLoss(tau={self.tau}, noised={bool(self.noised)})"


class TransformSquaredLoss(Loss):
    """``ℓ(x, θ) = (θ − g(x))²`` for a user transform ``g`` (paper §7.1).

    Its minimiser is ``θ₀ = E g(X)``; DR gives the closed form
    ``θ̂_DR = [mean g(X̃₁) − (1 − δ) mean g(X̃₂)]/δ`` (DESIGN §2).

    Parameters
    ----------
    g : callable
        ``g(x)`` with ``x`` of shape (n, dim) → (n,) (vectorised, finite values).
    dg, d2g : callable, optional
        First and pure second partial derivatives of ``g``: ``(n, dim) → (n, dim)`` (or (n,) when
        dim = 1). Needed for SL/SDR; without both, ``smooth`` is False.
    dim : int
        Record width (default 1).
    noised : sequence of int, optional
        Noised columns (default all).
    smooth : bool, optional
        Override the smoothness flag (e.g. ``False`` for a ``g`` whose derivatives exist only
        almost everywhere). Cannot be True without ``dg`` and ``d2g``.
    name : str, optional

    Notes
    -----
    ``∂²ℓ/∂x_j² = 2(∂_j g)² − 2(θ − g)∂_j² g`` and its θ-gradient is ``−2 ∂_j² g``.

    Raises
    ------
    ParameterError
        If ``g`` is not callable, ``dim < 1``, or ``smooth=True`` without both derivatives.
    """

    smooth_theta = True

    def __init__(
        self,
        g: Callable[[np.ndarray], np.ndarray],
        dg: Callable[[np.ndarray], np.ndarray] | None = None,
        d2g: Callable[[np.ndarray], np.ndarray] | None = None,
        *,
        dim: int = 1,
        noised: Sequence[int] | None = None,
        smooth: bool | None = None,
        name: str | None = None,
    ) -> None:
        if not callable(g):
            raise ParameterError(f"g must be callable, got {g!r}")
        for nm, f in (("dg", dg), ("d2g", d2g)):
            if f is not None and not callable(f):
                raise ParameterError(f"{nm} must be callable or None, got {f!r}")
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ParameterError(f"dim must be an integer >= 1, got {dim!r}")
        has = dg is not None and d2g is not None
        if smooth and not has:
            raise ParameterError("smooth=True requires both dg and d2g")
        self.g, self.dg, self.d2g = g, dg, d2g
        self.dim = int(dim)
        self.noised = tuple(range(self.dim)) if noised is None else _check_indices("noised", noised)
        if any(j >= self.dim for j in self.noised):
            raise ParameterError(f"noised indices must be in [0, {self.dim - 1}], got {self.noised}")
        self.smooth = has if smooth is None else bool(smooth)
        self.name = name or getattr(g, "__name__", "g")

    def n_params(self, p):
        return 1

    def min_columns(self):
        return self.dim

    def _check_records(self, x, name):
        if x.shape[1] != self.dim:
            raise ParameterError(f"{name} must have exactly {self.dim} column(s), got shape {x.shape}")

    def transform(self, x: np.ndarray) -> np.ndarray:
        """``g(x)`` as float64 of shape (n,).

        Raises
        ------
        ParameterError
            If ``g`` returns the wrong shape or a non-finite value.
        """
        v = np.asarray(self.g(x), dtype=np.float64).reshape(-1)
        if v.shape != (x.shape[0],):
            raise ParameterError(f"g must return shape ({x.shape[0]},), got {v.shape}")
        if not np.all(np.isfinite(v)):
            raise ParameterError("g returned a non-finite value")
        return v

    def _deriv(self, f, x) -> np.ndarray:
        v = np.asarray(f(x), dtype=np.float64)
        return v.reshape(x.shape[0], -1)[:, list(self.noised)] if v.ndim > 1 else v.reshape(-1, 1)

    def initial_theta(self, x):
        return np.array([self.transform(x).mean()])

    def value(self, x, theta):
        d = theta[0] - self.transform(x)
        return d * d

    def grad(self, x, theta):
        return (2.0 * (theta[0] - self.transform(x)))[:, None]

    def laplacian_x(self, x, theta, weights):
        if self.dg is None or self.d2g is None:
            super().laplacian_x(x, theta, weights)
        w = self.weights_array(weights)
        g1 = self._deriv(self.dg, x)
        g2 = self._deriv(self.d2g, x)
        resid = (theta[0] - self.transform(x))[:, None]
        return (2.0 * (g1 * g1 - resid * g2)) @ w

    def grad_laplacian_x(self, x, theta, weights):
        if self.dg is None or self.d2g is None:
            super().grad_laplacian_x(x, theta, weights)
        w = self.weights_array(weights)
        return (-2.0 * self._deriv(self.d2g, x) @ w)[:, None]

    def mean_hessian_theta(self, x, theta):
        return np.array([[2.0]])

    def theta_scale(self, x, theta):
        return _robust_spread(self.transform(x)[:, None])

    def __repr__(self) -> str:
        return (
            f"TransformSquaredLoss(g={self.name}, dim={self.dim}, noised={self.noised}, "
            f"smooth={self.smooth})"
        )


def relu(x) -> np.ndarray:
    """``max(0, x)`` of the first column, (n, 1) or (n,) → (n,) (paper §7.1, ℓ₁)."""
    a = np.asarray(x, dtype=np.float64)
    return np.maximum(a.reshape(a.shape[0], -1)[:, 0], 0.0)


def indicator_half_one(x) -> np.ndarray:
    """``1{x ∈ [0.5, 1]}`` of the first column, (n, 1) or (n,) → (n,) float (paper §7.1, ℓ₂)."""
    a = np.asarray(x, dtype=np.float64)
    c = a.reshape(a.shape[0], -1)[:, 0]
    return ((c >= 0.5) & (c <= 1.0)).astype(np.float64)


def abs_sin_2pi(x) -> np.ndarray:
    """``|sin 2πx|`` of the first column, (n, 1) or (n,) → (n,) (paper §7.1, ℓ₃)."""
    a = np.asarray(x, dtype=np.float64)
    return np.abs(np.sin(2.0 * np.pi * a.reshape(a.shape[0], -1)[:, 0]))


def _first_col(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    return a.reshape(a.shape[0], -1)[:, 0]


#: ``(θ − ReLU(x))²`` — paper §7.1 ℓ₁; θ₀ = 0.5 for X ~ U(0, 1). Not smooth in x (DR only);
#: carries the a.e. derivatives ``g′ = 1{x > 0}``, ``g″ = 0`` for the SL baseline.
relu_loss = TransformSquaredLoss(
    relu, lambda x: (_first_col(x) > 0).astype(np.float64), lambda x: np.zeros(len(x)),
    smooth=False, name="relu",
)
#: ``(θ − 1{x ∈ [0.5, 1]})²`` — paper §7.1 ℓ₂; θ₀ = 0.5 for X ~ U(0, 1). DR only;
#: a.e. derivatives ``g′ = g″ = 0``.
indicator_half_one_loss = TransformSquaredLoss(
    indicator_half_one, lambda x: np.zeros(len(x)), lambda x: np.zeros(len(x)),
    smooth=False, name="indicator_half_one",
)
#: ``(θ − |sin 2πx|)²`` — paper §7.1 ℓ₃; θ₀ = 2/π for X ~ U(0, 1). DR only;
#: a.e. derivatives ``g′ = 2π cos(2πx) sign(sin 2πx)``, ``g″ = −4π² |sin 2πx|``.
abs_sin_2pi_loss = TransformSquaredLoss(
    abs_sin_2pi,
    lambda x: 2 * np.pi * np.cos(2 * np.pi * _first_col(x)) * np.sign(np.sin(2 * np.pi * _first_col(x))),
    lambda x: -4 * np.pi**2 * abs_sin_2pi(x),
    smooth=False, name="abs_sin_2pi",
)


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
    """Squared-error regression loss ``ℓ = (y − zᵀβ)²``, ``z = [1, x_cov]`` (DESIGN §2).

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
    ``∂²ℓ/∂x_j² = 2β_j²`` → SDR closed form ``(Z̃₁ᵀZ̃₁/n − (1−δ)D_σ²) β = Z̃₁ᵀy/n`` (DESIGN §2).

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
