"""The three transforms of the paper's simulations and their losses ``(θ − g(x))²`` (Lu, Chen &
Qiu 2025, §7.1: ℓ₁ ReLU, ℓ₂ an indicator, ℓ₃ ``|sin 2πx|``), none twice differentiable in x (DR
only), for the reproduction ``benchmarks/repro_zil.py`` (docs/reproductions.md) and the tests of
losses that are continuous but not smooth in x. Each is a
:class:`mechanisms.losses.TransformSquaredLoss`, the library's loss for any such transform."""

from __future__ import annotations

import numpy as np

from mechanisms.losses.location import TransformSquaredLoss


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
