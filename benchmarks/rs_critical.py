"""Critical values of a combination of K independent random-scaling t-ratios.

Run ``python -m benchmarks.rs_critical`` (≈ 35 s): prints the table that
``aggregator.state.random_scaling.RS_COMBINED_RATIO`` stores (2026-12-01, seed 20261201).

A partition's averaged SGD gives, asymptotically, ``sqrt(s)(θ̄ − θ) = σ W(1)`` and the random-scaling
variance ``V̂ = σ² D`` with ``D = ∫₀¹ (W(r) − r W(1))² dr`` (Lee, Liao, Seo & Shin 2022). K partitions
with equal step counts combined by step-count weights give the ratio
``T_K = Σ_k W_k(1) / sqrt(Σ_k D_k)``: K = 1 is the random-scaling statistic (6.747 at 95 %), and
``T_K → sqrt(6)·N(0, 1)`` as K → ∞ (``E D = 1/6``). Simulated: 4·10⁵ Brownian paths on a 2000-point
grid give pairs ``(W(1), D)``; ``T_K`` is drawn 4·10⁵ times from K pairs picked at random from them.
The stored table is each level's quantile of ``|T_K|`` divided by that of ``|T_1|``, so that
K = 1 keeps the published values and the grid's discretization bias (6.725 against 6.747)
cancels in the ratio.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

LEVELS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99, 0.995, 0.999)
KS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 64)


def simulate(n_paths: int = 400_000, grid: int = 2000, draws: int = 400_000,
             seed: int = 20261201) -> dict[int | float, np.ndarray]:
    """Quantiles of ``|T_K|`` at :data:`LEVELS` for each K of :data:`KS`, and the K → ∞ limit.

    Returns
    -------
    dict K → ndarray (len(LEVELS),); key ``inf`` holds ``sqrt(6)·z_{(1+level)/2}``.
    """
    rng = np.random.default_rng(seed)
    w1, d = np.empty(n_paths), np.empty(n_paths)
    t = np.arange(1, grid + 1) / grid
    chunk = 20_000
    for a in range(0, n_paths, chunk):
        m = min(chunk, n_paths - a)
        w = np.cumsum(rng.standard_normal((m, grid)) / np.sqrt(grid), axis=1)
        w1[a:a + m] = w[:, -1]
        d[a:a + m] = ((w - t * w[:, -1:]) ** 2).mean(axis=1)
    out: dict[int | float, np.ndarray] = {}
    for k in KS:
        if k == 1:
            tk = w1 / np.sqrt(d)
        else:
            idx = rng.integers(0, n_paths, size=(draws, k))
            tk = w1[idx].sum(axis=1) / np.sqrt(d[idx].sum(axis=1))
        out[k] = np.quantile(np.abs(tk), LEVELS)
    out[float("inf")] = np.sqrt(6.0) * stats.norm.ppf((1.0 + np.asarray(LEVELS)) / 2.0)
    return out


def main() -> None:
    q = simulate()
    base = q[1]
    print("level:", LEVELS)
    for k, v in q.items():
        print(f"{k}: quantiles {np.round(v, 3).tolist()}")
    print("\nratios to K = 1 (RS_COMBINED_RATIO):")
    for k, v in q.items():
        print(f"    {k}: ({', '.join(f'{x:.4f}' for x in v / base)}),")


if __name__ == "__main__":
    main()
