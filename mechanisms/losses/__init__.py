"""Loss functions ``ℓ(x, θ)`` for M-estimation on ZIL-privatized records.

Source: Lu, Chen & Qiu, "Versatile differentially private learning for general loss functions"
(arXiv 2501.15127), §4–§7; docs/mechanisms.md §5.

A *record* is one row of an array ``x`` of shape ``(n, p)`` in original units. Every loss declares

* ``noised`` — the record columns that carry ZIL noise (the others are exact);
* ``smooth`` — whether ``ℓ`` is twice continuously differentiable in every noised column (needed by
  the SL and SDR corrected losses; DR needs only continuity);
* ``smooth_theta`` — whether ``∇θ ℓ`` is continuous in ``θ`` (gradient optimisers and small-step
  numerical Hessians are then appropriate);
* ``value(x, θ) -> (n,)`` and ``grad(x, θ) -> (n, q)`` (gradient in θ);
* where ``smooth``: ``laplacian_x(x, θ, weights) -> (n,)`` ``= Σ_j w_j ∂²ℓ/∂x_j²`` over the noised
  columns (``weights`` aligned with ``noised``; the SL covariance diagonal ``σ_j²`` in use) and
  ``grad_laplacian_x(x, θ, weights) -> (n, q)``, its θ-gradient.

``value``/``grad``/``laplacian_x`` do no validation (they sit in the online estimators' hot loop); call
:meth:`Loss.check_x` once on a batch first.

Modules: :mod:`~mechanisms.losses.base` (the :class:`Loss` interface),
:mod:`~mechanisms.losses.location` (mean, quantile, transform) and
:mod:`~mechanisms.losses.regression` (single-index losses); every name is importable from
``mechanisms.losses``. The paper's §7.1 example transforms are in ``benchmarks/paper_losses.py``.
"""

from mechanisms.losses.base import Loss
from mechanisms.losses.location import CheckLoss, SquaredLoss, TransformSquaredLoss
from mechanisms.losses.regression import (
    HingeLoss,
    HuberLoss,
    LinearRegressionLoss,
    LogisticLoss,
    NoisedLabelLogisticLoss,
    QuantileRegressionLoss,
)

__all__ = [
    "CheckLoss",
    "HingeLoss",
    "HuberLoss",
    "LinearRegressionLoss",
    "LogisticLoss",
    "Loss",
    "NoisedLabelLogisticLoss",
    "QuantileRegressionLoss",
    "SquaredLoss",
    "TransformSquaredLoss",
]
