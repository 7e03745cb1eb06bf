"""Corrected losses for ZIL-privatized records: DR, SDR, SL, naive and oracle.

Source: Lu, Chen & Qiu (arXiv 2501.15127) §4 (DR), §6 (SL, SDR); docs/mechanisms.md §2.3–§2.6.
Noise here is in original units with a per-coordinate SL covariance ``Σ = diag(σ_j²)``,
``σ_j = λ·(high_j − low_j)`` (``ZILMechanism.coord_scale``), so the Laplacian correction is
``½ Σ_j σ_j² ∂²ℓ/∂x_j²`` over the noised columns (the paper writes the ``λ²I`` case;
docs/mechanisms.md §2.4).

With ``X̃₁ = X + Z``, ``Z ~ ZIL(δ, Σ)`` and ``X̃₂ = X̃₁ + S′``, ``S′ ~ SL(δΣ)``:

* DR:    ``[ℓ(x₁, θ) − (1 − δ) ℓ(x₂, θ)] / δ``                   (any ℓ continuous in x)
* SL:    ``ℓ(x₂, θ) − ½ Σ_j σ_j² ∂²ℓ(x₂, θ)/∂x_j²``              (ℓ twice differentiable in x)
* SDR:   ``ℓ(x₁, θ) − (1 − δ) ½ Σ_j σ_j² ∂²ℓ(x₂, θ)/∂x_j²``      (same)
* naive: ``ℓ(x₁, θ)`` (biased baseline); oracle: ``ℓ(x, θ)`` with ``x₁`` the raw data.

Each has expectation ``E ℓ(X, θ)`` (DR/SL/SDR).
"""

from __future__ import annotations

import numpy as np

from mechanisms._validate import check_finite_array, check_open_unit
from mechanisms.errors import ParameterError
from mechanisms.losses import Loss

__all__ = ["METHODS", "CorrectedLoss", "corrected_loss"]

#: The supported correction methods.
METHODS = ("dr", "sdr", "sl", "naive", "oracle")
_NEED_DELTA = {"dr", "sdr"}
_NEED_VAR = {"sdr", "sl"}
_NEED_X2 = {"dr", "sdr", "sl"}


class CorrectedLoss:
    """A corrected loss ``ℓ_*(x₁, x₂, θ)`` built by :func:`corrected_loss`.

    Attributes
    ----------
    loss : Loss
    method : str
        One of :data:`METHODS`.
    zero_prob : float or None
        δ (DR, SDR).
    noise_var : ndarray (len(loss.noised),) or None
        ``σ_j²`` per noised column in units of x² (SDR, SL).
    needs_x1, needs_x2 : bool
        Which of the two released copies the method reads.

    Notes
    -----
    ``value``/``grad`` do no validation: they are the per-mini-batch hot path of the online
    aggregator. Validate records once with ``loss.check_x``.
    """

    __slots__ = ("_a", "_b", "_c", "loss", "method", "needs_x1", "needs_x2", "noise_var", "zero_prob")

    def __init__(self, loss: Loss, method: str, zero_prob: float | None, noise_var: np.ndarray | None):
        self.loss = loss
        self.method = method
        self.zero_prob = zero_prob
        self.noise_var = noise_var
        self.needs_x2 = method in _NEED_X2
        self.needs_x1 = method != "sl"
        # coefficients: value = a·ℓ(x1) − b·ℓ(x2) − c·Δ_σ²ℓ(x2)
        d = zero_prob
        self._a = {"dr": None if d is None else 1.0 / d, "sl": 0.0}.get(method, 1.0)
        self._b = (1.0 - d) / d if method == "dr" else 0.0
        self._c = {"sl": 0.5, "sdr": None if d is None else 0.5 * (1.0 - d)}.get(method, 0.0)

    def value(self, x1: np.ndarray | None, x2: np.ndarray | None, theta: np.ndarray) -> np.ndarray:
        """Per-record corrected loss.

        Parameters
        ----------
        x1 : (n, p) or None
            Released ``X̃₁`` (raw ``X`` for oracle). Ignored (may be None) for SL.
        x2 : (n, p) or None
            Doubled ``X̃₂``; ignored for naive/oracle.
        theta : (q,)

        Returns
        -------
        ndarray (n,)
        """
        m, L = self.method, self.loss
        if m in ("naive", "oracle"):
            return L.value(x1, theta)
        if m == "dr":
            return self._a * L.value(x1, theta) - self._b * L.value(x2, theta)
        lap = L.laplacian_x(x2, theta, self.noise_var)
        if m == "sl":
            return L.value(x2, theta) - 0.5 * lap
        return L.value(x1, theta) - self._c * lap

    def grad(self, x1: np.ndarray | None, x2: np.ndarray | None, theta: np.ndarray) -> np.ndarray:
        """Per-record θ-gradient of the corrected loss, (n, q). Same arguments as :meth:`value`."""
        m, L = self.method, self.loss
        if m in ("naive", "oracle"):
            return L.grad(x1, theta)
        if m == "dr":
            g = L.grad(x1, theta)
            g *= self._a
            g -= self._b * L.grad(x2, theta)
            return g
        glap = L.grad_laplacian_x(x2, theta, self.noise_var)
        if m == "sl":
            g = L.grad(x2, theta)
            g -= 0.5 * glap
            return g
        g = L.grad(x1, theta)
        g -= self._c * glap
        return g

    def objective(self, x1, x2, theta) -> float:
        """Mean corrected loss over the batch (float)."""
        return float(np.mean(self.value(x1, x2, theta)))

    def mean_grad(self, x1, x2, theta) -> np.ndarray:
        """Mean corrected gradient over the batch, (q,)."""
        return self.grad(x1, x2, theta).mean(axis=0)

    def __repr__(self) -> str:
        return f"CorrectedLoss({self.loss!r}, method={self.method!r}, zero_prob={self.zero_prob})"


def corrected_loss(
    loss: Loss, method: str, zero_prob: float | None = None, noise_var=None, *, force: bool = False
) -> CorrectedLoss:
    """Build the corrected loss of ``loss`` for ``method`` (docs/mechanisms.md §2.3–§2.6; paper §4, §6).

    Parameters
    ----------
    loss : Loss
    method : {"dr", "sdr", "sl", "naive", "oracle"}
    zero_prob : float, optional
        δ ∈ (0, 1); required for "dr" and "sdr".
    noise_var : float or array of shape (len(loss.noised),), optional
        SL covariance diagonal ``σ_j² = (λ·range_j)²`` per noised column, units of x²; each ≥ 0.
        Required for "sdr" and "sl".
    force : bool
        Apply SL/SDR to a loss with ``smooth=False`` using its almost-everywhere derivatives
        (e.g. the paper §7.1 SL baseline on ReLU/indicator/|sin| transforms). Biased; for
        comparisons only.

    Returns
    -------
    CorrectedLoss

    Raises
    ------
    ParameterError
        Unknown method; zero_prob ∉ (0, 1) or missing; noise_var missing, negative, not finite
        or of the wrong length; SL/SDR on a loss that is not twice differentiable in its
        noised columns (DR is required).
    """
    if not isinstance(loss, Loss):
        raise ParameterError(f"loss must be a mechanisms.losses.Loss, got {type(loss).__name__}")
    if method not in METHODS:
        raise ParameterError(f"method must be one of {METHODS}, got {method!r}")
    d = None
    if method in _NEED_DELTA:
        if zero_prob is None:
            raise ParameterError(f"zero_prob is required for method={method!r}; it must be in (0, 1)")
        d = check_open_unit("zero_prob", zero_prob)
    elif zero_prob is not None:
        d = check_open_unit("zero_prob", zero_prob)
    var = None
    if method in _NEED_VAR:
        if not loss.smooth and not force:
            raise ParameterError(
                f"method={method!r} needs a loss twice differentiable in its noised columns; "
                f"{loss.name} is not smooth — DR is required (method='dr')"
            )
        if noise_var is None:
            raise ParameterError(f"noise_var is required for method={method!r} (sigma_j^2 >= 0)")
        var = check_noise_var(loss, noise_var)
    return CorrectedLoss(loss, method, d, var)


def check_noise_var(loss: Loss, noise_var) -> np.ndarray:
    """Validate ``noise_var`` against ``loss.noised``; returns shape (len(noised),).

    Raises
    ------
    ParameterError
        If not finite, negative, or of the wrong length.
    """
    v = check_finite_array("noise_var", noise_var, ndim=(0, 1))
    k = len(loss.noised)
    if v.ndim == 0:
        v = np.full(k, float(v))
    elif v.shape != (k,):
        raise ParameterError(
            f"noise_var must be a scalar or have shape ({k},) (one per noised column), got {v.shape}"
        )
    if np.any(v < 0):
        raise ParameterError("noise_var must be >= 0")
    return v
