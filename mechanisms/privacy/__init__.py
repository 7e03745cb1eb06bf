"""Privacy accounting of the ZIL mechanism in the f-DP framework of Dong, Roth & Su.

Source: Lu, Chen & Qiu, "Versatile differentially private learning for general loss functions"
(arXiv 2501.15127), §3.2 (Theorems 3.1–3.3, Propositions 3.1–3.2, Fig. 1); stated in docs/privacy.md §1–§2.

Vocabulary (the names used in code, CLI and docs):

* A **trade-off function** ``T(α)`` is the smallest type-II error of any test of "the input was
  x" against "the input was x′" whose type-I error is at most ``α``. ``1 − α`` means the two are
  indistinguishable; the lower the curve, the weaker the privacy.
* ``c`` is the shift between the two hypotheses in noise units: ``c = diameter / scale``.
  Record level (one whole report): ``c_I = √d / λ`` on the standardized box ``[0, 1]^d``;
  attribute level (one field of a report): ``c_A = 1 / λ``.
* ``zero_prob`` (δ) is the probability that a report is released **exactly, without noise**.
  Every trade-off is "shrunk" by it: ``T_δ(α) = (1 − δ)·T(α/(1 − δ))`` for ``α ≤ 1 − δ``, else 0,
  and every (ε, δ̃) statement has ``δ̃ ≥ δ``.

Trade-off functions provided:

* ``d = 1`` (exact): ``T_{1,c}(α) = F_Lap(F_Lap⁻¹(1 − α) − √2·c)`` — pure ε = √2·c.
* any ``d`` (lower bound, tight as ``d → ∞``): ``β_c`` computed by 1-d quadrature over
  ``W ~ Exp(1)``.
* a given ``d ≥ 1`` by Monte Carlo (Neyman–Pearson test on the exact SL_d likelihood ratio).

Extreme values: every function is finite, warning-free and has the right limit over the whole
range of doubles — ``c → 0`` (trade-off ``1 − α``, ``δ_c → 0``), ``c → ∞`` (trade-off 0 on
(0, 1], ``δ_c → 1``), ``ε → ∞`` (``δ_c → 0``, so ``δ̃ → zero_prob``). Quantities are formed so
that an overflow can only produce the limiting ``±∞`` (never ``∞ − ∞``), and answers that
themselves leave the double range (an ε beyond 1.8e308, a scale below 2.2e-308) raise
``ParameterError`` instead of returning ``inf`` or ``0``.

Modules: :mod:`~mechanisms.privacy.tradeoff` (trade-off functions),
:mod:`~mechanisms.privacy.conversion` (δ̃ for ε and ε for δ̃),
:mod:`~mechanisms.privacy.calibration` (the scale for a target (ε, δ̃)),
:mod:`~mechanisms.privacy.guarantee` (the report of one configuration); the quadrature they share
is in :mod:`~mechanisms.privacy._numerics`. Every public name is importable from here.
"""

from mechanisms.privacy.calibration import calibrate_c, calibrate_zil
from mechanisms.privacy.conversion import delta_c, delta_for_epsilon, epsilon_for_delta
from mechanisms.privacy.guarantee import DEFAULT_EPSILONS, ZILGuarantee, zil_guarantee
from mechanisms.privacy.tradeoff import (
    tradeoff_epsilon_delta,
    tradeoff_laplace,
    tradeoff_sl_limit,
    tradeoff_sl_monte_carlo,
    tradeoff_zil,
)

__all__ = [
    "DEFAULT_EPSILONS",
    "ZILGuarantee",
    "calibrate_c",
    "calibrate_zil",
    "delta_c",
    "delta_for_epsilon",
    "epsilon_for_delta",
    "tradeoff_epsilon_delta",
    "tradeoff_laplace",
    "tradeoff_sl_limit",
    "tradeoff_sl_monte_carlo",
    "tradeoff_zil",
    "zil_guarantee",
]
