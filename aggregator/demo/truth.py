"""Non-private reference values of queries, computed from raw (clipped) data.

Used by the demo and the benchmarks to judge estimates; never part of a privacy-preserving
deployment (the raw data never leaves the client there). Computed independently of the
estimators: numpy moments and quantiles, category frequencies, least squares, scipy fits of
the logistic and check losses, and scikit-learn k-means and Gaussian mixtures (scikit-learn is a
``demo`` extra dependency, imported only for those queries).

The target of every estimator is the statistic of the values **after** clipping into the
schema bounds (docs/mechanisms.md §1.5: values are clipped before noise), so ``raw`` must already be clipped.
"""

from __future__ import annotations

import logging

import numpy as np
from scipy import optimize

from aggregator.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["compute_truth", "gaussian_mixture_fit", "kmeans_centres", "true_values"]


def compute_truth(config, schema, raw: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """The non-private value of every query parameter, from the clipped raw data.

    Returns
    -------
    dict query name → {param name → value}
        Parameter names match the :class:`aggregator.state.Estimate` params of the same query.
        A query whose reference fit needs a package that is not installed (scikit-learn, for
        ``kmeans`` and ``gaussian_mixture``) gets ``{}`` and a warning.
    """
    out = {}
    for q in config.queries:
        try:
            out[q.name] = true_values(q, schema, raw)
        except ImportError as exc:
            log.warning("truth of %r skipped: %s (install the demo extra: pip install "
                        "'ldp-stream[demo]')", q.name, exc)
            out[q.name] = {}
    return out


def true_values(query, schema, raw: dict[str, np.ndarray]) -> dict[str, float]:
    """Non-private value of every parameter of ``query``.

    Parameters
    ----------
    query : aggregator.queries.Query
    schema : ingest.client.schema.TelemetrySchema
    raw : mapping field name → ndarray (n,)
        Clipped numeric values (float) and categorical values (category strings) of the same n
        events.

    Returns
    -------
    dict param name → float
        Keys follow the estimate's ``params`` naming: ``"mean"``, ``"variance"``, ``"q0.5"``,
        category names, ``"intercept"`` and covariate names; ``"<j>.<field>"`` for k-means
        centres (:func:`kmeans_centres`); ``"<j>.weight"``, ``"<j>.mean.<field>"``,
        ``"<j>.var.<field>"`` for a Gaussian mixture (:func:`gaussian_mixture_fit`). Custom
        queries return ``{}``.

    Raises
    ------
    ConfigError
        If a field the query names is not in ``raw``.
    """
    kind = query.kind
    if kind == "frequency":
        field = schema.categorical_field(query.field)
        vals = _col(raw, query.field)
        codes = {c: i for i, c in enumerate(field.categories)}
        idx = np.fromiter((codes.get(v, -1) for v in vals), dtype=np.int64, count=vals.size)
        counts = np.bincount(idx[idx >= 0], minlength=len(field.categories))
        p = counts / max(vals.size, 1)
        return {c: float(p[i]) for i, c in enumerate(field.categories)}
    if kind == "mean":
        return {"mean": float(np.mean(_num(raw, query.field)))}
    if kind == "variance":
        return {"variance": float(np.var(_num(raw, query.field)))}
    if kind == "quantiles":
        x = _num(raw, query.field)
        return {f"q{q:g}": float(np.quantile(x, q, method="inverted_cdf")) for q in query.q}
    if kind in ("linear_regression", "logistic_regression", "quantile_regression"):
        X = np.column_stack([_num(raw, c) for c in query.covariates])
        names = list(query.covariates)
        if query.intercept:
            X = np.column_stack([np.ones(X.shape[0]), X])
            names = ["intercept", *names]
        if kind == "linear_regression":
            beta = np.linalg.lstsq(X, _num(raw, query.response), rcond=None)[0]
        elif kind == "logistic_regression":
            lab = _num(raw, query.label)
            y = (lab > query.threshold).astype(float) if query.threshold is not None else lab
            beta = _logistic_fit(X, y)
        else:
            beta = _quantile_fit(X, _num(raw, query.response), query.tau)
        return {n: float(b) for n, b in zip(names, beta)}
    if kind == "kmeans":
        X = np.column_stack([_num(raw, f) for f in query.fields])
        lows, highs = zip(*(_bounds(schema, f) for f in query.fields))
        centres = kmeans_centres(X, query.k, np.array(lows), np.array(highs))
        return {f"{j}.{f}": float(centres[j, i]) for j in range(query.k) for i, f in enumerate(query.fields)}
    if kind == "gaussian_mixture":
        X = np.column_stack([_num(raw, f) for f in query.fields])
        lows, highs = zip(*(_bounds(schema, f) for f in query.fields))
        w, mean, var = gaussian_mixture_fit(X, query.k, np.array(lows), np.array(highs))
        out = {f"{j}.weight": float(w[j]) for j in range(query.k)}
        for tag, arr in (("mean", mean), ("var", var)):
            out |= {f"{j}.{tag}.{f}": float(arr[j, i])
                    for j in range(query.k) for i, f in enumerate(query.fields)}
        return out
    return {}


def kmeans_centres(X: np.ndarray, k: int, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Raw-data k-means centres in the metric of the private fit.

    scikit-learn's Lloyd (``KMeans(n_clusters=k, n_init=10, random_state=0)``) on the
    box-standardized coordinates ``u = (x − mid)/half`` (``mid``, ``half``: centre and half-width
    of ``[low, high]``; :mod:`aggregator.state.mixture`), mapped back to original units.

    Parameters
    ----------
    X : ndarray (n, p)
        Clipped raw values, original units.
    k : int
        Centres (n ≥ k).
    low, high : ndarray (p,)
        The fields' schema bounds.

    Returns
    -------
    ndarray (k, p)
        Centres in original units, rows ascending by the first field (the estimate's order).
    """
    from sklearn.cluster import KMeans

    mid, half = (low + high) / 2.0, (high - low) / 2.0
    km = KMeans(n_clusters=k, n_init=10, random_state=0).fit((X - mid) / half)
    centres = km.cluster_centers_ * half + mid
    return centres[np.argsort(centres[:, 0], kind="stable")]


def gaussian_mixture_fit(X: np.ndarray, k: int, low: np.ndarray, high: np.ndarray):
    """Raw-data diagonal Gaussian mixture (maximum likelihood by scikit-learn's EM,
    ``GaussianMixture(k, covariance_type="diag", n_init=3, random_state=0)``) on the
    box-standardized coordinates, mapped back to original units.

    Parameters
    ----------
    X : ndarray (n, p)
        Clipped raw values, original units.
    k : int
    low, high : ndarray (p,)
        The fields' schema bounds.

    Returns
    -------
    weight : ndarray (k,)
    mean, var : ndarray (k, p)
        Component means (original units) and variances (squared units); components ascending
        by the first field's mean.
    """
    from sklearn.mixture import GaussianMixture

    mid, half = (low + high) / 2.0, (high - low) / 2.0
    gm = GaussianMixture(k, covariance_type="diag", n_init=3, random_state=0).fit((X - mid) / half)
    mean, var = gm.means_ * half + mid, gm.covariances_ * half**2
    order = np.argsort(mean[:, 0], kind="stable")
    return gm.weights_[order], mean[order], var[order]


def _bounds(schema, name: str) -> tuple[float, float]:
    for f in schema.numeric.fields if schema.numeric else ():
        if f.name == name:
            return float(f.low), float(f.high)
    raise ConfigError(f"truth: {name!r} is not a numeric field of the schema")


def _col(raw, name: str) -> np.ndarray:
    if name not in raw:
        raise ConfigError(f"truth: no raw column {name!r}")
    return np.asarray(raw[name])


def _num(raw, name: str) -> np.ndarray:
    return _col(raw, name).astype(np.float64)


def _standardize(X: np.ndarray):
    """Scale non-constant columns to unit spread for a well-conditioned fit; returns the map back."""
    sd = X.std(axis=0)
    mu = X.mean(axis=0)
    const = sd == 0
    sd = np.where(const, 1.0, sd)
    mu = np.where(const, 0.0, mu)
    has_int = bool(np.any(const))
    if not has_int:  # no intercept column: scale only, centring would add an intercept
        mu = np.zeros_like(mu)
    return (X - mu) / sd, mu, sd, has_int, const


def _unstandardize(b: np.ndarray, mu, sd, const) -> np.ndarray:
    beta = b / sd
    if np.any(const):
        j = int(np.flatnonzero(const)[0])
        beta[j] = b[j] - np.sum(b[~const] * mu[~const] / sd[~const])
    return beta


def _logistic_fit(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Maximum likelihood by Newton's method (IRLS) on standardized columns."""
    Z, mu, sd, _, const = _standardize(X)
    Z[:, const] = 1.0
    b = np.zeros(Z.shape[1])
    for _ in range(100):
        p = 0.5 * (1.0 + np.tanh(0.5 * (Z @ b)))
        g = Z.T @ (p - y)
        H = (Z * (p * (1.0 - p))[:, None]).T @ Z
        step = np.linalg.solve(H, g)
        b = b - step
        if np.max(np.abs(step)) < 1e-12 * (1.0 + np.max(np.abs(b))):
            break
    else:
        log.warning("truth: logistic Newton iterations did not converge")
    return _unstandardize(b, mu, sd, const)


def _quantile_fit(X: np.ndarray, y: np.ndarray, tau: float) -> np.ndarray:
    """Exact quantile regression by iteratively reweighted least squares refined by Nelder–Mead."""
    Z, mu, sd, _, const = _standardize(X)
    Z[:, const] = 1.0
    b = np.linalg.lstsq(Z, y, rcond=None)[0]
    for _ in range(60):  # IRLS for the check loss, then a simplex polish of the exact objective
        r = y - Z @ b
        w = np.where(r >= 0, tau, 1 - tau) / np.maximum(np.abs(r), 1e-6)
        b_new = np.linalg.solve(Z.T @ (Z * w[:, None]), Z.T @ (w * y))
        if np.max(np.abs(b_new - b)) < 1e-9 * (1 + np.max(np.abs(b))):
            b = b_new
            break
        b = b_new

    def check(bb):
        r = y - Z @ bb
        return float(np.mean(r * (tau - (r < 0))))

    res = optimize.minimize(check, b, method="Nelder-Mead",
                            options={"xatol": 1e-7, "fatol": 1e-12, "maxiter": 600})
    return _unstandardize(res.x if res.fun <= check(b) else b, mu, sd, const)
