"""What the demo shows: the live terminal view, ``report.json``, ``report.md`` and the summary line.

The report judges every merged estimate against the non-private truth
(:mod:`aggregator.demo.truth`); the plots are drawn by :mod:`aggregator.demo.plots`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from aggregator.demo.run import DemoOptions, _Prepared, _Progress

log = logging.getLogger(__name__)

__all__ = ["DEVICE_FLIGHTS_PER_DAY", "LiveView", "build_report", "print_summary", "render_markdown",
           "write_outputs"]

#: The reporting rate the demo states a device-level guarantee for: a traveller's phone that
#: reports two flights a day (out and back). The demo's schema itself is per event.
DEVICE_FLIGHTS_PER_DAY = 2


def device_privacy(schema) -> dict:
    """The demo schema's guarantees for one device reporting ``DEVICE_FLIGHTS_PER_DAY`` flights a
    day (``TelemetrySchema.privacy_summary`` for that unit; docs/privacy.md §7)."""
    from ingest.client.schema import PrivacySetting

    unit = PrivacySetting(unit="device", period="1d", reports_per_period=DEVICE_FLIGHTS_PER_DAY)
    return schema.privacy_summary(unit)


def build_report(config, schema, estimates: dict, truth: dict, progress: _Progress, prepared: _Prepared,
                 elapsed_s: float, *, total_s: float, opts: DemoOptions, partial: bool = False,
                 not_ready: dict | None = None, windows: dict | None = None) -> dict:
    """Assemble ``report.json``: every estimate with CI, n, truth and whether the CI covers it;
    ``notes`` by query: what an estimate says it cannot determine (``Estimate.notes``, e.g. an
    unidentified k-means component, whose rows have no interval); ``centres``: each ``kmeans``
    query's components (:func:`_centres`); queries that could not estimate yet are listed under
    ``not_estimated`` with the reason; windowed queries under ``windows``, one row per window with
    its own truth (:func:`aggregator.demo.windows.window_report`; ``windows``: serve's
    ``/windows/{query}``)."""
    rows, notes = [], {}
    for q in config.queries:
        e = estimates.get(q.name)
        if not e or q.window is not None:
            continue
        if e.get("notes"):
            notes[q.name] = [str(n) for n in e["notes"]]
        t = truth.get(q.name, {})
        for i, p in enumerate(e["params"]):
            def at(key, i=i, e=e):
                v = e.get(key)
                return None if v is None or v[i] is None else float(v[i])

            tv = t.get(p)
            lo, hi = at("ci_low"), at("ci_high")
            # a partial run's estimates cover a prefix of the flights, the truth all of them
            covered = None if partial or tv is None or lo is None or hi is None else bool(lo <= tv <= hi)
            rows.append({"query": q.name, "kind": q.kind, "param": p, "estimate": at("value"),
                         "stderr": at("stderr"), "ci_low": lo, "ci_high": hi, "level": e.get("level"),
                         "n": e.get("n"), "estimator": e.get("estimator"),
                         "truth": None if tv is None else float(tv), "covered": covered})
    judged = [r["covered"] for r in rows if r["covered"] is not None]
    coverage = (sum(judged) / len(judged)) if judged else None
    return {
        "partial": partial,
        "run": {
            "flights_read": prepared.n_in, "reports_sent": progress.produced,
            "reports_processed": progress.processed, "skipped": prepared.skipped,
            "dead_lettered": progress.dead_lettered, "duplicates_skipped": progress.duplicates,
            "workers": opts.workers, "partitions": opts.partitions,
            "reports_per_record": opts.reports_per_record,
            "stream_seconds": round(elapsed_s, 2), "total_seconds": round(total_s, 2),
            "reports_per_second": round(progress.processed / elapsed_s, 1) if elapsed_s > 0 else None,
            "privatize_reports_per_second": round(prepared.n_sent / max(prepared.privatize_s, 1e-9), 1),
            "python": sys.version.split()[0], "cpus": os.cpu_count(),
        },
        "privacy": schema.privacy_summary(),
        "privacy_device": device_privacy(schema),
        "summary": {"estimates": len(rows), "with_truth": len(judged),
                    "covered": int(sum(judged)), "coverage": coverage,
                    # an unidentified component's parameters (Estimate.notes say why)
                    "without_interval": sum(r["ci_low"] is None or r["ci_high"] is None for r in rows)},
        "estimates": rows,
        "notes": notes,
        "centres": {q.name: _centres(q, rows) for q in config.queries
                    if q.kind == "kmeans" and q.window is None and q.name in estimates},
        "not_estimated": [{"query": q.name, "kind": q.kind, "n": (not_ready or {}).get(q.name, {}).get("n"),
                           "reason": (not_ready or {}).get(q.name, {}).get("error", "no estimate yet")}
                          for q in config.queries if q.name not in estimates and q.window is None],
        **_windows_part(config, schema, windows, prepared, progress.processed, partial),
    }


def _centres(query, rows: list[dict]) -> list[dict]:
    """The components of a ``kmeans`` query's report rows (``"<j>.<field>"``), in order.

    Returns
    -------
    list of dict
        Per component j: ``{"component": j, "estimate", "ci_low", "ci_high", "truth": {field →
        value or None}, "inside"}``; ``inside`` is whether every coordinate of the raw-data centre
        lies in its interval (``None``: no interval or no truth, as ``covered``).
    """
    by = {r["param"]: r for r in rows if r["query"] == query.name}
    out = []
    for j in range(query.k):
        rs = [by.get(f"{j}.{f}") for f in query.fields]
        if any(r is None for r in rs):
            continue
        cov = [r["covered"] for r in rs]
        out.append({"component": j,
                    **{key: {f: r[key] for f, r in zip(query.fields, rs)}
                       for key in ("estimate", "ci_low", "ci_high", "truth")},
                    "inside": None if any(c is None for c in cov) else all(cov)})
    return out


def _windows_part(config, schema, windows: dict | None, prepared: _Prepared, processed: int,
                  partial: bool) -> dict:
    """``windows`` and ``windows_summary`` of the report; each summary also says whether every
    processed report is in exactly one pane (Σ window n / windows per report) or counted late."""
    from aggregator.demo.windows import window_report

    out = window_report(config, schema, windows or {}, prepared.raw, None if partial else prepared.event_time)
    for s in out["windows_summary"].values():
        s["reports"] = processed
        s["all_reports_accounted"] = (None if s["late"] is None
                                      else s["reports_in_windows"] + s["late"] == processed)
    return out


def write_outputs(out: Path, report: dict, history: list, truth: dict, schema, *, queries=(),
                  raw: dict | None = None) -> None:
    """Write report.json, report.md and the PNG plots into ``out``; ``queries`` (the pipeline's
    query specs) and ``raw`` (clipped raw values by field) feed the k-means plots
    (:func:`aggregator.demo.plots.write_all`)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
    (out / "history.json").write_text(json.dumps(
        [{"t": round(t, 3), "estimates": est} for t, est in history], default=_json_default) + "\n")
    plots = []
    try:
        from aggregator.demo import plots as demo_plots

        plots = demo_plots.write_all(out, report, history, truth, schema, queries=queries, raw=raw)
    except ImportError as exc:  # matplotlib missing
        log.warning("plots skipped: %s (install with: pip install matplotlib)", exc)
    (out / "report.md").write_text(render_markdown(report, plots))


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def _rate(v) -> str:
    """A rate in reports/s as ``61,234`` (``–`` when unknown)."""
    return "–" if v is None else f"{v:,.0f}"


def _fmt(v, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    a = abs(v)
    if a != 0 and (a < 1e-3 or a >= 1e5):
        return f"{v:.3e}"
    return f"{v:.{digits}g}"


_YES_NO = {True: "yes", False: "no"}


def _pairs(rows) -> str:
    return ", ".join(f"({r['epsilon']:g}, {r['delta']:.3g})" for r in rows)


def _device_lines(report: dict) -> list[str]:
    """The per-report and the per-device statements, in words (docs/privacy.md §7)."""
    per, dev = report["privacy"], report.get("privacy_device")
    statement = per["unit"]["statement"]
    lines = [f"{statement[0].upper()}{statement[1:]}."]
    num = (dev or {}).get("numeric") or {}
    comp = num.get("composed")
    if comp is None:
        return lines
    t = comp["reports"]
    lines += ["", f"**Per device** — a traveller whose phone reports {t} flights a day is protected "
              f"by the composition of those {t} reports, not by the per-report guarantee: "
              f"{comp['exact_release_statement']}. Numeric fields, whole reports: (epsilon, delta) "
              f"{_pairs(comp['record'])}; one field: {_pairs(comp['attribute'])} "
              f"({comp['accounting']}). Per report, whole reports: "
              f"{_pairs(num['epsilon_delta']['record'])}."]
    for name, c in dev["categorical"].items():
        lines.append(f"* {name}: sensitive values over {t} reports: (epsilon, delta) "
                     f"{_pairs(c['composed']['epsilon_delta'])}")
    return lines


def render_markdown(report: dict, plots: list[str]) -> str:
    """``report.md``: run figures, privacy summary, the estimate table with the estimates' notes,
    the k-means centres against the raw data's, the windows and the plots."""
    run, summ = report["run"], report["summary"]
    lines = ["# ldp-stream demo report" + (" (partial: interrupted)" if report.get("partial") else ""), ""]
    lines += [f"* flights read: {run['flights_read']:,}; reports sent: {run['reports_sent']:,}; "
              f"processed by {run['workers']} workers over {run['partitions']} partitions: "
              f"{run['reports_processed']:,}",
              f"* skipped before privatization (a field missing): {sum(run['skipped'].values()):,}; "
              f"dead-lettered records: {run['dead_lettered']}; "
              f"duplicates skipped: {run['duplicates_skipped']}",
              f"* streaming time {run['stream_seconds']} s ({_rate(run['reports_per_second'])} reports/s); "
              f"total {run['total_seconds']} s; client privatization "
              f"{_rate(run['privatize_reports_per_second'])} reports/s",
              "", "## Privacy", "", *_device_lines(report), "", "```json",
              json.dumps(report["privacy"], indent=2, default=_json_default), "```", "",
              "## Estimates (95 % CI) against the non-private truth", "",
              "The *truth* is computed by the demo from the raw, clipped data — it never leaves the "
              "client in a real deployment and is shown only to judge the estimates.", "",
              f"CI covers the truth for **{summ['covered']} of {summ['with_truth']}** parameters "
              f"({_fmt(100 * summ['coverage'] if summ['coverage'] is not None else None, 3)} %)"
              + (f"; {summ['without_interval']} parameters have no interval (see the notes below the table)"
                 if summ.get("without_interval") else "") + ". "
              "A 95 % interval misses about 1 time in 20. The quantile-regression intervals assume a "
              "continuous response, which the flights' whole-minute delays are not; how the streamed "
              "regressions and k-means centres compare with the batch fit and the raw data at this "
              "noise: docs/benchmarks.md §2.1 and docs/reproductions.md, \"The flights demo\".", "",
              "| query | param | estimate | stderr | 95 % CI | truth (non-private) | covered | n |",
              "|---|---|---|---|---|---|---|---|"]
    for r in report["estimates"]:
        lines.append(f"| {r['query']} | {r['param']} | {_fmt(r['estimate'])} | {_fmt(r['stderr'])} | "
                     f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}] | {_fmt(r['truth'])} | "
                     f"{'yes' if r['covered'] else ('–' if r['covered'] is None else 'no')} | {r['n']} |")
    for name, ns in (report.get("notes") or {}).items():
        lines += ["", f"*{name}* notes:"] + [f"* {n}" for n in ns]
    for r in report.get("not_estimated", []):
        lines.append(f"\n*{r['query']}*: no estimate yet — {r['reason']}")
    for name, comps in (report.get("centres") or {}).items():
        fs = list(comps[0]["estimate"]) if comps else []
        lines += ["", f"## k-means centres of {name} against the raw data's (non-private)", "",
                  "The raw-data centres are scikit-learn's k-means of the clipped values in the "
                  "same box-standardized metric; *inside*: every coordinate in its 95 % interval.", "",
                  f"| component | private centre ({', '.join(fs)}) | 95 % CI | raw-data centre | inside |",
                  "|---|---|---|---|---|"]
        for c in comps:
            lines.append(f"| {c['component']} | ({', '.join(_fmt(c['estimate'][f]) for f in fs)}) | "
                         + " × ".join(f"[{_fmt(c['ci_low'][f])}, {_fmt(c['ci_high'][f])}]" for f in fs)
                         + f" | ({', '.join(_fmt(c['truth'][f]) for f in fs)}) | "
                         f"{_YES_NO.get(c['inside'], '–')} |")
    wins = report.get("windows_summary") or {}
    if wins:
        lines += ["", "## Windows (event time, UTC) against each window's non-private truth", "",
                  "| query | windows | final | parameters judged | CI covers the truth | reports in windows "
                  "| late reports | every report in one window or late |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, w in wins.items():
            cov = _fmt(100 * w["coverage"], 3) + " %" if w["coverage"] is not None else "–"
            lines.append(f"| {name} | {w['windows']} | {w['final']} | {w['judged']} | {w['covered']} ({cov}) "
                         f"| {w['reports_in_windows']:,} | {w['late'] if w['late'] is not None else '–'} "
                         f"| {_YES_NO.get(w.get('all_reports_accounted'), '–')} |")
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def print_summary(console, report: dict, out: Path) -> None:
    """The demo's last line: reports processed, rate, coverage and where the report is."""
    s, run = report["summary"], report["run"]
    cov = s["coverage"]
    console.print(f"[bold green]done[/]: {run['reports_processed']:,} reports in {run['stream_seconds']} s "
                  f"({_rate(run['reports_per_second'])} reports/s); the 95 % CI covers the non-private truth "
                  f"for {s['covered']}/{s['with_truth']} parameters"
                  + (f" ({100 * cov:.1f} %)" if cov is not None else "")
                  + f". Report: {out / 'report.md'}")


class LiveView:
    """The rich renderable of the live terminal view."""

    MAX_ROWS = 14

    def __init__(self, progress: _Progress, n_total: int, truth: dict) -> None:
        self.p, self.n_total, self.truth = progress, n_total, truth

    def render(self):
        from rich.console import Group
        from rich.table import Table

        p = self.p
        head = Table.grid(padding=(0, 2))
        head.add_row(f"produced [bold]{p.shown_produced():,}[/]/{self.n_total:,}",
                     f"processed [bold]{p.processed:,}[/]",
                     f"lag {int(p.lag):,}", f"{p.rate():,.0f} reports/s",
                     f"dead-lettered {p.dead_lettered}")
        t = Table(title="merged estimates (serve) vs non-private truth (computed locally from raw data)",
                  title_justify="left")
        for col in ("query", "param", "estimate", "95 % CI", "truth (non-private)", "n"):
            t.add_column(col, justify="right" if col not in ("query", "param") else "left")
        rows = 0
        for qname, e in p.estimates.items():
            for i, param in enumerate(e.get("params", [])):
                if rows >= self.MAX_ROWS:
                    break
                tv = self.truth.get(qname, {}).get(param)
                lo, hi = e["ci_low"][i], e["ci_high"][i]
                inside = tv is not None and lo is not None and hi is not None and lo <= tv <= hi
                t.add_row(qname, str(param), _fmt(e["value"][i]), f"[{_fmt(lo)}, {_fmt(hi)}]",
                          ("[green]" if inside else "[red]") + _fmt(tv) + "[/]", f"{e.get('n', 0):,}")
                rows += 1
        return Group(head, t)

