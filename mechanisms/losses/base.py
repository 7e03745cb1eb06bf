"""The :class:`Loss` interface of every loss and the helpers the losses share (see
:mod:`mechanisms.losses` for what a loss declares)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from mechanisms._validate import check_finite_array
from mechanisms.errors import ParameterError


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
    """Base class of every loss ``ℓ(x, θ)`` (docs/mechanisms.md §5).

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
        sandwich's V (docs/mechanisms.md §4.3; online: §6.7).
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
        (docs/mechanisms.md §6.6); used by the renewable estimator (``mechanisms.renewable``).

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
            smoothed Hessian (docs/mechanisms.md §4.3).
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
        optimiser simplex sizes (docs/mechanisms.md §4.1, §4.3: difference step ``1e-4·scale`` when
        ``∇θℓ`` is continuous, ``n^(−1/5)·scale`` otherwise)."""
        return np.ones(self.n_params(x.shape[1]))

    def weights_array(self, weights) -> np.ndarray:
        """Broadcast ``weights`` to shape (len(noised),) (float64)."""
        w = np.asarray(weights, dtype=np.float64)
        return np.broadcast_to(w, (len(self.noised),)) if w.ndim == 0 else w

    def __repr__(self) -> str:
        return f"{type(self).__name__}(noised={self.noised})"
