"""Component bookkeeping shared by the k-means and mixture estimators: canonical order, matching
of two fits' components (no label switching), permutation of parameter vectors and matrices, and
the total-variation distance between two diagonal Gaussian mixtures.

Source: docs/mechanisms.md §7.4 (label switching; Hungarian matching by
``scipy.optimize.linear_sum_assignment``).

A fit of ``k`` components stores its parameters in *groups*: every group holds ``width`` numbers
per component, components one after the other. k-means has one group (the centres, width ``p``);
the Gaussian mixture has three (weight logits, width 1; means, width ``p``; log-variances,
width ``p``). A permutation of components is therefore an index vector over the whole parameter
vector (:func:`component_index`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import optimize

from mechanisms._validate import check_finite_array
from mechanisms.errors import ParameterError
from mechanisms.rng import RngLike, as_generator

__all__ = ["canonical_order", "component_index", "match_components", "max_centre_error",
           "mixture_density", "mixture_tv_distance", "permute_fit"]


def canonical_order(centres: np.ndarray) -> np.ndarray:
    """The permutation that sorts components ascending by their first coordinate (ties by the
    next coordinates).

    Parameters
    ----------
    centres : ndarray (k, p)

    Returns
    -------
    ndarray (k,) of int
        ``centres[order]`` is in canonical order.
    """
    c = np.asarray(centres, dtype=np.float64)
    return np.lexsort(c.T[::-1])


def match_components(reference: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Match the components of ``centres`` to those of ``reference`` (Hungarian algorithm on the
    squared distances between centres).

    Parameters
    ----------
    reference, centres : ndarray (k, p)

    Returns
    -------
    ndarray (k,) of int
        ``perm`` with ``centres[perm[j]]`` the match of ``reference[j]``; the total squared
        distance ``Σ_j ‖reference_j − centres_perm[j]‖²`` is minimal.

    Raises
    ------
    ParameterError
        Shapes differ, or a centre is not finite.
    """
    r = check_finite_array("reference", reference, ndim=(2,))
    c = check_finite_array("centres", centres, ndim=(2,))
    if r.shape != c.shape:
        raise ParameterError(f"centres must have the shape of reference {r.shape}, got {c.shape}")
    cost = ((r[:, None, :] - c[None, :, :]) ** 2).sum(axis=2)
    rows, cols = optimize.linear_sum_assignment(cost)
    perm = np.empty(r.shape[0], dtype=np.int64)
    perm[rows] = cols
    return perm


def component_index(perm: Sequence[int], widths: Sequence[int]) -> np.ndarray:
    """Index vector that permutes the components of a parameter vector.

    Parameters
    ----------
    perm : sequence of int (k,)
        New component ``j`` is old component ``perm[j]``.
    widths : sequence of int
        Numbers per component of each parameter group, in storage order (module docstring).

    Returns
    -------
    ndarray (q,) of int
        ``theta[idx]`` is the permuted vector, ``H[np.ix_(idx, idx)]`` the permuted matrix.
    """
    perm = np.asarray(perm, dtype=np.int64)
    k = perm.size
    out, offset = [], 0
    for w in widths:
        out.extend(offset + perm[j] * w + np.arange(w) for j in range(k))
        offset += k * w
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def permute_fit(perm: Sequence[int], widths: Sequence[int], theta: np.ndarray,
                *matrices: np.ndarray) -> tuple[np.ndarray, ...]:
    """``theta`` and square ``matrices`` (q, q) with their components permuted by ``perm``
    (:func:`component_index`); returns ``(theta, *matrices)``."""
    idx = component_index(perm, widths)
    return (np.asarray(theta)[idx], *(np.asarray(m)[np.ix_(idx, idx)] for m in matrices))


def max_centre_error(true_centres: np.ndarray, centres: np.ndarray) -> float:
    """Largest Euclidean error ``max_j ‖ĉ_j − c_j‖`` after matching (:func:`match_components`).

    Parameters
    ----------
    true_centres, centres : ndarray (k, p), same units

    Returns
    -------
    float
    """
    perm = match_components(true_centres, centres)
    return float(np.sqrt(((np.asarray(centres)[perm] - true_centres) ** 2).sum(axis=1)).max())


def _check_mixture(weights, means, variances) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w = check_finite_array("weights", weights, ndim=(1,))
    m = check_finite_array("means", means, ndim=(2,))
    v = check_finite_array("variances", variances, ndim=(2,))
    if m.shape[0] != w.size or v.shape != m.shape:
        raise ParameterError(f"weights (k,), means and variances (k, p) disagree: {w.shape}, {m.shape}, "
                             f"{v.shape}")
    if np.any(w < 0) or not abs(w.sum() - 1.0) < 1e-6:
        raise ParameterError(f"weights must be >= 0 and sum to 1, got {w.tolist()}")
    if np.any(v <= 0):
        raise ParameterError("variances must be > 0")
    return w, m, v


def mixture_density(x: np.ndarray, weights, means, variances) -> np.ndarray:
    """Density of a diagonal Gaussian mixture at the rows of ``x``.

    Parameters
    ----------
    x : ndarray (n, p)
    weights : (k,), summing to 1; means, variances : (k, p), variances > 0

    Returns
    -------
    ndarray (n,)

    Raises
    ------
    ParameterError
        Inconsistent shapes, negative weights, non-positive variances.
    """
    w, m, v = _check_mixture(weights, means, variances)
    x = np.asarray(x, dtype=np.float64)
    logc = np.log(np.maximum(w, 1e-300)) - 0.5 * np.log(2.0 * np.pi * v).sum(axis=1)
    q = (((x[:, None, :] - m[None]) ** 2) / v[None]).sum(axis=2)
    lp = logc[None] - 0.5 * q
    top = lp.max(axis=1)
    return np.exp(top) * np.exp(lp - top[:, None]).sum(axis=1)


def mixture_tv_distance(true_mixture: tuple, fitted_mixture: tuple, *, n_mc: int = 200_000,
                        rng: RngLike = None) -> tuple[float, float]:
    """Total-variation distance between two diagonal Gaussian mixtures, by Monte Carlo.

    ``TV(P, Q) = E_P[(1 − q(X)/p(X))₊]`` with ``X ~ P`` (the true mixture).

    Parameters
    ----------
    true_mixture, fitted_mixture : tuple (weights (k,), means (k, p), variances (k, p))
    n_mc : int
        Monte Carlo draws from the true mixture (≥ 1000).
    rng : Generator, int or None

    Returns
    -------
    (tv, stderr) : floats
        The estimate in [0, 1] and its Monte Carlo standard error.

    Raises
    ------
    ParameterError
        Invalid mixtures or ``n_mc < 1000``.
    """
    if int(n_mc) < 1000:
        raise ParameterError(f"n_mc must be >= 1000, got {n_mc}")
    w, m, v = _check_mixture(*true_mixture)
    gen = as_generator(rng)
    comp = gen.choice(w.size, size=int(n_mc), p=w)
    x = m[comp] + gen.standard_normal((int(n_mc), m.shape[1])) * np.sqrt(v[comp])
    p = mixture_density(x, w, m, v)
    q = mixture_density(x, *fitted_mixture)
    r = np.clip(1.0 - q / p, 0.0, None)
    return float(r.mean()), float(r.std() / np.sqrt(r.size))
