"""Location losses: the squared loss of a mean, the check loss of a quantile and the squared loss
of a transform ``(θ − g(x))²`` (Lu, Chen & Qiu 2025, §4, §7.1)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mechanisms._validate import check_open_unit
from mechanisms.errors import ParameterError
from mechanisms.losses.base import _SQRT_2PI, Loss, _check_indices, _robust_spread

# ---------------------------------------------------------------------------------------------
# location losses
# ---------------------------------------------------------------------------------------------


class SquaredLoss(Loss):
    """Squared loss for a mean: ``ℓ(x, θ) = Σ_j (x_j − θ_j)²`` (docs/mechanisms.md §3.1).

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
    ``θ̂_DR = [mean g(X̃₁) − (1 − δ) mean g(X̃₂)]/δ`` (docs/mechanisms.md §3.2; paper §7.1).

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
