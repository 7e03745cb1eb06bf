"""Reproduce the simulations of the ZIL paper (Lu, Chen & Qiu, arXiv 2501.15127, §7).

Run: ``python -m benchmarks.repro_zil [--part 71 72 73] [--reps71 R] [--reps72 R] [--reps73 R]
[--quick]`` — prints the RMSE tables, writes ``benchmarks/results/repro_zil.json`` and the plots
``docs/img/repro_zil_*.png``.

* §7.1 non-smooth transforms ``ℓ_j = (θ − g_j(x))²``, g = ReLU, 1[0.5,1], |sin 2πx|, X ~ U(0,1),
  (δ, λ) = (0.1, 0.94) and (0.05, 1.4), n = 500…5000: oracle, SL and DR RMSE. SL uses the
  almost-everywhere derivatives of g (ReLU'' = 1[0.5,1]'' = 0, |sin 2πx|'' = −4π²|sin 2πx|), the only
  way to apply it to these g; it is biased, DR is consistent. Closed forms, vectorised over
  replications; replication 0 is cross-checked against ``mechanisms.estimation.m_estimate``.
* §7.2 logistic regression, X ~ N(0, I₆) truncated to [−1, 1]⁶, β = 1₆ (no intercept),
  (λ, δ) = (0.5, 0.2) and (1, 0.2) (λ = noise std in the units of X, so c_A = 2/λ = 4 and 2),
  n = 5000, 7500, 10000: oracle, naive, SL, SDR, DR via ``m_estimate`` (BFGS).
* §7.3 median regression ``y = 1 + Σ X_j + ε``, ε ~ N(0, 1), same covariates, (λ, δ) = (2, 0.2) and
  (2.5, 0.2) (the paper's text; its Table 3 caption says T₆,₂ and T₆,₀.₈, i.e. c_A = 2/λ gives 1 and
  0.8 — the caption's "2" would be λ = 1), n = 2500, 5000, 7500: oracle, naive, DR (``m_estimate``,
  restarted Nelder–Mead) and sCL — the smoothed corrected loss of Wang, Stefanski & Zhu (2012):
  the check loss smoothed with a Gaussian kernel of bandwidth h, corrected for the SL noise of
  X̃₂ by ``ℓ − (λ²/2)Δₓℓ`` (:class:`SmoothedCheckRegressionLoss`).

RMSE of a vector parameter is the average over coordinates of the per-coordinate RMSE (paper §7.3,
"average RMSEs"). Fewer replications than the paper's 5000 for §7.2/§7.3 (iterative fits; see
``--reps72/--reps73``).
"""

from __future__ import annotations

import argparse
import json
import math
import warnings

import numpy as np
from scipy import special, stats

from benchmarks._common import RESULTS, Timer, savefig, table, use_agg, write_json
from benchmarks.paper_losses import abs_sin_2pi, indicator_half_one, relu
from mechanisms.errors import ConvergenceWarning
from mechanisms.estimation import m_estimate
from mechanisms.losses import LogisticLoss, QuantileRegressionLoss, TransformSquaredLoss
from mechanisms.zil import ZILMechanism

SETTINGS_71 = [(0.1, 0.94), (0.05, 1.4)]  # (δ, λ)
N_71 = [500, 1000, 2000, 3000, 4000, 5000]
SETTINGS_72 = [(0.5, 0.2), (1.0, 0.2)]  # (λ, δ)
N_72 = [5000, 7500, 10000]
SETTINGS_73 = [(2.0, 0.2), (2.5, 0.2)]  # (λ, δ)
N_73 = [2500, 5000, 7500]
SCL_BANDWIDTH = 1.0

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# ------------------------------------------------------------------------------------------------
# §7.1 losses with almost-everywhere derivatives (for SL)
# ------------------------------------------------------------------------------------------------


def _col(x):
    a = np.asarray(x, dtype=np.float64)
    return a.reshape(a.shape[0], -1)[:, 0]


def _relu_d1(x):
    return (_col(x) > 0).astype(np.float64)


def _zero(x):
    return np.zeros(_col(x).shape)


def _abs_sin_d1(x):
    c = _col(x)
    return 2 * np.pi * np.cos(2 * np.pi * c) * np.sign(np.sin(2 * np.pi * c))


def _abs_sin_d2(x):
    return -4 * np.pi**2 * np.abs(np.sin(2 * np.pi * _col(x)))


#: (name, g, g', g'' almost everywhere, θ₀ = E g(U(0,1)))
TRANSFORMS_71 = [
    ("relu", relu, _relu_d1, _zero, 0.5),
    ("indicator", indicator_half_one, _zero, _zero, 0.5),
    ("abs_sin", abs_sin_2pi, _abs_sin_d1, _abs_sin_d2, 2 / np.pi),
]


def ae_loss(name: str) -> TransformSquaredLoss:
    """``(θ − g(x))²`` for a §7.1 transform with its almost-everywhere derivatives, flagged smooth
    so that SL can be applied (paper §7.1 compares SL against DR on exactly these losses).

    Parameters
    ----------
    name : {"relu", "indicator", "abs_sin"}

    Raises
    ------
    KeyError
        For another name.
    """
    spec = {t[0]: t for t in TRANSFORMS_71}[name]
    return TransformSquaredLoss(spec[1], spec[2], spec[3], smooth=True, name=f"{name}_ae")


def run_71(reps: int, rng: np.random.Generator) -> dict:
    """§7.1: RMSE of oracle, SL and DR for the three transforms; vectorised over ``reps``.

    Returns
    -------
    dict with ``rows`` [setting, transform, n, method, rmse, bias, sd] and ``check`` (max abs
    difference between the vectorised closed forms and ``m_estimate`` on replication 0).
    """
    rows, maxdiff = [], 0.0
    for delta, lam in SETTINGS_71:
        zil = ZILMechanism(delta, lam, 0.0, 1.0)
        for n in N_71:
            x = rng.uniform(0.0, 1.0, size=(reps * n, 1))
            x1 = zil.privatize(x, rng)
            x2 = zil.double(x1, rng)
            for name, g, _, g2, theta0 in TRANSFORMS_71:
                gx = g(x).reshape(reps, n)
                g1 = g(x1).reshape(reps, n)
                gx2 = g(x2).reshape(reps, n)
                est = {
                    "oracle": gx.mean(axis=1),
                    "sl": (gx2 - 0.5 * lam**2 * g2(x2).reshape(reps, n)).mean(axis=1),
                    "dr": (g1.mean(axis=1) - (1 - delta) * gx2.mean(axis=1)) / delta,
                }
                # cross-check replication 0 against the library's m_estimate
                loss = ae_loss(name)
                sl0 = slice(0, n)
                for m, e in est.items():
                    r = m_estimate(loss, x[sl0] if m == "oracle" else x1[sl0], x2[sl0],
                                   zero_prob=delta, scale=lam, method=m)
                    maxdiff = max(maxdiff, abs(float(r.theta[0]) - float(e[0])))
                for m, e in est.items():
                    err = e - theta0
                    rows.append([f"δ={delta}, λ={lam}", name, n, m, float(np.sqrt(np.mean(err**2))),
                                 float(err.mean()), float(err.std(ddof=1))])
    return {"reps": reps, "rows": rows, "check_max_abs_diff_vs_m_estimate": maxdiff}


# ------------------------------------------------------------------------------------------------
# §7.2 / §7.3 data
# ------------------------------------------------------------------------------------------------


def truncated_normal(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """(n, d) draws of N(0, I_d) truncated to [−1, 1]^d (independent coordinates)."""
    return stats.truncnorm.rvs(-1.0, 1.0, size=(n, d), random_state=rng)


def _zil6(lam: float, delta: float) -> ZILMechanism:
    # noise std λ in the units of X ∈ [−1, 1]: scale per unit of range = λ/2 (c_A = 2/λ)
    return ZILMechanism(delta, lam / 2.0, -np.ones(6), np.ones(6))


def _fit(loss, a1, a2, delta, lam, method, counters) -> np.ndarray:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always", ConvergenceWarning)
        r = m_estimate(loss, a1, a2, zero_prob=delta, scale=lam, method=method)
    if any(issubclass(x.category, ConvergenceWarning) for x in w) or not r.converged:
        counters[method] = counters.get(method, 0) + 1
    return r.theta


def run_72(reps: int, rng: np.random.Generator) -> dict:
    """§7.2 logistic regression: oracle, naive, SL, SDR, DR RMSE (average over the 6 coefficients).

    Returns
    -------
    dict with ``rows`` [setting, n, method, avg_rmse, max_abs_bias] and ``nonconverged`` counts.
    """
    beta = np.ones(6)
    loss = LogisticLoss(intercept=False, noised=tuple(range(6)))
    methods = ["oracle", "naive", "sl", "sdr", "dr"]
    est = {(s, n, m): [] for s in range(len(SETTINGS_72)) for n in N_72 for m in methods}
    bad: dict[str, int] = {}
    for _ in range(reps):
        for n in N_72:
            x = truncated_normal(n, 6, rng)
            y = (rng.random(n) < special.expit(x @ beta)).astype(np.float64)
            orc = _fit(loss, np.c_[x, y], None, None, None, "oracle", bad)
            for s, (lam, delta) in enumerate(SETTINGS_72):
                zil = _zil6(lam, delta)
                x1 = zil.privatize(x, rng)
                x2 = zil.double(x1, rng)
                a1, a2 = np.c_[x1, y], np.c_[x2, y]
                est[(s, n, "oracle")].append(orc)
                for m in methods[1:]:
                    est[(s, n, m)].append(_fit(loss, a1, a2, delta, lam, m, bad))
    rows = []
    for (s, n, m), v in est.items():
        err = np.array(v) - beta
        lam, delta = SETTINGS_72[s]
        rows.append([f"λ={lam}, δ={delta}", n, m, float(np.mean(np.sqrt(np.mean(err**2, axis=0)))),
                     float(np.max(np.abs(err.mean(axis=0))))])
    return {"reps": reps, "rows": rows, "nonconverged": bad}


# ------------------------------------------------------------------------------------------------
# §7.3 sCL competitor
# ------------------------------------------------------------------------------------------------


class SmoothedCheckRegressionLoss(QuantileRegressionLoss):
    """Kernel-smoothed check loss ``ρ_h(y − zᵀβ)`` (Wang, Stefanski & Zhu 2012), smooth in x.

    ``ρ_h(r) = E ρ_τ(r + hU) = r(τ − Φ(−r/h)) + h φ(r/h)``, U ~ N(0, 1): twice differentiable,
    ``ρ_h'' = φ(r/h)/h``, so the SL correction ``ℓ − (λ²/2)Δₓℓ = ρ_h(r) − (λ²/2)‖β_noised‖² φ(r/h)/h``
    removes the SL(λ²) noise of X̃₂ exactly (docs/mechanisms.md §2.4); the estimate targets the
    minimiser of ``E ρ_h(Y − Xᵀβ)``, which equals the median regression for errors symmetric about
    0 (as in §7.3). Used with ``m_estimate(..., method="sl")`` as the paper's "sCL" competitor.

    Parameters
    ----------
    bandwidth : float
        h > 0, in the units of y.
    tau : float
        Quantile level in (0, 1).
    **kwargs
        ``intercept``, ``noised``, ``covariates`` as in :class:`QuantileRegressionLoss`.

    Raises
    ------
    mechanisms.errors.ParameterError
        If ``tau`` ∉ (0, 1) or the index lists are invalid; ``ValueError`` if bandwidth ≤ 0.
    """

    name = "smoothed_check_regression"
    smooth_theta = True
    _phi_smooth = True

    def __init__(self, bandwidth: float, tau: float = 0.5, **kwargs) -> None:
        if not (math.isfinite(bandwidth) and bandwidth > 0):
            raise ValueError(f"bandwidth must be a finite number > 0, got {bandwidth}")
        super().__init__(tau=tau, **kwargs)
        self.h = float(bandwidth)

    def _phi(self, eta, y):
        r = y - eta
        u = r / self.h
        return r * (self.tau - special.ndtr(-u)) + self.h * _INV_SQRT_2PI * np.exp(-0.5 * u * u)

    def _phi_eta(self, eta, y):
        return special.ndtr(-(y - eta) / self.h) - self.tau

    def _phi_ee(self, eta, y):
        u = (y - eta) / self.h
        return _INV_SQRT_2PI * np.exp(-0.5 * u * u) / self.h

    def _phi_eee(self, eta, y):
        u = (y - eta) / self.h
        return u / self.h * _INV_SQRT_2PI * np.exp(-0.5 * u * u) / self.h

    def _phi_yy(self, eta, y):
        return self._phi_ee(eta, y)

    def _phi_yye(self, eta, y):
        return self._phi_eee(eta, y)

    def _kink(self, eta, y):
        return None


def run_73(reps: int, rng: np.random.Generator, bandwidth: float = SCL_BANDWIDTH) -> dict:
    """§7.3 median regression: oracle, naive, sCL, DR RMSE (average over the 7 coefficients).

    Returns
    -------
    dict with ``rows`` [setting, n, method, avg_rmse, max_abs_bias], ``nonconverged`` counts and
    the sCL ``bandwidth``.
    """
    beta = np.ones(7)
    qloss = QuantileRegressionLoss(0.5, intercept=True, noised=tuple(range(6)))
    sloss = SmoothedCheckRegressionLoss(bandwidth, 0.5, intercept=True, noised=tuple(range(6)))
    methods = ["oracle", "naive", "scl", "dr"]
    est = {(s, n, m): [] for s in range(len(SETTINGS_73)) for n in N_73 for m in methods}
    bad: dict[str, int] = {}
    for _ in range(reps):
        for n in N_73:
            x = truncated_normal(n, 6, rng)
            y = 1.0 + x.sum(axis=1) + rng.standard_normal(n)
            orc = _fit(qloss, np.c_[x, y], None, None, None, "oracle", bad)
            for s, (lam, delta) in enumerate(SETTINGS_73):
                zil = _zil6(lam, delta)
                x1 = zil.privatize(x, rng)
                x2 = zil.double(x1, rng)
                a1, a2 = np.c_[x1, y], np.c_[x2, y]
                est[(s, n, "oracle")].append(orc)
                est[(s, n, "naive")].append(_fit(qloss, a1, None, delta, lam, "naive", bad))
                est[(s, n, "dr")].append(_fit(qloss, a1, a2, delta, lam, "dr", bad))
                th = _fit(sloss, a1, a2, delta, lam, "sl", bad)
                est[(s, n, "scl")].append(th)
    rows = []
    for (s, n, m), v in est.items():
        err = np.array(v) - beta
        lam, delta = SETTINGS_73[s]
        rows.append([f"λ={lam}, δ={delta}", n, m, float(np.mean(np.sqrt(np.mean(err**2, axis=0)))),
                     float(np.max(np.abs(err.mean(axis=0))))])
    if "sl" in bad:
        bad["scl"] = bad.pop("sl")
    return {"reps": reps, "rows": rows, "nonconverged": bad, "bandwidth": bandwidth}


# ------------------------------------------------------------------------------------------------
# plots
# ------------------------------------------------------------------------------------------------


def plot_71(res: dict) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5), sharex=True)
    settings = sorted({r[0] for r in res["rows"]}, reverse=True)
    names = [t[0] for t in TRANSFORMS_71]
    for i, st in enumerate(settings):
        for j, nm in enumerate(names):
            ax = axes[i, j]
            for m, mk in (("oracle", "o-"), ("sl", "s-"), ("dr", "^-")):
                pts = [(r[2], r[4]) for r in res["rows"] if r[0] == st and r[1] == nm and r[3] == m]
                ax.plot(*zip(*pts, strict=True), mk, label=m.upper() if m != "oracle" else "oracle")
            ax.set_yscale("log")
            ax.set_title(f"{nm}, {st}", fontsize=9)
            ax.grid(alpha=0.3)
            if i == 1:
                ax.set_xlabel("n")
            if j == 0:
                ax.set_ylabel("RMSE")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"ZIL paper §7.1: RMSE vs n ({res['reps']} replications)")
    savefig(fig, "repro_zil_71")


def plot_reg(res: dict, methods: list[str], name: str, title: str) -> None:
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(r[0] for r in res["rows"]))
    fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 3.8), sharey=True)
    for ax, st in zip(np.atleast_1d(axes), settings, strict=True):
        for m in methods:
            pts = sorted((r[1], r[3]) for r in res["rows"] if r[0] == st and r[2] == m)
            ax.plot(*zip(*pts, strict=True), "o-", label=m.upper() if m != "oracle" else "oracle")
        ax.set_yscale("log")
        ax.set_title(st)
        ax.set_xlabel("n")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("average RMSE")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.suptitle(f"{title} ({res['reps']} replications)")
    savefig(fig, name)


# ------------------------------------------------------------------------------------------------


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", nargs="*", default=["71", "72", "73"], choices=["71", "72", "73"])
    ap.add_argument("--reps71", type=int, default=2000)
    ap.add_argument("--reps72", type=int, default=20)
    ap.add_argument("--reps73", type=int, default=8)
    ap.add_argument("--seed", type=int, default=20250701)
    ap.add_argument("--quick", action="store_true", help="200 / 3 / 2 replications (smoke run)")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps71, args.reps72, args.reps73 = 200, 3, 2
    if not args.no_plots:
        use_agg()
    rng = np.random.default_rng(args.seed)
    out: dict = {"seed": args.seed, "quick": args.quick}
    if "71" in args.part:
        with Timer() as t:
            r = run_71(args.reps71, rng)
        r["seconds"] = t.seconds
        out["s71"] = r
        print(table(["setting", "loss", "n", "method", "RMSE", "bias", "sd"], r["rows"],
                    f"§7.1 ({r['reps']} reps, {t.seconds:.0f} s; |closed form − m_estimate| ≤ "
                    f"{r['check_max_abs_diff_vs_m_estimate']:.1e})"))
        if not args.no_plots:
            plot_71(r)
    if "72" in args.part:
        with Timer() as t:
            r = run_72(args.reps72, rng)
        r["seconds"] = t.seconds
        out["s72"] = r
        print(table(["setting", "n", "method", "avg RMSE", "max |bias|"], r["rows"],
                    f"§7.2 logistic ({r['reps']} reps, {t.seconds:.0f} s, "
                    f"non-converged {r['nonconverged']})"))
        if not args.no_plots:
            plot_reg(r, ["oracle", "naive", "sl", "sdr", "dr"], "repro_zil_72",
                     "ZIL paper §7.2: logistic regression")
    if "73" in args.part:
        with Timer() as t:
            r = run_73(args.reps73, rng)
        r["seconds"] = t.seconds
        out["s73"] = r
        print(table(["setting", "n", "method", "avg RMSE", "max |bias|"], r["rows"],
                    f"§7.3 median regression ({r['reps']} reps, {t.seconds:.0f} s, h={r['bandwidth']}, "
                    f"non-converged {r['nonconverged']})"))
        if not args.no_plots:
            plot_reg(r, ["oracle", "naive", "scl", "dr"], "repro_zil_73",
                     "ZIL paper §7.3: median regression")
    old = RESULTS / "repro_zil.json"
    if old.exists():  # keep the sections of a previous run that were not re-run now
        prev = json.loads(old.read_text())
        for key in ("s71", "s72", "s73"):
            if key not in out and key in prev:
                out[key] = prev[key]
    print("wrote", write_json("repro_zil", out))


if __name__ == "__main__":
    main()
