"""PNG plots of the demo report (matplotlib, Agg backend), written by
:func:`aggregator.demo.report.write_outputs`."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np


def write_all(out: Path, report: dict, history: list, truth: dict, schema, *, queries=(),
              raw: dict | None = None) -> list[str]:
    """Write the demo's plots into ``out``; returns the file names written.

    ``queries`` are the pipeline's query specs (for the k-means plot: its fields and k) and
    ``raw`` the clipped raw values by field (its scatter; ``None``: none).

    * ``estimates_over_reports.png`` — every non-frequency estimate with its 95 % CI band against
      the number of reports merged, with the non-private truth as a dashed line;
    * ``frequencies.png`` — frequency estimates (with CIs) against the true frequencies;
    * ``tradeoff.png`` — the ZIL trade-off function of the schema's numeric group;
    * ``windows_<query>.png`` — a one-parameter windowed query's final windows with their CI band
      against each window's non-private truth;
    * ``<query>.png`` — a ``kmeans`` query of two or more fields: the raw values, their k-means
      centres and the private centres with 95 % intervals
      (:func:`aggregator.demo.plots_clusters.plot_kmeans`).
    """
    import matplotlib

    matplotlib.use("Agg")
    written = []
    if _estimates_over_reports(out / "estimates_over_reports.png", report, history, truth):
        written.append("estimates_over_reports.png")
    if _frequencies(out / "frequencies.png", report):
        written.append("frequencies.png")
    if _tradeoff(out / "tradeoff.png", schema):
        written.append("tradeoff.png")
    from aggregator.demo.windows import plot_windows

    for query in report.get("windows", {}):
        name = f"windows_{query}.png"
        if plot_windows(out / name, report, query):
            written.append(name)
    from aggregator.demo.plots_clusters import plot_kmeans

    for q in queries:
        if q.kind == "kmeans" and q.window is None and plot_kmeans(out / f"{q.name}.png", report, q, raw,
                                                                   truth, schema):
            written.append(f"{q.name}.png")
    return written


def _series(history: list, query: str, param: str):
    ns, v, lo, hi = [], [], [], []
    for _, est in history:
        e = est.get(query)
        if not e or param not in e.get("params", []):
            continue
        i = list(e["params"]).index(param)
        vals = (e["value"][i], e["ci_low"][i], e["ci_high"][i])
        if any(x is None or not math.isfinite(x) for x in vals) or not e.get("n"):
            continue
        if ns and ns[-1] == e["n"]:
            continue
        ns.append(e["n"])
        v.append(vals[0])
        lo.append(vals[1])
        hi.append(vals[2])
    return np.array(ns), np.array(v), np.array(lo), np.array(hi)


def _estimates_over_reports(path: Path, report: dict, history: list, truth: dict) -> bool:
    import matplotlib.pyplot as plt

    rows = [r for r in report["estimates"] if r["kind"] != "frequency"]
    if not rows or not history:
        return False
    ncol = 3
    nrow = math.ceil(len(rows) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.0 * nrow), squeeze=False)
    for ax, r in zip(axes.flat, rows):
        n, v, lo, hi = _series(history, r["query"], r["param"])
        if n.size:
            ax.fill_between(n, lo, hi, alpha=0.3, label="95 % CI")
            ax.plot(n, v, lw=1.2, label="estimate")
            # the first few thousand reports give very wide intervals: scale to the later half
            half = slice(n.size // 2, None)
            ys = np.concatenate([lo[half], hi[half]] + ([[r["truth"]]] if r["truth"] is not None else []))
            pad = 0.15 * (ys.max() - ys.min() or abs(ys.max()) or 1.0)
            ax.set_ylim(ys.min() - pad, ys.max() + pad)
        if r["truth"] is not None:
            ax.axhline(r["truth"], color="k", ls="--", lw=1, label="truth over all flights (non-private)")
        ax.set_title(f"{r['query']}: {r['param']}", fontsize=9)
        ax.set_xlabel("reports merged", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _frequencies(path: Path, report: dict) -> bool:
    import matplotlib.pyplot as plt

    queries = sorted({r["query"] for r in report["estimates"] if r["kind"] == "frequency"})
    if not queries:
        return False
    fig, axes = plt.subplots(1, len(queries), figsize=(5 * len(queries), 4.5), squeeze=False)
    for ax, q in zip(axes.flat, queries):
        rows = [r for r in report["estimates"] if r["query"] == q and r["truth"] is not None
                and r["estimate"] is not None]
        t = np.array([r["truth"] for r in rows])
        e = np.array([r["estimate"] for r in rows])
        lo = np.array([r["ci_low"] if r["ci_low"] is not None else r["estimate"] for r in rows])
        hi = np.array([r["ci_high"] if r["ci_high"] is not None else r["estimate"] for r in rows])
        ax.errorbar(t, e, yerr=[e - lo, hi - e], fmt="o", ms=3, lw=0.8, capsize=2)
        m = max(float(np.max(t, initial=0)), float(np.max(hi, initial=0))) * 1.05 or 1.0
        ax.plot([0, m], [0, m], "k--", lw=1)
        ax.set_xlabel("true frequency (non-private)")
        ax.set_ylabel("estimate with 95 % CI")
        ax.set_title(q)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _tradeoff(path: Path, schema) -> bool:
    import matplotlib.pyplot as plt

    from mechanisms import privacy

    mech = schema.zil_mechanism()
    if mech is None:
        return False
    alpha = np.linspace(0, 1, 401)
    fig, ax = plt.subplots(figsize=(5, 5))
    for c, label in ((mech.c_record, "record level"), (mech.c_attribute, "attribute level")):
        beta = privacy.tradeoff_zil(alpha, c, mech.zero_prob, dim=None)
        ax.plot(alpha, beta, label=f"{label}: c = {c:.3g}, zero_prob = {mech.zero_prob:g}")
    ax.plot(alpha, 1 - alpha, "k:", lw=1, label="perfect privacy (1 − α)")
    ax.set_xlabel("type I error α")
    ax.set_ylabel("type II error β")
    ax.set_title("ZIL trade-off function (lower bound, any d)")
    ax.legend(fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
