"""User losses of the statistical-efficiency benchmark (``benchmarks/efficiency.py``), importable
as ``custom`` queries' ``loss = "benchmarks.efficiency_losses:<name>"`` (the benchmarks are a
package; run from the repository root)."""

from __future__ import annotations

from mechanisms.losses import HuberLoss


def huber_regression() -> HuberLoss:
    """Huber regression of ``y`` on ``(c1, c2)`` with an intercept, every field noised.

    Returns
    -------
    mechanisms.losses.HuberLoss
        Records ``(c1, c2, y)`` in original units, ``noised = (0, 1, 2)``, the default threshold
        ``c = 1.345`` (units of ``y``): no tuning to the data. Parameters ``(intercept, c1, c2)``.
    """
    return HuberLoss(noised=(0, 1, 2))
