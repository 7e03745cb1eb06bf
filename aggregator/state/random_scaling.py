"""Critical values of random-scaling intervals, for one SGD run or several merged ones.

Lee, Liao, Seo & Shin (2022), "Fast and robust online inference with stochastic gradient descent
via random scaling" (AAAI): the interval ``θ̄_j ± c·sqrt(V̂_jj/s)`` uses the critical value ``c``
of the ratio ``W(1) / sqrt(∫(W(r) − rW(1))² dr)`` of a Brownian motion ``W``. Used by
:class:`aggregator.state.sgd.SGDState`.
"""

from __future__ import annotations

import math

import numpy as np

from aggregator.errors import ConfigError

__all__ = ["RS_COMBINED_RATIO", "RS_CRITICAL", "rs_critical"]

#: Two-sided critical values of the random-scaling t-ratio by confidence level: 0.95 from
#: Lee et al. (2022) / Abadir & Paruolo (1997); the others from 2·10⁵ simulated Brownian paths
#: on a 2000-point grid (the simulation gives 6.731 at 0.95).
RS_CRITICAL = {
    0.5: 1.858, 0.6: 2.367, 0.7: 3.003, 0.8: 3.868, 0.85: 4.475, 0.9: 5.314,
    0.95: 6.747, 0.975: 8.114, 0.99: 9.933, 0.995: 11.325, 0.999: 14.641,
}


#: Critical values of K partitions' random-scaling runs combined by step-count weights, as ratios
#: to :data:`RS_CRITICAL` (K = 1), per K and per level of :data:`RS_CRITICAL` in increasing
#: order. K = ∞ is ``sqrt(6)·z`` (``E ∫(W(r) − rW(1))² dr = 1/6``). Simulated by
#: ``python -m benchmarks.rs_critical`` (4·10⁵ Brownian paths, seed 20261201; see there).
RS_COMBINED_RATIO = {
    1: (1.0000, 1.0000, 1.0000, 1.0000, 1.0000, 1.0000, 1.0000, 1.0000, 1.0000, 1.0000, 1.0000),
    2: (0.9449, 0.9376, 0.9263, 0.9124, 0.9030, 0.8904, 0.8724, 0.8526, 0.8389, 0.8288, 0.8169),
    3: (0.9285, 0.9183, 0.9005, 0.8789, 0.8658, 0.8473, 0.8213, 0.7976, 0.7776, 0.7630, 0.7416),
    4: (0.9184, 0.9060, 0.8864, 0.8641, 0.8488, 0.8261, 0.7950, 0.7666, 0.7399, 0.7225, 0.7008),
    5: (0.9122, 0.8972, 0.8774, 0.8529, 0.8368, 0.8131, 0.7833, 0.7518, 0.7215, 0.6999, 0.6708),
    6: (0.9079, 0.8945, 0.8736, 0.8454, 0.8285, 0.8044, 0.7698, 0.7375, 0.7076, 0.6902, 0.6564),
    8: (0.9053, 0.8904, 0.8678, 0.8375, 0.8187, 0.7936, 0.7557, 0.7206, 0.6885, 0.6663, 0.6332),
    10: (0.9007, 0.8840, 0.8615, 0.8311, 0.8114, 0.7841, 0.7450, 0.7096, 0.6737, 0.6509, 0.6128),
    12: (0.8974, 0.8819, 0.8602, 0.8297, 0.8099, 0.7826, 0.7417, 0.7058, 0.6713, 0.6472, 0.6069),
    16: (0.8971, 0.8804, 0.8580, 0.8248, 0.8049, 0.7774, 0.7363, 0.6979, 0.6612, 0.6354, 0.5954),
    24: (0.8930, 0.8761, 0.8529, 0.8198, 0.7973, 0.7702, 0.7294, 0.6877, 0.6501, 0.6227, 0.5826),
    32: (0.8920, 0.8762, 0.8512, 0.8173, 0.7965, 0.7683, 0.7268, 0.6865, 0.6468, 0.6195, 0.5780),
    64: (0.8899, 0.8708, 0.8474, 0.8132, 0.7929, 0.7624, 0.7198, 0.6790, 0.6366, 0.6092, 0.5613),
    math.inf: (0.8876, 0.8696, 0.8448, 0.8108, 0.7890, 0.7588, 0.7139, 0.6720, 0.6299, 0.6016, 0.5528),
}


def rs_critical(level: float, k_eff: float = 1.0) -> float:
    """Random-scaling critical value at ``level`` for ``k_eff`` combined partitions.

    ``k_eff = 1``: one run's value, interpolated in :data:`RS_CRITICAL`. For ``k_eff > 1`` that
    value times the ratio of :data:`RS_COMBINED_RATIO`, interpolated linearly in ``1/k_eff``
    (exact at the tabulated K for equal step counts; ``k_eff = (Σ s_k)²/Σ s_k²`` for unequal
    ones, an approximation).

    Raises
    ------
    ConfigError
        If ``level`` is outside [0.5, 0.999] or ``k_eff`` < 1.
    """
    keys = np.array(sorted(RS_CRITICAL))
    if not keys[0] <= level <= keys[-1]:
        raise ConfigError(f"level must be in [0.5, 0.999] for random-scaling intervals, got {level}")
    if not k_eff >= 1.0:
        raise ConfigError(f"k_eff must be >= 1, got {k_eff}")
    base = float(np.interp(level, keys, [RS_CRITICAL[k] for k in keys]))
    if k_eff == 1.0:
        return base
    ks = sorted(RS_COMBINED_RATIO, reverse=True)  # ∞ first: 1/K increasing for np.interp
    ratio = [float(np.interp(level, keys, RS_COMBINED_RATIO[k])) for k in ks]
    return base * float(np.interp(1.0 / k_eff, [1.0 / k for k in ks], ratio))
