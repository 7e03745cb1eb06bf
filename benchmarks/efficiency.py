"""Statistical efficiency: renewable (online) M-estimation against the batch fit of the same reports.

Run ``python -m benchmarks.efficiency [--quick] [--reps-small R1] [--reps-large R2] [--warm-up W]``;
prints a table and writes ``benchmarks/results/efficiency.json`` and ``docs/img/efficiency_rmse.png``
(docs/benchmarks.md §2); with ``--warm-up W`` (the queries' ``renewable.warm_up`` instead of the
library default) ``efficiency_warm_up_W.json`` and ``efficiency_rmse_warm_up_W.png``.

What is simulated. A small schema, one ZIL vector over 4 numeric fields, δ = 0.2, λ = 0.5 (paper
§7.2's (λ, δ) = (0.5, 0.2)):

* ``c1, c2 ~ U(−1, 1)`` on [−1, 1];
* ``lab ~ Bernoulli(σ(0.5 + c1 − c2))`` on [0, 1] — **logistic** regression of the label
  ``1{lab > 0.5}`` on ``(c1, c2)`` (``logistic_regression`` query, ``threshold = 0.5``, DR);
* ``y = 1 + c1 − c2 + N(0, 0.5²)`` clipped to [−3, 5] — **median regression** of ``y`` on
  ``(c1, c2)`` (``quantile_regression``, τ = 0.5, DR) and **Huber** regression of the same
  (a ``custom`` query, loss ``benchmarks.efficiency_losses:huber_regression``:
  :class:`mechanisms.losses.HuberLoss` on ``(c1, c2, y)`` in original units, threshold 1.345,
  DR, default start — no tuning).

The truth of every query is ``(0.5, 1, −1)`` (logistic) or ``(1, 1, −1)`` (the errors are
symmetric, so the median and Huber regressions both estimate the linear coefficients).

One replication, with its own seed: privatize n reports with the schema's ZIL mechanism, cut them
into records of 1000 reports and double each record once (``mech.double``, as the worker does);
then

* **online, 1 partition** — every record updates one state per query
  (``aggregator.state.build_state``: renewable M-estimation, a warm-up batch fit of the first
  ``renewable.warm_up`` reports, library default unless ``--warm-up`` is given, then blocks of
  ``renewable.batch_size`` = 1000);
* **online, 4 partitions** — the records go round-robin to 4 states per query, merged
  ``a + b + c + d`` (exact pooling of the fits, buffers pooled) before the estimate;
* **batch** — :func:`mechanisms.estimation.m_estimate` of the same reports and doubles, the fit
  ``ldp-stream analyze`` runs (LogisticLoss DR with the threshold label, QuantileRegressionLoss DR,
  the same HuberLoss DR, in original units). The two online runs share it.

Reported per (n, partitions, query, coefficient): online RMSE / batch RMSE (target ≤ 1.10) with a
bootstrap SE over replications, the online and batch 95 % Wald-interval coverage of the truth
(target 93–97 %), mean online SE / mean batch SE, and CPU seconds per replication (online: the
updates, merge and estimate of that query; batch: its ``m_estimate``; privatizing and doubling
are not counted).
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import subprocess
import sys
import time
import warnings

import numpy as np

from benchmarks._common import ROOT, savefig, table, use_agg, write_json

ZERO_PROB, SCALE = 0.2, 0.5
RECORD = 1000
PARTITIONS = (1, 4)
LEVEL = 0.95
RMSE_RATIO_MAX = 1.10
COVERAGE_RANGE = (0.93, 0.97)
BETA_LOGIT = np.array([0.5, 1.0, -1.0])
BETA_LINEAR = np.array([1.0, 1.0, -1.0])
NAMES = ("logistic", "median_regression", "huber")
TRUTH = {"logistic": BETA_LOGIT, "median_regression": BETA_LINEAR, "huber": BETA_LINEAR}
PARAMS = ("intercept", "c1", "c2")
HUBER_SPEC = "benchmarks.efficiency_losses:huber_regression"

SCHEMA = {
    "name": "efficiency", "version": 2,
    "numeric": {"zero_prob": ZERO_PROB, "scale": SCALE, "fields": [
        {"name": "c1", "low": -1.0, "high": 1.0},
        {"name": "c2", "low": -1.0, "high": 1.0},
        {"name": "lab", "low": 0.0, "high": 1.0},
        {"name": "y", "low": -3.0, "high": 5.0},
    ]},
}
QUERIES = {
    "logistic": {"kind": "logistic_regression", "name": "logistic", "covariates": ["c1", "c2"],
                 "label": "lab", "threshold": 0.5, "estimator": "dr"},
    "median_regression": {"kind": "quantile_regression", "name": "median_regression", "response": "y",
                          "covariates": ["c1", "c2"], "tau": 0.5, "estimator": "dr"},
    "huber": {"kind": "custom", "name": "huber", "loss": HUBER_SPEC, "fields": ["c1", "c2", "y"],
              "estimator": "dr", "params": list(PARAMS)},
}
C1, C2, LAB, Y = range(4)


class _WarmUpLog(logging.Handler):
    """Counts the renewable states' warnings about their warm-up fit (one that missed its
    convergence check, was not finite, or kept failing)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "warm-up fit" in record.getMessage():
            self.count += 1


_WARM_UP_LOG = _WarmUpLog()


def simulate(n: int, rng: np.random.Generator) -> np.ndarray:
    """Raw (clipped) records of the simulated stream.

    Parameters
    ----------
    n : int
        Number of records.
    rng : numpy.random.Generator

    Returns
    -------
    ndarray (n, 4)
        Columns ``c1, c2, lab, y`` (module docstring).
    """
    c = rng.uniform(-1.0, 1.0, (n, 2))
    eta = BETA_LOGIT[0] + c @ BETA_LOGIT[1:]
    lab = (rng.random(n) < 1.0 / (1.0 + np.exp(-eta))).astype(float)
    y = BETA_LINEAR[0] + c @ BETA_LINEAR[1:] + 0.5 * rng.standard_normal(n)
    return np.column_stack([c, lab, np.clip(y, -3.0, 5.0)])


def batch_problems():
    """The batch fits: ``{query: (loss, columns)}``, losses in original units as ``analyze`` builds them.

    Returns
    -------
    dict
        ``logistic``: LogisticLoss with the label ``1{lab > 0.5}``; ``median_regression``:
        QuantileRegressionLoss(τ = 0.5); ``huber``: the custom query's loss.
    """
    from benchmarks.efficiency_losses import huber_regression
    from mechanisms.losses import LogisticLoss, QuantileRegressionLoss

    return {
        "logistic": (LogisticLoss(covariates=(0, 1), noised=(0, 1, 2), label=_threshold_label),
                     [C1, C2, LAB]),
        "median_regression": (QuantileRegressionLoss(tau=0.5, noised=(0, 1, 2)), [C1, C2, Y]),
        "huber": (huber_regression(), [C1, C2, Y]),
    }


def _threshold_label(a: np.ndarray) -> np.ndarray:
    return (a[:, 2] > 0.5).astype(float)


def queries(warm_up: int | None = None) -> dict:
    """The query tables of the run.

    Parameters
    ----------
    warm_up : int, optional
        ``renewable.warm_up`` of every query; None: the library default.

    Returns
    -------
    dict
        ``{name: query mapping}`` for :func:`aggregator.state.build_state`.
    """
    out = {k: dict(q) for k, q in QUERIES.items()}
    if warm_up is not None:
        for q in out.values():
            q["renewable"] = {"warm_up": int(warm_up)}
    return out


def one_rep(schema, mech, problems, n: int, seed, qs: dict | None = None) -> dict:
    """One replication (module docstring).

    Parameters
    ----------
    schema : ingest.client.schema.TelemetrySchema
    mech : mechanisms.zil.ZILMechanism
        The schema's mechanism.
    problems : dict
        :func:`batch_problems`.
    n : int
        Reports in the stream (a multiple of ``RECORD``).
    seed : int or sequence of int
        Seed of ``numpy.random.default_rng``.
    qs : dict, optional
        :func:`queries` (default: ``QUERIES``, the library's ``renewable`` defaults).

    Returns
    -------
    dict
        ``{"online": {P: {query: fit}}, "batch": {query: fit}}`` with ``fit`` a dict of
        ``value, se, lo, hi`` (arrays (3,)), ``cpu`` (s); online also ``guarded`` (the
        positive-definiteness guard's count of the merged state's fit) and ``warm_up_failed``
        (warm-up fits that missed their convergence check), batch ``converged``.
    """
    from aggregator.state import build_state
    from ingest.client.batch import ReportBatch

    qs = QUERIES if qs is None else qs
    rng = np.random.default_rng(seed)
    x1 = mech.privatize(simulate(n, rng), rng=rng)
    x2 = np.empty_like(x1)
    records = []
    for s in range(0, n, RECORD):
        b1 = x1[s:s + RECORD]
        b2 = mech.double(b1, rng=rng)
        x2[s:s + RECORD] = b2
        records.append((ReportBatch(bytes(schema.fingerprint), b1, {}), b2))

    online = {}
    for parts in PARTITIONS:
        online[parts] = {}
        for name in NAMES:
            _WARM_UP_LOG.count = 0
            t0 = time.process_time()
            states = [build_state(qs[name], schema) for _ in range(parts)]
            for r, (batch, b2) in enumerate(records):
                states[r % parts].update(batch, b2)
            merged = states[0]
            for st in states[1:]:
                merged = merged + st
            e = merged.estimate()
            cpu = time.process_time() - t0
            online[parts][name] = {"value": np.array(e.value), "se": np.array(e.stderr),
                                   "lo": np.array(e.ci_low), "hi": np.array(e.ci_high), "cpu": cpu,
                                   "guarded": 0 if merged.fit is None else int(merged.fit.guarded),
                                   "warm_up_failed": _WARM_UP_LOG.count}

    from mechanisms.estimation import m_estimate

    batch = {}
    for name, (loss, cols) in problems.items():
        t0 = time.process_time()
        f = m_estimate(loss, x1[:, cols], x2[:, cols], zero_prob=ZERO_PROB, scale=mech.coord_scale[cols],
                       method="dr", level=LEVEL)
        cpu = time.process_time() - t0
        lo, hi = f.ci(LEVEL)
        batch[name] = {"value": np.array(f.theta), "se": np.array(f.stderr), "lo": np.array(lo),
                       "hi": np.array(hi), "cpu": cpu, "converged": bool(f.converged)}
    return {"online": online, "batch": batch}


def _bootstrap_ratio_se(e_on: np.ndarray, e_b: np.ndarray, rng: np.random.Generator, b: int = 2000) -> float:
    """Bootstrap SE (over replications) of ``RMSE(e_on) / RMSE(e_b)``, paired errors (reps,)."""
    idx = rng.integers(0, e_on.size, (b, e_on.size))
    r = np.sqrt(np.mean(e_on[idx] ** 2, axis=1) / np.mean(e_b[idx] ** 2, axis=1))
    return float(np.std(r, ddof=1))


def summarise(reps: list[dict], n: int) -> list[dict]:
    """Rows of the result table for one n.

    Parameters
    ----------
    reps : list of dict
        :func:`one_rep` outputs.
    n : int

    Returns
    -------
    list of dict
        One row per (partitions, query, coefficient): ``online_rmse``, ``batch_rmse``,
        ``rmse_ratio`` (and its bootstrap ``rmse_ratio_se``), ``online_coverage``,
        ``batch_coverage`` (and the binomial ``coverage_se``), ``online_mean_se``,
        ``batch_mean_se``, ``se_ratio``, biases, ``max_abs_diff_over_se`` (largest
        ``|online − batch| / batch SE`` over the replications, at replication ``worst_rep``;
        ``reps_diff_over_1se`` replications exceed 1), CPU per replication, mean
        ``guarded``, warm-up fits and batch fits that missed their convergence check, and
        ``meets_rmse`` / ``meets_coverage``.
    """
    rows = []
    brng = np.random.default_rng(12345)
    for parts in PARTITIONS:
        for name in NAMES:
            truth = TRUTH[name]

            def arr(est, key, _name=name, _parts=parts):
                if est == "batch":
                    return np.array([r["batch"][_name][key] for r in reps])
                return np.array([r["online"][_parts][_name][key] for r in reps])

            v_on, v_b = arr("online", "value"), arr("batch", "value")
            se_on, se_b = arr("online", "se"), arr("batch", "se")
            cov_on = (arr("online", "lo") <= truth) & (truth <= arr("online", "hi"))
            cov_b = (arr("batch", "lo") <= truth) & (truth <= arr("batch", "hi"))
            e_on, e_b = v_on - truth, v_b - truth
            dz = np.abs(v_on - v_b) / se_b
            for j, p in enumerate(PARAMS):
                rmse_on = float(np.sqrt(np.mean(e_on[:, j] ** 2)))
                rmse_b = float(np.sqrt(np.mean(e_b[:, j] ** 2)))
                ratio = rmse_on / rmse_b
                c_on = float(cov_on[:, j].mean())
                rows.append({
                    "n": n, "partitions": parts, "query": name, "param": p, "reps": len(reps),
                    "truth": float(truth[j]),
                    "online_rmse": rmse_on, "batch_rmse": rmse_b, "rmse_ratio": ratio,
                    "rmse_ratio_se": _bootstrap_ratio_se(e_on[:, j], e_b[:, j], brng),
                    "online_coverage": c_on, "batch_coverage": float(cov_b[:, j].mean()),
                    "coverage_se": float(np.sqrt(LEVEL * (1 - LEVEL) / len(reps))),
                    "online_mean_se": float(se_on[:, j].mean()), "batch_mean_se": float(se_b[:, j].mean()),
                    "se_ratio": float(se_on[:, j].mean() / se_b[:, j].mean()),
                    "online_bias": float(e_on[:, j].mean()), "batch_bias": float(e_b[:, j].mean()),
                    "max_abs_diff_over_se": float(np.max(dz[:, j])), "worst_rep": int(np.argmax(dz[:, j])),
                    "reps_diff_over_1se": int(np.sum(dz[:, j] > 1.0)),
                    "online_cpu_s_per_rep": float(np.mean(arr("online", "cpu"))),
                    "batch_cpu_s_per_rep": float(np.mean(arr("batch", "cpu"))),
                    "mean_guarded": float(np.mean(arr("online", "guarded"))),
                    "online_warm_up_failed": int(np.sum(arr("online", "warm_up_failed"))),
                    "batch_not_converged": int(np.sum(~arr("batch", "converged"))),
                    "meets_rmse": bool(ratio <= RMSE_RATIO_MAX),
                    "meets_coverage": bool(COVERAGE_RANGE[0] <= c_on <= COVERAGE_RANGE[1]),
                })
    return rows


def _raw(reps: list[dict], n: int) -> list[dict]:
    """Per-replication values and SEs (for ``--raw``)."""
    out = []
    for i, r in enumerate(reps):
        d = {"n": n, "rep": i, "batch": {k: {"value": f["value"], "se": f["se"], "converged": f["converged"]}
                                         for k, f in r["batch"].items()}}
        for parts, fits in r["online"].items():
            d[f"online_{parts}"] = {k: {"value": f["value"], "se": f["se"], "guarded": f["guarded"],
                                        "warm_up_failed": f["warm_up_failed"]} for k, f in fits.items()}
        out.append(d)
    return out


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    """Command line: run the replications, print the table, write the JSON (and the plot).

    Parameters
    ----------
    argv : list of str, optional
        ``--quick`` (n = 10⁴ only, 5 replications, no plot), ``--reps-small R`` (replications at
        n = 10⁴), ``--reps-large R`` (at n = 10⁵), ``--warm-up W`` (``renewable.warm_up`` of the
        queries; default: the library's), ``--seed S``, ``--raw PATH`` (per-replication values
        as JSON), ``--no-plot``.

    Returns
    -------
    int
        Exit status 0.
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 10⁴ only, 5 replications, no plot")
    ap.add_argument("--reps-small", type=int, default=2000, help="replications at n = 10⁴ (default 2000)")
    ap.add_argument("--reps-large", type=int, default=800, help="replications at n = 10⁵ (default 800)")
    ap.add_argument("--warm-up", type=int, default=None,
                    help="renewable.warm_up of the queries (default: the library default)")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--raw", type=pathlib.Path, default=None, help="write per-replication values here")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    from ingest.client.schema import TelemetrySchema

    log = logging.getLogger("aggregator.state.renewable")
    log.addHandler(_WARM_UP_LOG)
    log.propagate = False  # counted, not printed
    from aggregator.state import build_state

    schema = TelemetrySchema.from_dict(SCHEMA)
    mech = schema.zil_mechanism()
    problems = batch_problems()
    qs = queries(args.warm_up)
    opts = build_state(qs["logistic"], schema).opts
    suffix = "" if args.warm_up is None else f"_warm_up_{args.warm_up}"
    plan = [(10_000, 5)] if args.quick else [(10_000, args.reps_small), (100_000, args.reps_large)]
    rows, raw = [], []
    t_start = time.perf_counter()
    cpu_start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # non-converged batch fits are counted in the rows
        one_rep(schema, mech, problems, 8 * RECORD, [args.seed, 0, 0], qs)  # compile and import, not counted
        for n, reps in plan:
            out = []
            for r in range(reps):
                out.append(one_rep(schema, mech, problems, n, [args.seed, n, r], qs))
                if (r + 1) % max(1, reps // 10) == 0:
                    print(f"n={n}: {r + 1}/{reps} reps, {time.perf_counter() - t_start:.0f} s", flush=True)
            rows += summarise(out, n)
            if args.raw is not None:
                raw += _raw(out, n)
    wall, cpu = time.perf_counter() - t_start, time.process_time() - cpu_start

    def yes(b):
        return "yes" if b else "NO"

    print(table(["n", "partitions", "query", "param", "reps", "online/batch RMSE", "± (boot)", "online cov",
                 "batch cov", "online/batch mean SE", "online CPU s/rep", "batch CPU s/rep", "RMSE ok",
                 "cov ok"],
                [(r["n"], r["partitions"], r["query"], r["param"], r["reps"], r["rmse_ratio"],
                  r["rmse_ratio_se"], r["online_coverage"], r["batch_coverage"], r["se_ratio"],
                  r["online_cpu_s_per_rep"], r["batch_cpu_s_per_rep"], yes(r["meets_rmse"]),
                  yes(r["meets_coverage"])) for r in rows]))
    print(f"wall {wall:.0f} s, CPU {cpu:.0f} s")
    plots = [] if args.quick or args.no_plot else [plot(rows, "efficiency_rmse" + suffix, opts.warm_up)]
    path = write_json("efficiency" + suffix, {
        "commit": _commit(), "zero_prob": ZERO_PROB, "scale": SCALE, "record": RECORD, "level": LEVEL,
        "renewable": {"warm_up": opts.warm_up, "batch_size": opts.batch_size},
        "partitions": list(PARTITIONS), "targets": {"rmse_ratio_max": RMSE_RATIO_MAX,
                                                    "coverage_range": list(COVERAGE_RANGE)},
        "truth": {k: v.tolist() for k, v in TRUTH.items()}, "queries": qs, "plan": plan,
        "wall_s": wall, "cpu_s": cpu, "rows": rows, "plots": plots})
    print(f"wrote {path}")
    if args.raw is not None:
        args.raw.write_text(json.dumps(raw, default=lambda o: o.tolist() if isinstance(o, np.ndarray) else o))
        print(f"wrote {args.raw}")
    return 0


def plot(rows: list[dict], name: str = "efficiency_rmse", warm_up: int | None = None) -> str:
    """Bar chart of online RMSE / batch RMSE per cell, with the 1.10 target line.

    Parameters
    ----------
    rows : list of dict
        :func:`summarise` rows.
    name : str
        File name in ``docs/img`` without ``.png``.
    warm_up : int, optional
        ``renewable.warm_up`` of the run, for the title.

    Returns
    -------
    str
        ``docs/img/<name>.png`` (relative to the repository root).
    """
    use_agg()
    import matplotlib.pyplot as plt

    keys = [(q, p) for q in NAMES for p in PARAMS]
    cells = sorted({(r["n"], r["partitions"]) for r in rows})
    fig, ax = plt.subplots(figsize=(9, 4))
    w = 0.8 / len(cells)
    for i, (n, parts) in enumerate(cells):
        sel = {(r["query"], r["param"]): r for r in rows if r["n"] == n and r["partitions"] == parts}
        ys = [sel[k]["rmse_ratio"] for k in keys]
        es = [sel[k]["rmse_ratio_se"] for k in keys]
        ax.bar(np.arange(len(keys)) + (i - len(cells) / 2) * w + w / 2, ys, w, yerr=es, capsize=2,
               label=f"n = {n:.0e}, {parts} partition{'s' if parts > 1 else ''}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(RMSE_RATIO_MAX, color="r", lw=0.8, ls="--", label="target 1.10")
    short = {"median_regression": "median reg."}
    ax.set_xticks(np.arange(len(keys)), [f"{short.get(q, q)}\n{p}" for q, p in keys], fontsize=7)
    title = "Renewable (online) vs batch M-estimation, same reports"
    if warm_up is not None:
        title += f" (warm_up = {warm_up})"
    ax.set(ylabel="online RMSE / batch RMSE", title=title)
    ax.set_ylim(0.9, max(1.2, max(r["rmse_ratio"] + r["rmse_ratio_se"] for r in rows) + 0.02))
    ax.legend(fontsize=7, ncol=3)
    return str(savefig(fig, name).relative_to(ROOT))


if __name__ == "__main__":
    sys.exit(main())
