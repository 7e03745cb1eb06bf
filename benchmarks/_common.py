"""Shared helpers of the benchmark scripts: machine description, tables, JSON results, plots.

Not a public API of ldp-stream; used only by ``benchmarks/*.py``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
import platform
import sys
import time
from collections.abc import Sequence

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
IMG = ROOT / "docs" / "img"


def machine_info() -> dict:
    """Describe the machine and software of this run.

    Returns
    -------
    dict
        ``date`` (UTC ISO), ``nproc``, ``cpu_model`` (from /proc/cpuinfo), ``loadavg_1m`` at the
        start (the 2 cores are shared with other engineers: a high load slows every number),
        ``python``, ``numpy``, ``platform``.
    """
    cpu = "unknown"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "loadavg_1m": round(load, 2),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "platform": platform.platform(),
    }


def write_json(name: str, payload: dict) -> pathlib.Path:
    """Write ``payload`` (plus ``machine``) to ``benchmarks/results/<name>.json``; returns the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    out = {"benchmark": name, "command": "python -m benchmarks." + name + " " + " ".join(sys.argv[1:]),
           "machine": machine_info(), **payload}
    path.write_text(json.dumps(out, indent=2, default=_default) + "\n")
    return path


def _default(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def fmt(v) -> str:
    """Format a table cell: floats with 4 significant digits, large numbers with separators."""
    if isinstance(v, (float, np.floating)):
        if not np.isfinite(v):
            return str(v)
        if abs(v) >= 1e4:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    return str(v)


def table(headers: Sequence[str], rows: Sequence[Sequence], title: str | None = None) -> str:
    """Render rows as a Markdown table (also readable on a terminal) and return it."""
    cells = [[fmt(c) for c in r] for r in rows]
    w = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = []
    if title:
        lines.append(f"**{title}**\n")
    lines.append("| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(headers)) + " |")
    lines.append("|" + "|".join("-" * (x + 2) for x in w) + "|")
    for r in cells:
        lines.append("| " + " | ".join(c.rjust(w[i]) for i, c in enumerate(r)) + " |")
    return "\n".join(lines)


class Timer:
    """Context manager measuring wall time in seconds (``.seconds``)."""

    def __enter__(self) -> Timer:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.t0


def savefig(fig, name: str) -> pathlib.Path:
    """Save a matplotlib figure as ``docs/img/<name>.png`` (dpi 110) and close it."""
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    path = IMG / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def use_agg() -> None:
    """Select the non-interactive matplotlib backend."""
    import matplotlib

    matplotlib.use("Agg")
