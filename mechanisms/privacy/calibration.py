"""Calibration: the noise scale of ZIL that meets a target (ε, δ̃).

Lu, Chen & Qiu (2025), §3.2 after Theorem 3.3.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from scipy import optimize

from mechanisms._validate import check_open_unit, check_positive
from mechanisms.errors import ParameterError
from mechanisms.privacy._numerics import (
    _FLOAT_MAX,
    _SQRT2,
    _check_delta_target,
    _check_dim,
    _check_epsilon_array,
)
from mechanisms.privacy.conversion import delta_for_epsilon

__all__ = ["calibrate_c", "calibrate_zil"]

def calibrate_c(epsilon: float, delta: float, zero_prob: float, dim: int | None = None) -> float:
    """Largest shift ``c′`` whose ZIL trade-off is (ε, δ)-DP: solves ``δ̃_{c′,δ₀}(ε) = δ``.

    Parameters
    ----------
    epsilon : float
        Target ε′ ≥ 0.
    delta : float
        Target δ′ ∈ (zero_prob, 1).
    zero_prob : float
        δ₀ ∈ (0, 1): probability of an exact release.
    dim : int or None
        ``1``: exact Laplace conversion, closed form
        ``c′ = (ε′ − 2 log((1 − δ′)/(1 − δ₀)))/√2``. ``None`` or ``≥ 2``: the β_c bound
        (brentq, ``|Δc| ≤ 1e-12``), valid for every d.

    Returns
    -------
    float
        ``c′ > 0``. Any ``c ≤ c′`` also satisfies (ε′, δ′)-DP (Prop. 3.1(i)).

    Raises
    ------
    ParameterError
        If ε′ < 0 / not finite, zero_prob ∉ (0, 1), δ′ ∉ (0, 1) or δ′ ≤ zero_prob (impossible:
        δ̃ ≥ zero_prob always).

    Notes
    -----
    Source: paper §3.2 after Thm 3.3 and Fig. 1(b) (ε′ = 0.8, δ′ = 0.17, δ₀ = 0.05 → c′ ≈ 0.50252);
    docs/privacy.md §2.7.
    """
    eps = float(_check_epsilon_array(epsilon)) if np.ndim(epsilon) == 0 else None
    if eps is None:
        raise ParameterError(f"epsilon must be a single finite number >= 0, got {epsilon!r}")
    zp = check_open_unit("zero_prob", zero_prob)
    dl = _check_delta_target(delta, zp)
    d = _check_dim(dim)
    if d == 1:
        return (eps - 2.0 * math.log((1.0 - dl) / (1.0 - zp))) / _SQRT2

    def f(c: float) -> float:
        return float(delta_for_epsilon(eps, c, zp, None)) - dl

    # as c → 0, δ_c(ε) ≈ c/√2 at ε = 0 and O(c²) at ε > 0; as c → ∞, δ_c(ε) ≈ 1 − e^(−c²/(2ε)),
    # so every δ′ < 1 at every ε up to the float range is met by some c ≲ 2e155
    lo = 1e-6
    while f(lo) >= 0.0:
        lo /= 10.0
        if lo < 1e-300:
            raise ParameterError(
                f"delta={dl} is too close to zero_prob={zp} for epsilon={eps}: no c >= 1e-300 works"
            )
    hi = 1.0
    while f(hi) <= 0.0:
        lo, hi = hi, hi * 2.0
        if hi > _FLOAT_MAX / 2.0:  # pragma: no cover - f(hi) > 0 long before (see above)
            raise ParameterError(f"cannot calibrate: delta={dl} at epsilon={eps} needs c > {hi:.6g}")
    return float(optimize.brentq(f, lo, hi, xtol=1e-14, rtol=1e-13))


def calibrate_zil(
    epsilon: float, delta: float, zero_prob: float, diameter: float, dim: int | None = None
) -> float:
    """Noise scale λ so that ZIL(zero_prob, λ²I) is (ε, δ)-DP: ``λ = diameter / c′``.

    Parameters
    ----------
    epsilon, delta : float
        Target (ε′, δ′), ε′ ≥ 0 and zero_prob < δ′ < 1.
    zero_prob : float
        δ₀ ∈ (0, 1).
    diameter : float
        Diameter of the protected set in the noise coordinates (> 0): ``√d`` for a whole report
        on the standardized box (record level), ``1`` for one field (attribute level).
    dim : int or None
        See :func:`calibrate_c` (``1`` uses the exact Laplace conversion).

    Returns
    -------
    float
        Scale λ > 0 (noise standard deviation per unit of field range).

    Raises
    ------
    ParameterError
        As :func:`calibrate_c`, if ``diameter`` is not a finite number > 0, and if
        ``diameter / c′`` leaves the range of normal floats (below 2.2e-308 or above 1.8e308).

    Notes
    -----
    Source: paper §3.2 after Thm 3.3; docs/privacy.md §2.7.
    """
    diam = check_positive("diameter", diameter)
    c = calibrate_c(epsilon, delta, zero_prob, dim)
    scale = diam / c
    if not sys.float_info.min <= scale <= _FLOAT_MAX:
        raise ParameterError(
            f"scale = diameter / c = {diam:.6g} / {c:.6g} = {scale:.6g} is outside the range of normal "
            f"floats [{sys.float_info.min:.6g}, {_FLOAT_MAX:.6g}]: no usable noise scale for this diameter "
            "and target"
        )
    return scale
