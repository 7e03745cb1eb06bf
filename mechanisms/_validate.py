"""Argument checks shared by the mechanisms; every failure raises ``ParameterError``
with a message naming the argument and its allowed range."""

from __future__ import annotations

import math

import numpy as np

from mechanisms.errors import ParameterError


def check_open_unit(name: str, value: float) -> float:
    """Return ``value`` as float if it lies in the open interval (0, 1)."""
    v = _as_float(name, value)
    if not 0.0 < v < 1.0:
        raise ParameterError(f"{name} must be in (0, 1), got {value!r}")
    return v


def check_positive(name: str, value: float) -> float:
    """Return ``value`` as float if it is finite and > 0."""
    v = _as_float(name, value)
    if not (math.isfinite(v) and v > 0.0):
        raise ParameterError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def check_finite_array(name: str, x, *, ndim: tuple[int, ...] | None = None) -> np.ndarray:
    """Return ``x`` as a float64 array after checking it has no NaN or infinity.

    ``ndim``, when given, lists the allowed numbers of dimensions.
    """
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"{name} must be an array of real numbers: {exc}") from None
    if ndim is not None and a.ndim not in ndim:
        allowed = " or ".join(str(d) for d in ndim)
        raise ParameterError(f"{name} must have {allowed} dimension(s), got shape {a.shape}")
    if a.size and not np.all(np.isfinite(a)):
        raise ParameterError(f"{name} must contain only finite numbers (no NaN or infinity)")
    return a


def _as_float(name: str, value) -> float:
    if isinstance(value, bool):
        raise ParameterError(f"{name} must be a real number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ParameterError(f"{name} must be a real number, got {value!r}") from None
    if math.isnan(v):
        raise ParameterError(f"{name} must be a real number, got NaN")
    return v
