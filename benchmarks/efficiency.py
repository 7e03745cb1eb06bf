"""Statistical efficiency: online aggregator states vs batch M-estimation vs the sandwich theory.

Run ``python -m benchmarks.efficiency [--quick] [--reps-small R1] [--reps-large R2]``; prints a table
and writes ``benchmarks/results/efficiency.json`` and ``docs/img/efficiency_rmse.png``.

Simulated streams on a small schema (one ZIL vector over 5 numeric fields, δ = 0.2, λ = 0.5 —
paper §7.2's (λ, δ) = (0.5, 0.2)):

* ``v ~ Beta(2, 5)`` on [0, 1]: **mean** (MomentsState, SDR) and **median** (HistogramState, DR CDF);
* ``c1, c2 ~ U(−1, 1)``; ``lab ~ Bernoulli(σ(0.5 + c1 − c2))`` on [0, 1]: **logistic regression**
  ``y = 1{lab > 0.5}`` (SGDState, DR, averaged SGD with random-scaling CI);
* ``y = 1 + c1 − c2 + N(0, 0.5²)`` on [−3, 5]: **median regression** (SGDState, DR, τ = 0.5).

Each replication privatizes n reports with the schema's ZIL mechanism, feeds them to the states built
by ``aggregator.state.build_state(query, schema)`` in records of 1000 reports (``X̃₂`` doubled once
per record, as the worker does), and fits the same reports in batch: ``mechanisms.estimation.
m_estimate`` (SquaredLoss SDR, LogisticLoss DR, QuantileRegressionLoss DR) and ``dr_quantile``.

Reported per estimator, parameter and n: RMSE·√n over the replications, the mean reported standard
error·√n, and the 95 % CI coverage of the truth; the sandwich theory value is ``√(V⁻¹AV⁻¹)_jj``
(docs/mechanisms.md §4.2), taken as the mean plug-in sandwich standard error·√n of the batch fit at
the largest n.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np
from scipy import stats

from benchmarks._common import savefig, table, use_agg, write_json

ZERO_PROB, SCALE = 0.2, 0.5
RECORD = 1000
BETA_LOGIT = np.array([0.5, 1.0, -1.0])
BETA_MEDREG = np.array([1.0, 1.0, -1.0])
TRUTH = {
    "mean": np.array([2.0 / 7.0]),
    "median": np.array([stats.beta.ppf(0.5, 2, 5)]),
    "logistic": BETA_LOGIT,
    "median_regression": BETA_MEDREG,
}
PARAMS = {"mean": ["mean"], "median": ["q0.5"], "logistic": ["intercept", "c1", "c2"],
          "median_regression": ["intercept", "c1", "c2"]}

SCHEMA = {
    "name": "efficiency", "version": 1,
    "numeric": {"zero_prob": ZERO_PROB, "scale": SCALE, "fields": [
        {"name": "v", "low": 0.0, "high": 1.0},
        {"name": "c1", "low": -1.0, "high": 1.0},
        {"name": "c2", "low": -1.0, "high": 1.0},
        {"name": "lab", "low": 0.0, "high": 1.0},
        {"name": "y", "low": -3.0, "high": 5.0},
    ]},
}
QUERIES = {
    "mean": {"kind": "mean", "name": "mean", "field": "v"},
    "median": {"kind": "quantiles", "name": "median", "field": "v", "q": [0.5], "bins": 2000},
    "logistic": {"kind": "logistic_regression", "name": "logistic", "covariates": ["c1", "c2"],
                 "label": "lab", "threshold": 0.5, "estimator": "dr"},
    "median_regression": {"kind": "quantile_regression", "name": "median_regression", "response": "y",
                          "covariates": ["c1", "c2"], "tau": 0.5, "estimator": "dr"},
}
V, C1, C2, LAB, Y = range(5)


def simulate(n: int, rng: np.random.Generator) -> np.ndarray:
    """Raw (clipped) records, shape (n, 5): columns v, c1, c2, lab, y (docs/benchmarks.md §2)."""
    v = rng.beta(2.0, 5.0, n)
    c = rng.uniform(-1.0, 1.0, (n, 2))
    eta = BETA_LOGIT[0] + c @ BETA_LOGIT[1:]
    lab = (rng.random(n) < 1.0 / (1.0 + np.exp(-eta))).astype(float)
    y = BETA_MEDREG[0] + c @ BETA_MEDREG[1:] + 0.5 * rng.standard_normal(n)
    return np.column_stack([v, c, lab, np.clip(y, -3.0, 5.0)])


def one_rep(schema, n: int, seed: int) -> dict:
    """One stream of n reports → {estimator: {name: (value, stderr, ci_low, ci_high)}}."""
    from aggregator.state import build_state
    from ingest.batch import ReportBatch
    from mechanisms.estimation import dr_quantile, m_estimate
    from mechanisms.losses import LogisticLoss, QuantileRegressionLoss, SquaredLoss

    rng = np.random.default_rng(seed)
    mech = schema.zil_mechanism()
    x = simulate(n, rng)
    x1 = mech.privatize(x, rng=rng)
    x2 = np.empty_like(x1)
    states = {k: build_state(q, schema) for k, q in QUERIES.items()}
    t0 = time.process_time()
    for s in range(0, n, RECORD):
        b1 = x1[s:s + RECORD]
        b2 = mech.double(b1, rng=rng)
        x2[s:s + RECORD] = b2
        batch = ReportBatch(bytes(schema.fingerprint), b1, {})
        for st in states.values():
            st.update(batch, b2)
    t_online = time.process_time() - t0
    online = {}
    for k, st in states.items():
        e = st.estimate()
        online[k] = (np.array(e.value), np.array(e.stderr), np.array(e.ci_low), np.array(e.ci_high))

    t0 = time.process_time()
    sd = mech.coord_scale
    fits = {}
    fits["mean"] = m_estimate(SquaredLoss(1), x1[:, [V]], x2[:, [V]], zero_prob=ZERO_PROB, scale=sd[[V]],
                              method="sdr")
    fits["median"] = dr_quantile(x1[:, V], x2[:, V], 0.5, ZERO_PROB)
    cols = [C1, C2, LAB]
    logit = LogisticLoss(covariates=(0, 1), noised=(0, 1, 2), label=lambda a: (a[:, 2] > 0.5).astype(float))
    fits["logistic"] = m_estimate(logit, x1[:, cols], x2[:, cols], zero_prob=ZERO_PROB, method="dr")
    cols = [C1, C2, Y]
    fits["median_regression"] = m_estimate(QuantileRegressionLoss(tau=0.5, noised=(0, 1, 2)), x1[:, cols],
                                           x2[:, cols], zero_prob=ZERO_PROB, method="dr")
    t_batch = time.process_time() - t0
    batch = {}
    for k, f in fits.items():
        lo, hi = f.ci(0.95)
        batch[k] = (np.array(f.theta), np.array(f.stderr), np.array(lo), np.array(hi))
    return {"online": online, "batch": batch, "cpu_online_s": t_online, "cpu_batch_s": t_batch}


def summarise(reps: list[dict], n: int) -> list[dict]:
    rows = []
    for est in ("online", "batch"):
        for k in QUERIES:
            vals = np.array([r[est][k][0] for r in reps])
            ses = np.array([r[est][k][1] for r in reps])
            lo = np.array([r[est][k][2] for r in reps])
            hi = np.array([r[est][k][3] for r in reps])
            truth = TRUTH[k]
            err = vals - truth
            cover = (lo <= truth) & (truth <= hi)
            for j, p in enumerate(PARAMS[k]):
                rows.append({"n": n, "estimator": est, "query": k, "param": p, "reps": len(reps),
                             "bias": float(err[:, j].mean()),
                             "rmse_sqrt_n": float(np.sqrt(np.mean(err[:, j] ** 2)) * np.sqrt(n)),
                             "mean_se_sqrt_n": float(np.mean(ses[:, j]) * np.sqrt(n)),
                             "coverage": float(cover[:, j].mean())})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 10⁴ only, 5 replications")
    ap.add_argument("--reps-small", type=int, default=100, help="replications at n = 10⁴ (default 100)")
    ap.add_argument("--reps-large", type=int, default=20, help="replications at n = 10⁵ (default 20)")
    ap.add_argument("--seed", type=int, default=20261130)
    args = ap.parse_args(argv)
    from ingest.schema import TelemetrySchema

    schema = TelemetrySchema.from_dict(SCHEMA)
    plan = [(10_000, 5)] if args.quick else [(10_000, args.reps_small), (100_000, args.reps_large)]
    rows, cpu = [], {}
    t_start = time.perf_counter()
    for n, reps in plan:
        out = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarnings are counted via the results
            for r in range(reps):
                out.append(one_rep(schema, n, args.seed + 1000 * r + n))
        rows += summarise(out, n)
        cpu[n] = {"online_s_per_rep": float(np.mean([o["cpu_online_s"] for o in out])),
                  "batch_s_per_rep": float(np.mean([o["cpu_batch_s"] for o in out]))}
        print(f"n={n}: {reps} reps, {time.perf_counter() - t_start:.0f} s", flush=True)
    n_big = plan[-1][0]
    theory = {(r["query"], r["param"]): r["mean_se_sqrt_n"] for r in rows
              if r["n"] == n_big and r["estimator"] == "batch"}
    for r in rows:
        r["sandwich_sqrt_n"] = theory[(r["query"], r["param"])]
        r["rmse_over_sandwich"] = r["rmse_sqrt_n"] / r["sandwich_sqrt_n"]
    print(table(["n", "estimator", "query", "param", "reps", "RMSE·√n", "mean SE·√n", "sandwich √(V⁻¹AV⁻¹)",
                 "RMSE/sandwich", "95% coverage"],
                [(r["n"], r["estimator"], r["query"], r["param"], r["reps"], r["rmse_sqrt_n"],
                  r["mean_se_sqrt_n"], r["sandwich_sqrt_n"], r["rmse_over_sandwich"], r["coverage"])
                 for r in rows]))
    print(table(["n", "online CPU s/rep", "batch CPU s/rep"],
                [(n, c["online_s_per_rep"], c["batch_s_per_rep"]) for n, c in cpu.items()]))
    plots = [] if args.quick else [plot(rows)]
    path = write_json("efficiency", {"zero_prob": ZERO_PROB, "scale": SCALE, "record": RECORD,
                                     "truth": {k: v.tolist() for k, v in TRUTH.items()},
                                     "plan": plan, "rows": rows, "cpu": cpu, "plots": plots})
    print(f"wrote {path}")
    return 0


def plot(rows: list[dict]) -> str:
    use_agg()
    import matplotlib.pyplot as plt

    keys = [(r["query"], r["param"]) for r in rows if r["estimator"] == "batch" and r["n"] == rows[0]["n"]]
    ns = sorted({r["n"] for r in rows})
    fig, ax = plt.subplots(figsize=(8, 4))
    w = 0.8 / (2 * len(ns))
    for i, n in enumerate(ns):
        for j, est in enumerate(("online", "batch")):
            ys = [next(r["rmse_over_sandwich"] for r in rows if r["n"] == n and r["estimator"] == est
                       and (r["query"], r["param"]) == k) for k in keys]
            ax.bar(np.arange(len(keys)) + (2 * i + j - len(ns)) * w + w / 2, ys, w,
                   label=f"{est}, n = {n:.0e}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(keys)), [f"{q}\n{p}" for q, p in keys], fontsize=7)
    ax.set(ylabel="RMSE·√n / sandwich √(V⁻¹AV⁻¹)", title="Online vs batch efficiency (1 = sandwich theory)")
    ax.legend(fontsize=7)
    return str(savefig(fig, "efficiency_rmse"))


if __name__ == "__main__":
    sys.exit(main())
