"""The demo after a fresh install: ``python -m benchmarks.demo_first_run`` (docs/benchmarks.md §3.10).

Creates a new virtual environment, installs this checkout into it without ``-e``
(``pip install '<checkout>[demo]'``: numba's cache then lives in that environment's
``site-packages`` and starts empty), and runs ``ldp-stream demo --limit 20000 --rate 0 --no-live``
``--runs`` times in a new empty directory (the default output ``demo-output/`` there). The first
run compiles the numba kernels, the next ones load them. Reported per run: exit status, wall time,
the demo's own "kernels compiled and cached in … s" and "done: … reports in … s" (producer start
to the last window final), and the 1-minute load average at its start. The environment and the
directory are removed afterwards (``--keep`` keeps them).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import ROOT, machine_info, table, write_json

DEMO_ARGS = ["demo", "--limit", "20000", "--rate", "0", "--no-live"]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def install(venv: Path) -> float:
    """Create ``venv`` and install this checkout with the ``demo`` extra; returns seconds."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"{ROOT}[demo]"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"pip install failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def _seconds(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def run_demo(venv: Path, cwd: Path, env: dict) -> dict:
    """One ``ldp-stream demo`` run in ``cwd``; its exit status, wall time and reported phases."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run([str(venv / "bin" / "ldp-stream"), *DEMO_ARGS], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    return {
        "exit": proc.returncode,
        "wall_s": round(wall, 2),
        "kernels_s": _seconds(r"kernels compiled and cached in ([\d.]+) s", out),
        "stream_s": _seconds(r"done: [\d,]+ reports in ([\d.]+) s", out),
        "loadavg_1m_at_start": round(load, 2),
        "output_tail": out.splitlines()[-12:],
    }


def print_table(res: dict) -> None:
    """The Markdown table of docs/benchmarks.md §3.10."""
    rows = []
    for i, r in enumerate(res["runs"]):
        rows.append([
            "first (compiles the kernels)" if i == 0 else ("second" if i == 1 else f"run {i + 1}"),
            r["exit"], f"{r['wall_s']:.1f} s",
            "–" if r["kernels_s"] is None else f"{r['kernels_s']:.0f} s",
            "–" if r["stream_s"] is None else f"{r['stream_s']:.1f} s",
            f"{r['loadavg_1m_at_start']:.2f}",
        ])
    print("\n" + table(["run after a fresh install", "exit", "wall", "kernels compiled",
                        "stream to the last final window", "load (1 min) at start"], rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="demo runs after the install (default: 2)")
    ap.add_argument("--keep", action="store_true", help="keep the environment and the run directory")
    args = ap.parse_args(argv)
    if not 1 <= args.runs <= 10:
        ap.error(f"--runs must be in [1, 10], got {args.runs}")
    tmp = Path(tempfile.mkdtemp(prefix="ldp-bench-fresh-"))
    venv, cwd = tmp / "venv", tmp / "run"
    cwd.mkdir()
    # numba's cache in the new environment, not a NUMBA_CACHE_DIR of this shell's
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH", "VIRTUAL_ENV")}
    results: dict = {"demo_command": "ldp-stream " + " ".join(DEMO_ARGS),
                     "install_command": f"python -m venv VENV && VENV/bin/pip install '{ROOT}[demo]'",
                     "commit": _git("rev-parse", "--short", "HEAD"),
                     "tree_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
                     "machine_start": machine_info()}
    try:
        print(f"installing into {venv} …", flush=True)
        results["install_s"] = round(install(venv), 1)
        print(f"  {results['install_s']:.0f} s", flush=True)
        results["runs"] = []
        for i in range(args.runs):
            r = run_demo(venv, cwd, env)
            results["runs"].append(r)
            print(f"run {i + 1}: exit {r['exit']}, {r['wall_s']:.1f} s wall", flush=True)
            if r["exit"] != 0:
                print("\n".join(r["output_tail"]), flush=True)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    results["machine_end"] = machine_info()
    print_table(results)
    print(f"\nwrote {write_json('demo_first_run', results)}")
    return 0 if all(r["exit"] == 0 for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
