"""The privacy guarantee of one ZIL configuration, at record and attribute level, as one report
(Lu, Chen & Qiu 2025, Theorems 3.1 and 3.3)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from mechanisms._validate import check_open_unit, check_positive
from mechanisms.errors import ParameterError
from mechanisms.privacy._numerics import (
    _FLOAT_MAX,
    _SQRT2,
    _check_dim,
    _check_epsilon_array,
)
from mechanisms.privacy.conversion import delta_for_epsilon

__all__ = ["DEFAULT_EPSILONS", "ZILGuarantee", "zil_guarantee"]

#: ε values at which :func:`zil_guarantee` reports δ̃ by default.
DEFAULT_EPSILONS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class ZILGuarantee:
    """Privacy guarantee of one ZIL configuration, at record and attribute level.

    Attributes
    ----------
    zero_prob : float
        δ: probability that a report is released exactly (no noise).
    scale : float
        λ: noise standard deviation per unit of field range (standardized coordinates).
    dim : int
        d: number of numeric fields in one report.
    c_record : float
        ``c_I = √d / λ`` (whole report; diameter of ``[0, 1]^d`` is √d).
    c_attribute : float
        ``c_A = 1 / λ`` (one field).
    exact : bool
        True when d = 1 (exact Laplace trade-off); False means the δ̃ values come from the β_c
        lower bound of the trade-off (valid for every d, so they are conservative).
    epsilons : tuple of float
        ε values at which δ̃ is reported.
    delta_record, delta_attribute : tuple of float
        δ̃(ε) at record and attribute level, one per ε; each ≥ zero_prob.
    pure_epsilon : float or None
        For d = 1: ``√2·c`` — the mechanism is (pure_epsilon, zero_prob)-DP. None for d ≥ 2.

    Notes
    -----
    Source: paper Thm 3.1–3.3; docs/privacy.md §1, §2.
    """

    zero_prob: float
    scale: float
    dim: int
    c_record: float
    c_attribute: float
    exact: bool
    epsilons: tuple[float, ...]
    delta_record: tuple[float, ...]
    delta_attribute: tuple[float, ...]
    pure_epsilon: float | None

    def to_dict(self) -> dict:
        """Plain JSON-serialisable dict of every field (tuples become lists)."""
        out = asdict(self)
        for key in ("epsilons", "delta_record", "delta_attribute"):
            out[key] = list(out[key])
        return out

    def summary(self) -> str:
        """Plain-language multi-line description of the guarantee (for users and logs)."""
        zp = self.zero_prob
        lines = [
            f"ZIL noise with zero_prob = {zp!r} and scale = {self.scale:.6g} on {self.dim} numeric "
            f"field(s).",
            f"* Exact releases: each report is sent EXACTLY, with no noise at all, with probability "
            f"{zp!r} (about {100 * zp:.4g}% of reports). No guarantee below can have delta smaller "
            f"than {zp!r}.",
        ]
        if self.pure_epsilon is not None:
            lines.append(
                f"* One field (d = 1, exact): ({self.pure_epsilon:.6g}, {zp!r})-differentially private "
                f"(c = {self.c_record:.6g}, pure epsilon = sqrt(2)*c)."
            )
        how = "exact" if self.exact else "conservative bound valid for any number of fields"
        rec = ", ".join(f"({e:.6g}, {d:.6g})" for e, d in zip(self.epsilons, self.delta_record))
        att = ", ".join(f"({e:.6g}, {d:.6g})" for e, d in zip(self.epsilons, self.delta_attribute))
        lines.append(
            f"* Whole report (record level, c_I = {self.c_record:.6g}): (epsilon, delta)-DP for each "
            f"pair {rec} [{how}]."
        )
        lines.append(
            f"* One field at a time (attribute level, c_A = {self.c_attribute:.6g}): (epsilon, delta)-DP "
            f"for each pair {att} [{how}]."
        )
        lines.append(
            "* Meaning: an observer who sees a report and tries to tell two possible true values apart "
            "succeeds no better than these (epsilon, delta) pairs allow; delta includes the exact "
            "releases."
        )
        return "\n".join(lines)


def zil_guarantee(
    zero_prob: float, scale: float, dim: int, epsilons=DEFAULT_EPSILONS
) -> ZILGuarantee:
    """Compute the :class:`ZILGuarantee` of ZIL(zero_prob, scale²·I) on ``dim`` numeric fields.

    Parameters
    ----------
    zero_prob : float
        δ ∈ (0, 1).
    scale : float
        λ > 0, per unit of field range (the mechanism works on the standardized box).
    dim : int
        d ≥ 1.
    epsilons : sequence of float
        ε values (each ≥ 0, at least one) at which δ̃ is reported.

    Returns
    -------
    ZILGuarantee

    Raises
    ------
    ParameterError
        On zero_prob ∉ (0, 1), scale ≤ 0, dim < 1 or beyond the float range, an ε < 0 / empty
        ``epsilons``, or a scale so small that ``c_I = √d/scale`` exceeds the float range.

    Notes
    -----
    Source: paper Thm 3.1 (c_I, c_A), Thm 3.3 (δ̃); docs/privacy.md §2.1, §2.6.
    """
    zp = check_open_unit("zero_prob", zero_prob)
    lam = check_positive("scale", scale)
    d = _check_dim(dim)
    if d is None:
        raise ParameterError("dim must be an integer >= 1, got None")
    eps = _check_epsilon_array(epsilons).ravel()
    if eps.size == 0:
        raise ParameterError("epsilons must contain at least one value >= 0")
    try:
        root_d = math.sqrt(d)
    except OverflowError:
        raise ParameterError(
            f"dim must be at most {_FLOAT_MAX:.6g} (its square root is taken), got an integer of "
            f"{len(str(d))} digits"
        ) from None
    c_i = root_d / lam
    c_a = 1.0 / lam
    if not math.isfinite(c_i):
        raise ParameterError(
            f"scale={lam!r} is too small for dim={d}: the shift c_I = sqrt(dim)/scale exceeds the "
            f"float range ({_FLOAT_MAX:.6g})"
        )
    dim_arg = 1 if d == 1 else None
    rec = delta_for_epsilon(eps, c_i, zp, dim_arg)
    att = rec if d == 1 else delta_for_epsilon(eps, c_a, zp, None)
    return ZILGuarantee(
        zero_prob=zp,
        scale=lam,
        dim=d,
        c_record=c_i,
        c_attribute=c_a,
        exact=d == 1,
        epsilons=tuple(float(e) for e in eps),
        delta_record=tuple(float(x) for x in rec),
        delta_attribute=tuple(float(x) for x in att),
        pure_epsilon=_SQRT2 * c_i if d == 1 else None,
    )
