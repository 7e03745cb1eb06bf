"""The k-means plot of the demo: raw points, the raw-data centres and the private centres.

Drawn by :func:`aggregator.demo.plots.write_all` for every ``kmeans`` query of two or more fields
(the first two are plotted).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["kmeans_rows", "plot_kmeans"]

#: raw points drawn at most (a uniform subsample, fixed seed)
MAX_POINTS = 20_000


def kmeans_rows(report: dict, query: str, fields: tuple[str, str], k: int) -> list[dict]:
    """The private centres of ``query`` in the final report, one dict per component.

    Parameters
    ----------
    report : dict
        ``report.json`` (:func:`aggregator.demo.report.build_report`); rows ``"<j>.<field>"``.
    query : str
    fields : (str, str)
        The two fields plotted (x, y).
    k : int

    Returns
    -------
    list of dict
        Per component j with a row for both fields: ``{"j", "x", "y", "x_ci", "y_ci",
        "x_truth", "y_truth"}``; ``x_ci``/``y_ci`` are ``(low, high)`` or ``None`` (no finite
        interval: an unidentified component), truths ``None`` when unknown.
    """
    by = {r["param"]: r for r in report.get("estimates", []) if r["query"] == query}
    out = []
    for j in range(k):
        rx, ry = by.get(f"{j}.{fields[0]}"), by.get(f"{j}.{fields[1]}")
        if rx is None or ry is None or rx["estimate"] is None or ry["estimate"] is None:
            continue

        def ci(r):
            return None if r["ci_low"] is None or r["ci_high"] is None else (r["ci_low"], r["ci_high"])

        out.append({"j": j, "x": rx["estimate"], "y": ry["estimate"], "x_ci": ci(rx), "y_ci": ci(ry),
                    "x_truth": rx["truth"], "y_truth": ry["truth"]})
    return out


def plot_kmeans(path: Path, report: dict, query, raw: dict | None, truth: dict, schema=None) -> bool:
    """Write the k-means plot of ``query`` to ``path``; returns whether a file was written.

    A scatter of the raw (clipped) values of the first two fields (a subsample of at most
    :data:`MAX_POINTS`, small alpha), the raw-data k-means centres (``truth``, non-private,
    :func:`aggregator.demo.truth.kmeans_centres`) as black crosses, and the private centres of the
    final estimate with their 95 % intervals as x and y error bars (a component without a finite
    interval is drawn hollow, without bars). With ``schema``, the axes span the fields' bounds
    and a private centre outside them is a triangle on the border, its value in the legend.

    Parameters
    ----------
    path : Path
    report : dict
        ``report.json``.
    query : KMeansQuery
        At least two ``fields``.
    raw : mapping field → ndarray (n,) or None
        Clipped raw values (``None``: no scatter).
    truth : dict query → {param → value}
    schema : TelemetrySchema, optional

    Returns
    -------
    bool
        False (nothing written) when the query has fewer than two fields or no centre in the
        report and no raw data.
    """
    import matplotlib.pyplot as plt

    if len(query.fields) < 2:
        return False
    fx, fy = query.fields[0], query.fields[1]
    rows = kmeans_rows(report, query.name, (fx, fy), query.k)
    have_raw = raw is not None and fx in raw and fy in raw and np.size(raw[fx]) > 0
    if not rows and not have_raw:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    if have_raw:
        x, y = np.asarray(raw[fx], dtype=float), np.asarray(raw[fy], dtype=float)
        if x.size > MAX_POINTS:
            pick = np.random.default_rng(0).choice(x.size, MAX_POINTS, replace=False)
            x, y = x[pick], y[pick]
        ax.scatter(x, y, s=2, alpha=0.08, color="tab:gray", lw=0,
                   label=f"raw values (non-private; {x.size:,} shown)")
    t = truth.get(query.name, {})
    tc = [(t[f"{j}.{fx}"], t[f"{j}.{fy}"]) for j in range(query.k) if f"{j}.{fx}" in t and f"{j}.{fy}" in t]
    if tc:
        tx, ty = zip(*tc)
        ax.scatter(tx, ty, marker="x", s=90, color="k", lw=2, zorder=4,
                   label="k-means centres of the raw data (non-private)")
    box = _box(schema, fx, fy)
    for i, r in enumerate(rows):
        color = plt.cm.tab10(i % 10)
        label = f"private centre {r['j']}"
        if box is not None and not (box[0] <= r["x"] <= box[1] and box[2] <= r["y"] <= box[3]):
            # outside the fields' bounds: a triangle on the border, its value written next to it
            px, py = min(max(r["x"], box[0]), box[1]), min(max(r["y"], box[2]), box[3])
            ax.scatter([px], [py], marker="^", s=60, color=color, zorder=5, clip_on=False,
                       label=label + f" outside the bounds, at ({r['x']:.4g}, {r['y']:.4g})"
                       + ("" if r["x_ci"] and r["y_ci"] else "; no interval"))
            continue
        if r["x_ci"] is None or r["y_ci"] is None:
            ax.scatter([r["x"]], [r["y"]], s=50, facecolors="none", edgecolors=[color], lw=1.5, zorder=5,
                       label=label + " (not identified: no interval)")
            continue
        xerr = [[r["x"] - r["x_ci"][0]], [r["x_ci"][1] - r["x"]]]
        yerr = [[r["y"] - r["y_ci"][0]], [r["y_ci"][1] - r["y"]]]
        ax.errorbar([r["x"]], [r["y"]], xerr=xerr, yerr=yerr, fmt="o", ms=6, color=color, capsize=4,
                    lw=1.5, zorder=5, label=label + " with 95 % CI")
    if box is not None:
        pad_x, pad_y = 0.02 * (box[1] - box[0]), 0.02 * (box[3] - box[2])
        ax.set_xlim(box[0] - pad_x, box[1] + pad_x)
        ax.set_ylim(box[2] - pad_y, box[3] + pad_y)
    n = next((r_["n"] for r_ in report.get("estimates", []) if r_["query"] == query.name), None)
    ax.set_xlabel(_label(schema, fx))
    ax.set_ylabel(_label(schema, fy))
    ax.set_title(f"{query.name}: k = {query.k} k-means centres" + (f" from {n:,} reports" if n else ""),
                 fontsize=10)
    leg = ax.legend(fontsize=7, loc="upper left")
    for h in leg.legend_handles:  # the raw points' handle is as faint as the points
        if h is not None and hasattr(h, "set_alpha"):
            h.set_alpha(1.0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _box(schema, fx: str, fy: str):
    """``(x_low, x_high, y_low, y_high)``: the schema bounds of the two fields, or None."""
    if schema is None or schema.numeric is None:
        return None
    bounds = {f.name: (float(f.low), float(f.high)) for f in schema.numeric.fields}
    if fx not in bounds or fy not in bounds:
        return None
    return (*bounds[fx], *bounds[fy])


def _label(schema, name: str) -> str:
    for f in (schema.numeric.fields if schema is not None and schema.numeric is not None else ()):
        if f.name == name and getattr(f, "unit", None):
            return f"{name} ({f.unit})"
    return name
