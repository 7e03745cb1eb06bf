"""The demo's windowed queries: per-window non-private truth, the ``"windows"`` part of
``report.json`` and the plot of the daily mean with its CI band (docs/windows.md).

The truth of a window is the statistic of the clipped raw values of the flights whose event
time (``time_hour`` rounded down to the schema's resolution, as the client sends it) falls in
the window; it is computed here from the raw data, independently of the estimators
(:func:`aggregator.demo.truth.true_values`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from aggregator.demo.truth import true_values

__all__ = ["plot_windows", "window_report", "window_truth"]


def window_truth(query, schema, raw: dict, event_time: np.ndarray, starts) -> dict[int, dict[str, float]]:
    """Non-private value of every parameter of ``query`` per window start.

    Parameters
    ----------
    query : Query
        A windowed query (its ``window`` gives the size).
    schema : TelemetrySchema
    raw : mapping field → ndarray (n,)
        Clipped raw values of the flights sent.
    event_time : ndarray of int64, shape (n,)
        Their event times (Unix seconds, rounded down to the schema's resolution).
    starts : iterable of int
        Window starts (Unix seconds).

    Returns
    -------
    dict start → {param → value}
        Windows without a flight are left out.
    """
    plain = query.model_copy(update={"window": None})
    size = query.window.size_s
    order = np.argsort(event_time, kind="stable")
    t = event_time[order]
    out = {}
    for start in starts:
        a, b = np.searchsorted(t, [start, start + size], side="left")
        if b <= a:
            continue
        idx = order[a:b]
        out[int(start)] = true_values(plain, schema, {k: np.asarray(v)[idx] for k, v in raw.items()})
    return out


def window_report(config, schema, payloads: dict, raw: dict, event_time: np.ndarray | None) -> dict:
    """``report.json``'s ``"windows"`` and ``"windows_summary"``.

    Parameters
    ----------
    config : PipelineConfig
    schema : TelemetrySchema
    payloads : dict query → serve's ``GET /windows/{query}`` body
    raw : mapping field → ndarray
    event_time : ndarray or None
        Event times of the flights in ``raw`` (None: no truth).

    Returns
    -------
    dict
        ``{"windows": {query: [{"start", "end", "final", "n", "params", "value", "ci_low",
        "ci_high", "truth", "covered"}, …]}, "windows_summary": {query: {"windows", "final",
        "judged", "covered", "coverage", "reports_in_windows", "late"}}}``; ``value``, ``ci_*``,
        ``truth`` and ``covered`` are lists (one per param) for multi-parameter queries, scalars
        for one parameter.
    """
    windows, summary = {}, {}
    for q in config.queries:
        if q.window is None or q.name not in payloads:
            continue
        body = payloads[q.name]
        rows_in = body.get("windows", [])
        truth = ({} if event_time is None else
                 window_truth(q, schema, raw, event_time, [r["start_s"] for r in rows_in]))
        rows, judged = [], []
        for r in rows_in:
            params = r.get("params") or []
            tv = [truth.get(r["start_s"], {}).get(p) for p in params]
            cov = [None if t is None or lo is None or hi is None or not r.get("final")
                   else bool(lo <= t <= hi)
                   for t, lo, hi in zip(tv, r.get("ci_low") or [None] * len(params),
                                        r.get("ci_high") or [None] * len(params))]
            judged += [c for c in cov if c is not None]
            one = len(params) == 1

            def pick(v, one=one):
                return (v[0] if v else None) if one else v

            rows.append({"start": r["start"], "end": r["end"], "final": r.get("final"), "n": r.get("n"),
                         "params": params, "value": pick(r.get("value")), "ci_low": pick(r.get("ci_low")),
                         "ci_high": pick(r.get("ci_high")), "truth": pick(tv), "covered": pick(cov),
                         **({"error": r["error"]} if "error" in r else {})})
        windows[q.name] = rows
        tiles = q.window.size_s // q.window.hop_s  # windows holding each report
        summary[q.name] = {
            "windows": len(rows), "final": sum(1 for r in rows if r["final"]),
            "judged": len(judged), "covered": int(sum(judged)),
            "coverage": (sum(judged) / len(judged)) if judged else None,
            "reports_in_windows": int(sum(r.get("n") or 0 for r in rows_in) // tiles),
            "late": body.get("late"),
        }
    return {"windows": windows, "windows_summary": summary}


def plot_windows(path: Path, report: dict, query: str) -> bool:
    """The windows of a one-parameter query: estimate with its CI band against the window's
    truth, over time (final windows only). Returns whether a plot was written."""
    import matplotlib.pyplot as plt

    rows = [r for r in report.get("windows", {}).get(query, [])
            if r.get("final") and isinstance(r.get("value"), float)]
    if not rows:
        return False
    x = np.array([np.datetime64(r["start"].rstrip("Z")) for r in rows])
    v = np.array([r["value"] for r in rows])
    lo = np.array([r["ci_low"] if r["ci_low"] is not None else math.nan for r in rows])
    hi = np.array([r["ci_high"] if r["ci_high"] is not None else math.nan for r in rows])
    truth = np.array([r["truth"] if r["truth"] is not None else math.nan for r in rows])
    fig, ax = plt.subplots(figsize=(11, 3.6))
    ax.fill_between(x, lo, hi, step="post", alpha=0.3, color="tab:blue", label="95 % CI")
    ax.step(x, v, where="post", color="tab:blue", lw=0.8, label="private estimate")
    ax.step(x, truth, where="post", color="black", lw=0.8, ls="--", label="non-private truth")
    s = report.get("windows_summary", {}).get(query, {})
    cov = s.get("coverage")
    title = f"{query}: {len(rows)} final windows"
    if cov is not None:
        title += f", CI covers the truth in {100 * cov:.1f} %"
    ax.set_title(title)
    ax.set_ylabel(rows[0]["params"][0])
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
