"""Zero-inflated symmetric multivariate Laplace (ZIL) mechanism and its consumer-side doubling.

Source: Lu, Chen & Qiu, "Versatile differentially private learning for general loss functions"
(arXiv 2501.15127), §3; stated in docs/mechanisms.md §1–§2.

* ``SL_d(Σ)``: symmetric multivariate Laplace, sampled as ``sqrt(W) * G`` with ``W ~ Exp(1)``
  and ``G ~ N(0, Σ)``; ``Var = Σ``.
* ``ZIL(δ, λ²I)``: 0 with probability δ (``zero_prob``), else ``SL_d(λ²I)``.

Noise is added in standardized coordinates ``u = (x − low)/(high − low) ∈ [0, 1]^d`` with
covariance ``λ² I`` there; in original units the noise covariance is ``λ² diag(range²)``.
Every method of :class:`ZILMechanism` takes and returns values in original units.
"""

from __future__ import annotations

import numpy as np

from mechanisms._validate import check_finite_array, check_open_unit, check_positive
from mechanisms.errors import ParameterError
from mechanisms.rng import RngLike, as_generator

__all__ = ["ZILMechanism", "sample_sl"]


def sample_sl(n: int, dim: int, variance, rng: RngLike = None) -> np.ndarray:
    """Draw ``n`` independent vectors from the symmetric multivariate Laplace ``SL_dim(Σ)``.

    Parameters
    ----------
    n, dim : int
        Number of draws (≥ 0) and dimension (≥ 1).
    variance : float or array of shape (dim,)
        Diagonal of Σ (a scalar means ``variance · I``); every entry ≥ 0.
    rng : Generator, int or None
        Random source; ``None`` seeds from OS entropy.

    Returns
    -------
    ndarray of shape (n, dim), float64
        ``sqrt(W_i) * G_i`` with ``W_i ~ Exp(1)`` shared by the coordinates of draw ``i`` and
        ``G_i ~ N(0, Σ)``. Each draw has covariance Σ (docs/mechanisms.md §1.1; paper §3.1).

    Raises
    ------
    ParameterError
        If ``n < 0``, ``dim < 1`` or a variance is negative or not finite.
    """
    n, dim = _check_count("n", n, 0), _check_count("dim", dim, 1)
    var = check_finite_array("variance", variance, ndim=(0, 1))
    if var.ndim == 1 and var.shape != (dim,):
        raise ParameterError(f"variance must be a scalar or have shape ({dim},), got {var.shape}")
    if np.any(var < 0):
        raise ParameterError("variance must be >= 0")
    gen = as_generator(rng)
    w = gen.standard_exponential(n)
    g = gen.standard_normal((n, dim))
    return g * np.sqrt(w)[:, None] * np.sqrt(var)


class ZILMechanism:
    """ZIL(δ, λ²I) mechanism on a bounded box, applied on the client (docs/mechanisms.md §1.2;
    paper Definition 3.1).

    Parameters
    ----------
    zero_prob : float
        δ ∈ (0, 1): the probability that a report is released **unperturbed** (exact value).
    scale : float
        λ > 0: noise standard deviation in standardized coordinates (per unit of range).
    low, high : float or array of shape (d,)
        Per-coordinate bounds in original units; ``low < high`` everywhere. Values are clipped
        into ``[low, high]`` before noise; without bounds there is no guarantee.

    Attributes
    ----------
    dim : int
        d, the number of coordinates of one report.
    ranges : ndarray (d,)
        ``high − low``.
    coord_scale : ndarray (d,)
        ``λ · (high − low)``: noise standard deviation per coordinate in original units.
    c_record, c_attribute : float
        f-DP parameters: ``c_I = √d / λ`` (record level) and ``c_A = 1 / λ`` (attribute level).

    Raises
    ------
    ParameterError
        If zero_prob ∉ (0, 1), scale ≤ 0, a bound is not finite, shapes differ, or low ≥ high.
    """

    def __init__(self, zero_prob: float, scale: float, low, high) -> None:
        self.zero_prob = check_open_unit("zero_prob", zero_prob)
        self.scale = check_positive("scale", scale)
        lo = np.atleast_1d(check_finite_array("low", low, ndim=(0, 1)))
        hi = np.atleast_1d(check_finite_array("high", high, ndim=(0, 1)))
        if lo.shape != hi.shape:
            raise ParameterError(f"low and high must have the same shape, got {lo.shape} and {hi.shape}")
        if lo.size == 0:
            raise ParameterError("low and high must have at least one coordinate")
        bad = np.flatnonzero(lo >= hi)
        if bad.size:
            j = int(bad[0])
            raise ParameterError(
                f"low must be < high for every coordinate, got low[{j}]={lo[j]} >= high[{j}]={hi[j]}"
            )
        self.low = lo
        self.high = hi
        self.dim = int(lo.size)
        self.ranges = hi - lo
        self.coord_scale = self.scale * self.ranges

    @property
    def c_record(self) -> float:
        """Record-level f-DP parameter ``c_I = diam / λ = √d / λ`` (standardized box)."""
        return float(np.sqrt(self.dim) / self.scale)

    @property
    def c_attribute(self) -> float:
        """Attribute-level f-DP parameter ``c_A = 1 / λ``."""
        return float(1.0 / self.scale)

    @property
    def noise_variance(self) -> np.ndarray:
        """Diagonal of the SL covariance ``λ² range²`` in original units, shape (d,)."""
        return self.coord_scale**2

    def clip(self, x) -> tuple[np.ndarray, np.ndarray]:
        """Clip values into the box.

        Parameters
        ----------
        x : array of shape (d,) or (n, d)

        Returns
        -------
        clipped : ndarray, same shape as ``x``
        was_clipped : ndarray of bool, shape () or (n,)
            Whether any coordinate of the row was out of bounds.

        Raises
        ------
        ParameterError
            On NaN/inf or a dimension mismatch.
        """
        a = self._check_x(x)
        clipped = np.clip(a, self.low, self.high)
        was = np.any(clipped != a, axis=-1)
        return clipped, was

    def privatize(self, x, rng: RngLike = None) -> np.ndarray:
        """Release ``X̃₁ = clip(X) + Z`` with ``Z ~ ZIL(δ, λ² diag(range²))``.

        One multivariate draw per report: the zero indicator and ``W`` are shared by all
        coordinates of a row (docs/mechanisms.md §1.3 — DR/SDR rely on the joint law).

        Parameters
        ----------
        x : array of shape (d,) or (n, d), original units
        rng : Generator, int or None
            ``None`` seeds from OS entropy.

        Returns
        -------
        ndarray, same shape as ``x``, float64
        """
        a = self._check_x(x)
        rows = np.atleast_2d(np.clip(a, self.low, self.high))
        gen = as_generator(rng)
        n = rows.shape[0]
        noise = sample_sl(n, self.dim, self.noise_variance, gen)
        keep = gen.random(n) < self.zero_prob
        noise[keep] = 0.0
        out = rows + noise
        return out[0] if a.ndim == 1 else out

    def double(self, x1, rng: RngLike = None) -> np.ndarray:
        """Consumer-side doubling ``X̃₂ = X̃₁ + S′`` with ``S′ ~ SL_d(δ λ² diag(range²))``.

        Post-processing of a released report: then ``X̃₂ − X ~ SL_d(λ² diag(range²))`` exactly
        (docs/mechanisms.md §2.1, paper Algorithm 1: characteristic functions multiply to ``1/(1 + tᵀΣt/2)``).

        Parameters
        ----------
        x1 : array of shape (d,) or (n, d)
            Released reports ``X̃₁`` in original units.

        Returns
        -------
        ndarray, same shape as ``x1``
        """
        a = self._check_x(x1, name="x1")
        rows = np.atleast_2d(a)
        extra = sample_sl(rows.shape[0], self.dim, self.zero_prob * self.noise_variance, rng)
        out = rows + extra
        return out[0] if a.ndim == 1 else out

    def _check_x(self, x, name: str = "x") -> np.ndarray:
        a = check_finite_array(name, x, ndim=(1, 2))
        if a.shape[-1] != self.dim:
            raise ParameterError(
                f"{name} must have {self.dim} coordinate(s) in its last axis, got shape {a.shape}"
            )
        return a

    def __repr__(self) -> str:
        return (
            f"ZILMechanism(zero_prob={self.zero_prob}, scale={self.scale}, "
            f"low={self.low.tolist()}, high={self.high.tolist()})"
        )


def _check_count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ParameterError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ParameterError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)
