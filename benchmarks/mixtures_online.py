"""Online against batch for the ``kmeans`` and ``gaussian_mixture`` states (docs/reproductions.md,
"Private mixtures"): the same reports folded into one state in offset order, into 4 partition
states merged as serve merges them, and fitted in batch as ``ldp-stream analyze`` does.

Three unit-variance spherical components 8 SD apart in two fields (an equilateral triangle turned
by 0.3 rad, so that the canonical order — ascending first field — is well defined), box
= the centres' bounding box ± 4 SD, ZIL with the given (δ, λ). Reports as 10⁶ rows, folded in polls
of 5000 (partition p gets rows ``i ≡ p mod 4``), the state defaults (warm-up 20000, blocks of
1000; the mixture runs use fewer reports, ``--n-mixture``). Measured per parameter:
(online − batch)/batch SE, (merged − batch)/batch SE, (merged − online)/batch SE and the SE
ratios.

    python -m benchmarks.mixtures_online [--n 1000000] [--n-mixture 200000]
                                         [--kinds kmeans,gaussian_mixture]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from aggregator.state import build_state
from benchmarks._common import machine_info, table, write_json
from ingest.client.batch import ReportBatch
from ingest.client.schema import TelemetrySchema
from mechanisms.mixtures import fit_gaussian_mixture, fit_kmeans

SETTINGS = ((0.2, 0.5), (0.1, 0.25))
POLL = 5000
PARTITIONS = 4


def _data(n: int, delta: float, lam: float, seed: int):
    rng = np.random.default_rng(seed)
    ang = 0.3 + np.array([0.0, 2 * np.pi / 3, 4 * np.pi / 3])  # distinct first coordinates
    centres = np.column_stack([np.cos(ang), np.sin(ang)]) * 8.0 / np.sqrt(3.0)
    lo, hi = centres.min(axis=0) - 4.0, centres.max(axis=0) + 4.0
    schema = TelemetrySchema.from_dict({
        "name": "clusters", "version": 1,
        "numeric": {"zero_prob": delta, "scale": lam, "fields": [
            {"name": "a", "low": float(lo[0]), "high": float(hi[0])},
            {"name": "b", "low": float(lo[1]), "high": float(hi[1])}]}})
    zil = schema.zil_mechanism()
    x = centres[rng.integers(3, size=n)] + rng.standard_normal((n, 2))
    x1 = zil.privatize(x, rng)
    return schema, zil, x1, zil.double(x1, rng), lo, hi


def _fold(state, schema, x1, x2):
    for s in range(0, x1.shape[0], POLL):
        state.update(ReportBatch(schema.fingerprint, x1[s:s + POLL], {}), x2[s:s + POLL])
    return state


def run_one(kind: str, n: int, delta: float, lam: float, seed: int) -> dict:
    schema, zil, x1, x2, lo, hi = _data(n, delta, lam, seed)
    q = {"kind": kind, "name": "clusters", "fields": ["a", "b"], "k": 3}
    t0 = time.perf_counter()
    one = _fold(build_state(q, schema), schema, x1, x2).estimate()
    t_online = time.perf_counter() - t0
    part = np.arange(n) % PARTITIONS
    states = [_fold(build_state(q, schema), schema, x1[part == p], x2[part == p]) for p in range(PARTITIONS)]
    merged = states[0]
    for st in states[1:]:
        merged = merged + st
    four = merged.estimate()
    t0 = time.perf_counter()
    if kind == "kmeans":
        batch = fit_kmeans(x1, x2, k=3, low=lo, high=hi, zero_prob=delta, fields=["a", "b"])
    else:
        batch = fit_gaussian_mixture(x1, k=3, low=lo, high=hi, zero_prob=delta, scale=zil.coord_scale,
                                     fields=["a", "b"])
    t_batch = time.perf_counter() - t0
    assert tuple(batch.params) == one.params == four.params
    se = batch.stderr
    return {
        "kind": kind, "n": n, "zero_prob": delta, "scale": lam, "seed": seed, "params": list(batch.params),
        "batch": batch.value.tolist(), "batch_se": se.tolist(),
        "online": one.value.tolist(), "online_se": one.stderr.tolist(),
        "merged4": four.value.tolist(), "merged4_se": four.stderr.tolist(),
        "online_dev_se": ((one.value - batch.value) / se).tolist(),
        "merged4_dev_se": ((four.value - batch.value) / se).tolist(),
        "merged4_vs_online_dev_se": ((four.value - one.value) / se).tolist(),
        "online_se_ratio": (one.stderr / se).tolist(), "merged4_se_ratio": (four.stderr / se).tolist(),
        "notes": list(one.notes) + list(four.notes) + [str(v) for v in batch.unidentified.values()],
        "seconds": {"online_one_pass": round(t_online, 1), "batch": round(t_batch, 1)},
    }


HEADERS = ["kind", "(δ, λ)", "n", "max |online − batch|/SE", "max |merged4 − batch|/SE",
           "max |merged4 − online|/SE", "online SE / batch SE", "merged4 SE / batch SE"]


def _summary(r: dict) -> list:
    sel = [i for i, p in enumerate(r["params"]) if ".weight" not in p and ".var." not in p] \
        if r["kind"] == "gaussian_mixture" else list(range(len(r["params"])))

    def mx(key):
        return float(np.max(np.abs(np.asarray(r[key])[sel])))

    def rng_(key):
        a = np.asarray(r[key])[sel]
        return f"{a.min():.2f}–{a.max():.2f}"

    return [r["kind"], f"({r['zero_prob']}, {r['scale']})", f"{r['n']:.0e}", f"{mx('online_dev_se'):.2f}",
            f"{mx('merged4_dev_se'):.2f}", f"{mx('merged4_vs_online_dev_se'):.2f}", rng_("online_se_ratio"),
            rng_("merged4_se_ratio")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="reports of the kmeans runs")
    ap.add_argument("--n-mixture", type=int, default=200_000,
                    help="reports of the gaussian_mixture runs (the deconvolution fit is the slow part)")
    ap.add_argument("--kinds", default="kmeans,gaussian_mixture")
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args(argv)
    machine = machine_info()
    results = []
    for kind in args.kinds.split(","):
        for delta, lam in SETTINGS:
            r = run_one(kind, args.n if kind == "kmeans" else args.n_mixture, delta, lam, args.seed)
            results.append(r)
            print(table(HEADERS, [_summary(r)]), flush=True)
    write_json("mixtures_online", {"command": "python -m benchmarks.mixtures_online "
                                   + " ".join(argv or []), "results": results, "machine": machine})
    print(table(HEADERS, [_summary(r) for r in results]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
