"""Batch fits of k-means and Gaussian mixtures on ZIL reports, in original units, with their
components in canonical order and the components the data do not identify named.

Source: docs/mechanisms.md §7. The fits run in box-standardized coordinates
``u = (x − mid)/half`` (``mid``, ``half`` = centre and half-width of the schema bounds: every field
counts alike in the k-means distance, and the SL noise standard deviation there is ``2λ``); the
result is mapped back with the delta method.

Parameter names (``names`` = the fields):

* k-means: ``"<j>.<field>"``, the centre of component ``j``;
* Gaussian mixture: ``"<j>.weight"``, ``"<j>.mean.<field>"``, ``"<j>.var.<field>"``;

with ``j = 0 … k−1`` ascending by the first field's centre.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats
from scipy.special import softmax

from mechanisms._validate import check_finite_array, check_open_unit
from mechanisms.errors import ConvergenceWarning, ParameterError
from mechanisms.mixtures.components import canonical_order, permute_fit
from mechanisms.mixtures.deconvolution import DeconvolutionMixtureLoss
from mechanisms.mixtures.gaussian import GaussianMixtureLoss
from mechanisms.mixtures.kmeans import KMeansLoss, _nearest, stacked

__all__ = ["KMEANS_METHODS", "MIXTURE_METHODS", "MixtureFit", "fit_gaussian_mixture", "fit_kmeans",
           "mixture_loss", "parameter_names", "present", "unidentified_components"]

#: Estimators of the k-means centres.
KMEANS_METHODS = ("dr", "naive", "oracle")
#: Estimators of a Gaussian mixture ("deconvolution": the exact likelihood of the reports).
MIXTURE_METHODS = ("deconvolution", "dr", "naive", "oracle")
#: A component with fewer reports than this per parameter of it is not identified.
MIN_REPORTS_PER_COMPONENT_PARAM = 10


@dataclass(frozen=True, eq=False)
class MixtureFit:
    """A fitted k-means or Gaussian mixture, original units, canonical order (immutable).

    Attributes
    ----------
    kind : {"kmeans", "gaussian_mixture"}
    method : str
        One of :data:`KMEANS_METHODS` / :data:`MIXTURE_METHODS`.
    k : int
    fields : tuple of str
    params : tuple of str
        Parameter names (module docstring).
    value, stderr : ndarray (q,)
        Estimates and standard errors; ``stderr`` is ``inf`` for the parameters of an
        unidentified component.
    cov : ndarray (q, q)
    n : int
        Reports fitted.
    converged : bool
    unidentified : dict int → str
        Component (canonical index) → why the data do not determine it.
    level : float
    """

    kind: str
    method: str
    k: int
    fields: tuple[str, ...]
    params: tuple[str, ...]
    value: np.ndarray
    stderr: np.ndarray
    cov: np.ndarray
    n: int
    converged: bool
    unidentified: dict = field(default_factory=dict)
    level: float = 0.95

    def ci(self, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Wald intervals ``value ± z·stderr`` at ``level`` (default :attr:`level`)."""
        lv = self.level if level is None else check_open_unit("level", level)
        z = stats.norm.ppf(0.5 + 0.5 * lv)
        return self.value - z * self.stderr, self.value + z * self.stderr

    def _block(self, kind: str) -> np.ndarray:
        p = len(self.fields)
        if self.kind == "kmeans":
            if kind != "mean":
                raise ParameterError("a k-means fit has centres only")
            return self.value.reshape(self.k, p)
        off = {"weight": 0, "mean": self.k, "var": self.k + self.k * p}[kind]
        width = 1 if kind == "weight" else p
        out = self.value[off:off + self.k * width].reshape(self.k, width)
        return out[:, 0] if kind == "weight" else out

    @property
    def centres(self) -> np.ndarray:
        """Centres / means (k, p), original units."""
        return self._block("mean")

    @property
    def weights(self) -> np.ndarray:
        """Mixture weights (k,) (Gaussian mixture only)."""
        return self._block("weight")

    @property
    def variances(self) -> np.ndarray:
        """Component variances (k, p), original units squared (Gaussian mixture only)."""
        return self._block("var")


def parameter_names(kind: str, k: int, fields: Sequence[str]) -> tuple[str, ...]:
    """The parameter names of a fit (module docstring)."""
    if kind == "kmeans":
        return tuple(f"{j}.{f}" for j in range(k) for f in fields)
    return (tuple(f"{j}.weight" for j in range(k)) + tuple(f"{j}.mean.{f}" for j in range(k) for f in fields)
            + tuple(f"{j}.var.{f}" for j in range(k) for f in fields))


def mixture_loss(kind: str, method: str, k: int, p: int, *, zero_prob: float | None = None,
                 noise_var=None, n_init: int = 5, seed: int = 0):
    """The loss of a fit in box-standardized coordinates (box ``[−1, 1]^p``) and the corrected
    method it is used with: ``(loss, closs_method)``.

    Parameters
    ----------
    kind : {"kmeans", "gaussian_mixture"}
    method : str
        :data:`KMEANS_METHODS` or :data:`MIXTURE_METHODS`.
    k, p : int
    zero_prob : float, optional
        δ; needed for "dr" and "deconvolution".
    noise_var : float or array (p,), optional
        SL variance per field in standardized units, ``(2λ)²``; needed for "deconvolution".

    Raises
    ------
    ParameterError
        Unknown kind or method, or a missing privacy parameter.
    """
    box = (-1.0, 1.0)
    if kind == "kmeans":
        if method not in KMEANS_METHODS:
            raise ParameterError(f"method must be one of {KMEANS_METHODS} for k-means, got {method!r}")
        return KMeansLoss(k, p, box=box, n_init=n_init, seed=seed), method
    if kind != "gaussian_mixture":
        raise ParameterError(f"kind must be 'kmeans' or 'gaussian_mixture', got {kind!r}")
    if method not in MIXTURE_METHODS:
        raise ParameterError(f"method must be one of {MIXTURE_METHODS} for a Gaussian mixture, "
                             f"got {method!r}")
    if method == "deconvolution":
        if zero_prob is None or noise_var is None:
            raise ParameterError("method 'deconvolution' needs zero_prob (in (0, 1)) and the noise scale")
        return DeconvolutionMixtureLoss(k, p, zero_prob=zero_prob, noise_var=noise_var, box=box,
                                        n_init=n_init, seed=seed), "naive"
    return GaussianMixtureLoss(k, p, box=box, n_init=n_init, seed=seed), method


def unidentified_components(loss, theta: np.ndarray, H: np.ndarray | None, n: int,
                            cell_weights: np.ndarray | None = None) -> dict[int, str]:
    """Components (fit order) the data do not determine, with the reason.

    * k-means: a centre on the box (the fit keeps it inside; raw values are), or a cell whose corrected
      weight ``N₁ⱼ − (1−δ)N₂ⱼ`` (or, without data, the diagonal block ``≈ 2·W_j`` of ``H``) is
      not positive — the DR-Lloyd denominator;
    * mixtures: a weight below ``10·(1 + 2p)/n`` (fewer than 10 reports per parameter of the
      component), or a mean or variance on the bound of the fit;
    * any: a diagonal block of ``H`` that is not positive definite, or a non-finite estimate.

    Parameters
    ----------
    loss : KMeansLoss or GaussianMixtureLoss, in box-standardized coordinates (box [−1, 1]^p)
    theta : ndarray (q,); H : ndarray (q, q) or None (the summed or mean corrected Hessian)
    n : int
    cell_weights : ndarray (k,), optional
        k-means corrected cell weights at θ (batch fits).

    Returns
    -------
    dict int → str
    """
    from mechanisms.renewable import is_positive_definite

    k, p = loss.k, loss.p
    out: dict[int, str] = {}
    if not np.all(np.isfinite(theta)):
        return {j: "its estimate is not finite" for j in range(k)}
    if isinstance(loss, KMeansLoss):
        C = loss.centres(theta)
        for j in np.flatnonzero(loss.held_on_box(C)):
            out[int(j)] = ("its centre is held on the fields' bounds: the reports would place it outside "
                           "them, where no raw value is (too few reports near it; fewer components may "
                           "fit)")
        if cell_weights is not None:
            for j in np.flatnonzero(np.asarray(cell_weights) <= 0):
                out[int(j)] = ("its corrected cell weight N1 - (1 - zero_prob) N2 (the DR-Lloyd denominator) "
                               "is not positive "
                               "(too few reports near this centre; fewer components may fit)")
        if H is not None:
            for j in range(k):
                blk = H[j * p:(j + 1) * p, j * p:(j + 1) * p]
                if j not in out and not is_positive_definite(0.5 * (blk + blk.T)):
                    out[j] = "its block of the corrected Hessian is not positive definite"
        return out
    w = softmax(theta[:k])
    need = MIN_REPORTS_PER_COMPONENT_PARAM * (1 + 2 * p)
    b = np.array(loss.bounds(np.zeros((1, p))))
    for j in range(k):
        idx = np.concatenate([[j], k + j * p + np.arange(p), k + k * p + j * p + np.arange(p)])
        tol = 1e-6 * np.maximum(1.0, np.abs(b[idx]).max(axis=1))
        on_bound = np.any((np.abs(theta[idx][1:] - b[idx][1:, 0]) <= tol[1:])
                          | (np.abs(theta[idx][1:] - b[idx][1:, 1]) <= tol[1:]))
        if w[j] * n < need:
            out[j] = (f"its weight {w[j]:.3g} leaves fewer than {MIN_REPORTS_PER_COMPONENT_PARAM} reports "
                      "per parameter (fewer components may fit)")
        elif on_bound:
            out[j] = "its mean or variance is on the bound of the fit (the data do not determine it)"
        elif H is not None:
            blk = H[np.ix_(idx, idx)]
            if not is_positive_definite(0.5 * (blk + blk.T)):
                out[j] = "its block of the corrected Hessian is not positive definite"
    return out


def present(loss, theta: np.ndarray, cov: np.ndarray, mid: np.ndarray, half: np.ndarray,
            unidentified: dict[int, str]) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """A standardized fit in original units and canonical order.

    Parameters
    ----------
    loss : KMeansLoss or GaussianMixtureLoss (or its deconvolution subclass)
    theta : ndarray (q,); cov : ndarray (q, q), standardized coordinates, fit order
    mid, half : ndarray (p,)
        Centre and half-width of the box: ``x = mid + half·u``.
    unidentified : dict int → str, in fit order

    Returns
    -------
    (value (q,), cov (q, q), unidentified in canonical order)
        Parameters of unidentified components get an infinite variance.
    """
    k, p = loss.k, loss.p
    order = canonical_order(loss.centres(theta) * half + mid)
    theta, cov = permute_fit(order, loss.widths, theta, cov)
    rank = {int(old): new for new, old in enumerate(order)}
    bad = {rank[j]: why for j, why in unidentified.items()}
    if isinstance(loss, KMeansLoss):
        J = np.diag(np.tile(half, k))
        value = np.tile(mid, k) + J.diagonal() * theta
    else:
        w = softmax(theta[:k])
        v = np.exp(theta[k + k * p:])
        J = np.zeros((theta.size, theta.size))
        J[:k, :k] = np.diag(w) - np.outer(w, w)
        J[k:k + k * p, k:k + k * p] = np.diag(np.tile(half, k))
        J[k + k * p:, k + k * p:] = np.diag(np.tile(half ** 2, k) * v)
        value = np.concatenate([w, np.tile(mid, k) + np.tile(half, k) * theta[k:k + k * p],
                                np.tile(half ** 2, k) * v])
    with np.errstate(invalid="ignore", over="ignore"):
        out = J @ cov @ J.T
    for j in bad:
        for g, width in enumerate(loss.widths):
            off = sum(k * w_ for w_ in loss.widths[:g])
            sl = slice(off + j * width, off + (j + 1) * width)
            out[sl, :] = 0.0
            out[:, sl] = 0.0
            out[sl, sl] = np.diag(np.full(width, np.inf))
    return value, out, bad


def _standardize(name: str, x, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    a = check_finite_array(name, x, ndim=(1, 2))
    a = a[:, None] if a.ndim == 1 else a
    if a.shape[1] != low.size:
        raise ParameterError(f"{name} must have {low.size} column(s) (one per field), got shape {a.shape}")
    return (a - (low + high) / 2.0) / ((high - low) / 2.0)


def _bounds(low, high) -> tuple[np.ndarray, np.ndarray]:
    if low is None or high is None:
        raise ParameterError("low and high (the fields' bounds, finite, low < high) are required: the fit "
                             "standardizes by them and ZIL noise is scaled to them")
    lo = np.atleast_1d(check_finite_array("low", low, ndim=(0, 1)))
    hi = np.atleast_1d(check_finite_array("high", high, ndim=(0, 1)))
    if lo.shape != hi.shape or np.any(lo >= hi):
        raise ParameterError(f"low and high must have the same shape and low < high, got {lo} and {hi}")
    return lo, hi


def _fit(kind: str, x1, x2, k: int, low, high, zero_prob, scale, method: str, fields, n_init: int,
         seed: int, level: float) -> MixtureFit:
    from mechanisms.estimation import m_estimate

    lo, hi = _bounds(low, high)
    p = lo.size
    mid, half = (lo + hi) / 2.0, (hi - lo) / 2.0
    u1 = _standardize("x1", x1, lo, hi)
    names = tuple(fields) if fields is not None else tuple(f"x{j}" for j in range(p))
    if len(names) != p:
        raise ParameterError(f"fields must name {p} column(s), got {len(names)}")
    needs_dr = method in ("dr", "deconvolution")
    d = check_open_unit("zero_prob", zero_prob) if needs_dr or zero_prob is not None else None
    s_u = None
    if scale is not None:
        s = np.broadcast_to(check_finite_array("scale", scale, ndim=(0, 1)), (p,))
        if np.any(s <= 0):
            raise ParameterError("scale (noise standard deviation per field, original units) must be > 0")
        s_u = s / half
    loss, cm = mixture_loss(kind, method, k, p, zero_prob=d, noise_var=None if s_u is None else s_u ** 2,
                            n_init=n_init, seed=seed)
    u2 = None
    if cm == "dr":
        if x2 is None:
            raise ParameterError("method 'dr' needs x2, the doubled reports "
                                 "(mechanisms.zil.ZILMechanism.double)")
        u2 = _standardize("x2", x2, lo, hi)
        if u2.shape != u1.shape:
            raise ParameterError(f"x2 must have the shape of x1 {u1.shape}, got {u2.shape}")
    need = MIN_REPORTS_PER_COMPONENT_PARAM * loss.n_params(p) // k
    if u1.shape[0] < need:
        raise ParameterError(f"k = {k} components in {p} field(s) need at least {need} reports, "
                             f"got {u1.shape[0]}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        est = m_estimate(loss, u1, u2, zero_prob=d, method=cm, level=level)
    theta = np.asarray(est.theta)
    cw = None
    if kind == "kmeans":
        from mechanisms.corrected import corrected_loss

        z, w = stacked(corrected_loss(loss, cm, d), u1, u2)
        a, _ = _nearest(z, (z * z).sum(axis=1), loss.centres(theta))
        cw = np.bincount(a, w, minlength=k)
    V = est.info.get("V")
    bad = unidentified_components(loss, theta, V, u1.shape[0], cw)
    cov = np.asarray(est.cov)
    if not np.all(np.isfinite(cov)):  # V is not positive definite: no sandwich for any component
        for j in range(k):
            bad.setdefault(j, "the corrected Hessian at the fit is not positive definite (the data do not "
                              "determine the fit; see the components named for the reason)")
    value, cov_out, bad = present(loss, theta, np.where(np.isfinite(cov), cov, 0.0), mid, half, bad)
    se = np.sqrt(np.clip(np.diag(cov_out), 0.0, None))
    for msg in caught:
        if not issubclass(msg.category, ConvergenceWarning):
            warnings.warn_explicit(msg.message, msg.category, msg.filename, msg.lineno)
    if not est.converged:
        warnings.warn(f"{kind} fit ({method}) did not converge ({est.info.get('how')})", ConvergenceWarning,
                      stacklevel=3)
    return MixtureFit(kind, method, k, names, parameter_names(kind, k, names), value, se, cov_out,
                      u1.shape[0], bool(est.converged), bad, level)


def fit_kmeans(x1, x2=None, *, k: int, low, high, zero_prob: float | None = None, method: str = "dr",
               fields: Sequence[str] | None = None, n_init: int = 5, seed: int = 0,
               level: float = 0.95) -> MixtureFit:
    """DR k-means centres of ZIL reports with sandwich standard errors (docs/mechanisms.md §7.2).

    Parameters
    ----------
    x1 : array (n, p)
        Released reports ``X̃₁``, original units (raw values for ``method = "oracle"``).
    x2 : array (n, p), optional
        Doubled reports ``X̃₂`` (required for "dr").
    k : int
        Centres, 1 … 50.
    low, high : arrays (p,)
        The fields' bounds (the schema's); required.
    zero_prob : float, optional
        δ ∈ (0, 1); required for "dr".
    method : {"dr", "naive", "oracle"}
    fields : sequence of str, optional
        Field names for the parameter names (default ``x0, x1, …``).
    n_init, seed : int
        Restarts of the fit and their seed (the fit is deterministic).
    level : float

    Returns
    -------
    MixtureFit

    Raises
    ------
    ParameterError
        Missing or invalid bounds, privacy parameters, shapes, k out of range, or fewer than
        ``10·p`` reports per centre.

    Warns
    -----
    ConvergenceWarning
        The DR-Lloyd iteration or the sandwich's convergence check failed.
    """
    return _fit("kmeans", x1, x2, k, low, high, zero_prob, None, method, fields, n_init, seed, level)


def fit_gaussian_mixture(x1, x2=None, *, k: int, low, high, zero_prob: float | None = None,
                         scale=None, method: str = "deconvolution", fields: Sequence[str] | None = None,
                         n_init: int = 5, seed: int = 0, level: float = 0.95) -> MixtureFit:
    """Diagonal Gaussian mixture of ZIL reports (docs/mechanisms.md §7.3–§7.5).

    Parameters
    ----------
    x1, x2, k, low, high, zero_prob, fields, n_init, seed, level
        As :func:`fit_kmeans` (``x2`` only for "dr").
    scale : float or array (p,), optional
        SL noise standard deviation per field in original units, ``λ·(high − low)``
        (``ZILMechanism.coord_scale``); required for "deconvolution".
    method : {"deconvolution", "dr", "naive", "oracle"}
        "deconvolution" maximises the exact likelihood of the reports; "dr" minimises the DR
        corrected negative log-likelihood (a local fixed point; its variance estimates need far
        more reports at strong noise, docs/mechanisms.md §7.3); "naive" fits the reports as if
        raw; "oracle" fits raw values.

    Returns
    -------
    MixtureFit

    Raises
    ------
    ParameterError
        As :func:`fit_kmeans`; "deconvolution" without ``scale``.
    """
    return _fit("gaussian_mixture", x1, x2, k, low, high, zero_prob, scale, method, fields, n_init, seed,
                level)

