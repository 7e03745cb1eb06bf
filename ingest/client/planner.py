"""Parameter planner: a schema's privacy parameters for a target (ε, δ) per privacy unit, with the
interval half-widths they will give (docs/privacy.md §8).

Given a schema (its fields, bounds and mechanisms; its ``[privacy]`` unit fixes how many reports T
one statement composes), a target (ε, δ) for that unit and an expected number n of reports per
window, :func:`plan_schema` recommends the numeric block's ``zero_prob`` and ``scale`` and each
categorical field's ε, and predicts the 95 % half-width of a mean, a median and a category's
frequency (:mod:`mechanisms.planning`).

The budget is split across the mechanisms and added up (basic composition across mechanisms):
with a numeric block and m categorical fields, each of the 1 + m gets ε/(1 + m); the numeric
block gets 0.9·δ and the categorical fields 0.1·δ/m each (all of δ when only one kind exists).
Within each, the T reports are composed with the PLD accountant
(:mod:`mechanisms.privacy.composition`). For the numeric block several ``zero_prob`` values
below the exact-release floor are tried, each calibrated to its smallest scale, and the one with
the narrowest predicted intervals is kept (``optimize``: a mean alone would want ``zero_prob`` → 0,
the DR estimators of quantiles and regressions want many exact releases).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ingest.client.schema import TelemetrySchema
from mechanisms.errors import ParameterError

__all__ = ["OPTIMIZE", "ZERO_PROB_FRACTIONS", "plan_schema", "planned_schema"]

#: ``zero_prob`` candidates, as fractions of the largest one the exact-release floor allows.
ZERO_PROB_FRACTIONS = (0.9, 0.6, 0.35, 0.2, 0.1, 0.04)
#: What the ``zero_prob`` search minimises (half-widths relative to the field's range, averaged over
#: the numeric fields): the median's, the mean's, or their geometric mean.
OPTIMIZE = ("balanced", "median", "mean")
#: Never more than this fraction of reports in the clear.
MAX_ZERO_PROB = 0.5
_DELTA_NUMERIC_SHARE = 0.9


def _split(schema: TelemetrySchema, epsilon: float, delta: float) -> dict[str, Any]:
    m = len(schema.categorical)
    groups = (1 if schema.numeric is not None else 0) + m
    num_delta = delta * (_DELTA_NUMERIC_SHARE if m else 1.0) if schema.numeric is not None else 0.0
    cat_delta = (delta - num_delta) / m if m else 0.0
    return {"groups": groups, "epsilon_each": epsilon / groups, "numeric_delta": num_delta,
            "categorical_delta_each": cat_delta}


def _data_for(name: str, data_sd: Mapping[str, float] | None) -> dict[str, Any]:
    sd = (data_sd or {}).get(name)
    return {} if sd is None else {"data_sd": float(sd)}


def _score(fields: dict[str, dict[str, Any]], optimize: str) -> float:
    def rel(key: str) -> float:
        return sum(v[key] / (v["high"] - v["low"]) for v in fields.values()) / len(fields)

    if optimize == "balanced":
        return math.sqrt(rel("mean_halfwidth") * rel("median_halfwidth"))
    return rel(f"{optimize}_halfwidth")


def _fields_at(schema: TelemetrySchema, z: float, scale: float, n: int, data_sd, level: float):
    from mechanisms.planning import predict_mean_halfwidth, predict_quantile_halfwidth

    fields = {}
    for f in schema.numeric.fields:
        extra = _data_for(f.name, data_sd)
        fields[f.name] = {
            "low": f.low, "high": f.high, "unit": f.unit,
            "mean_halfwidth": predict_mean_halfwidth(z, scale, f.low, f.high, n, level=level, **extra),
            "median_halfwidth": predict_quantile_halfwidth(z, scale, f.low, f.high, n, level=level, **extra),
        }
    return fields


def _numeric_plan(schema: TelemetrySchema, epsilon: float, delta: float, reports: int, n: int,
                  zero_prob: float | None, data_sd, level: float, optimize: str) -> dict[str, Any]:
    from mechanisms.privacy.composition import calibrate_composed, exact_release_prob

    d = schema.dim
    z_max = -math.expm1(math.log1p(-delta) / reports)  # 1 − (1 − δ)^{1/T}: the floor equals δ
    if zero_prob is not None:
        candidates = [zero_prob]
    else:
        candidates = sorted({min(MAX_ZERO_PROB, f * z_max) for f in ZERO_PROB_FRACTIONS}, reverse=True)
    rows = []
    for z in candidates:  # the search calibrates on the coarse loss grid, the winner on the fine one
        try:
            scale = calibrate_composed(epsilon, delta, z, diameter=math.sqrt(d), dim=d, reports=reports,
                                       refine=False)
        except ParameterError as exc:
            raise ParameterError(f"numeric block (its share of the target: epsilon {epsilon:.6g}, delta "
                                 f"{delta:.6g}): {exc}") from None
        fields = _fields_at(schema, z, scale, n, data_sd, level)
        rows.append({"zero_prob": z, "scale": scale, "exact_release_prob": exact_release_prob(z, reports),
                     "mean_halfwidth_per_range": _score(fields, "mean"),
                     "median_halfwidth_per_range": _score(fields, "median"),
                     "score": _score(fields, optimize)})
    best = min(rows, key=lambda r: r["score"])
    z = best["zero_prob"]
    scale = calibrate_composed(epsilon, delta, z, diameter=math.sqrt(d), dim=d, reports=reports)
    return {"dim": d, "epsilon": epsilon, "delta": delta, "optimize": optimize,
            "accounting": "exact_laplace" if d == 1 else "beta_c_bound",
            "zero_prob": z, "scale": scale, "exact_release_prob": best["exact_release_prob"],
            "fields": _fields_at(schema, z, scale, n, data_sd, level), "candidates": rows}


def _categorical_plan(schema: TelemetrySchema, epsilon: float, delta: float, reports: int, n: int,
                      level: float) -> dict[str, Any]:
    from mechanisms.planning import predict_frequency_halfwidth
    from mechanisms.privacy.composition import calibrate_composed_epsilon

    e1 = calibrate_composed_epsilon(epsilon, delta, reports=reports) if reports > 1 else epsilon
    out = {}
    for c in schema.categorical:
        k, s = c.k, len(c.sensitive_codes)
        p = 1.0 / k
        row = {"mechanism": c.mechanism, "epsilon": e1, "unit_epsilon": epsilon, "unit_delta": delta,
               "k": k, "sensitive_size": s, "p": p,
               "halfwidth_sensitive": predict_frequency_halfwidth(c.mechanism, e1, k, s, p, n, level=level),
               "halfwidth_non_sensitive": None}
        if s < k:
            row["halfwidth_non_sensitive"] = predict_frequency_halfwidth(c.mechanism, e1, k, s, p, n,
                                                                         sensitive=False, level=level)
        out[c.name] = row
    return out


def plan_schema(schema: TelemetrySchema, epsilon: float, delta: float, *, n: int,
                reports: int | None = None, zero_prob: float | None = None,
                data_sd: Mapping[str, float] | None = None, level: float = 0.95,
                optimize: str = "balanced") -> dict[str, Any]:
    """Recommend a schema's privacy parameters for a target (ε, δ) per unit and predict its intervals.

    Parameters
    ----------
    schema : TelemetrySchema
        Fields, bounds and mechanisms; its current ``zero_prob``/``scale``/ε are ignored.
    epsilon, delta : float
        The target for one privacy unit: ε > 0, δ in (0, 1).
    n : int
        Expected number of reports per window (≥ 2): the predictions are for one window.
    reports : int, optional
        Reports composed per unit; default the schema's ``[privacy] reports_per_period`` (1 for
        ``unit = "event"``).
    zero_prob : float, optional
        Fix the numeric block's ``zero_prob`` instead of searching ``ZERO_PROB_FRACTIONS`` of the
        largest the exact-release floor allows.
    data_sd : mapping field → float, optional
        A typical standard deviation of a numeric field's raw values (original units): the
        prediction then assumes a normal distribution clipped into the box; otherwise uniform on
        the box.
    level : float
        Confidence level of the predicted intervals, in (0, 1).
    optimize : {"balanced", "median", "mean"}
        What the ``zero_prob`` search minimises (``OPTIMIZE``): a mean prefers few exact releases
        and little noise, the DR median many exact releases even at a larger scale; ``balanced``
        (default) minimises the geometric mean of the two relative half-widths.

    Returns
    -------
    dict
        ``{"target": {"epsilon", "delta", "unit", "reports"}, "n", "level", "split": {...},
        "numeric": {"zero_prob", "scale", "dim", "accounting", "exact_release_prob", "fields":
        {name: {"low", "high", "unit", "mean_halfwidth", "median_halfwidth"}}, "candidates": [...]}
        | None, "categorical": {name: {"mechanism", "epsilon", "k", "sensitive_size", "p",
        "halfwidth_sensitive", "halfwidth_non_sensitive"}}, "assumption"}``; half-widths in the
        field's units (numeric) or as probabilities (frequencies, for a category of frequency 1/k).

    Raises
    ------
    ParameterError
        A target out of reach (e.g. δ at or below the exact-release floor for the given
        ``zero_prob``), ``data_sd`` naming a field that is not numeric, or an argument out of
        range.

    Notes
    -----
    The budget split and the search are in the module docstring; docs/privacy.md §8.
    """
    if not isinstance(schema, TelemetrySchema):
        raise ParameterError(f"schema must be a TelemetrySchema, got {type(schema).__name__}")
    for name, v in (("epsilon", epsilon), ("delta", delta)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ParameterError(f"{name} must be a finite number, got {v!r}")
    if not epsilon > 0:
        raise ParameterError(f"epsilon must be > 0, got {epsilon!r}")
    if not 0 < delta < 1:
        raise ParameterError(f"delta must be in (0, 1), got {delta!r}")
    if optimize not in OPTIMIZE:
        raise ParameterError(f"optimize must be one of {OPTIMIZE}, got {optimize!r}")
    unknown = sorted(set(data_sd or {}) - set(schema.numeric_names))
    if unknown:
        raise ParameterError(f"data_sd names fields that are not numeric fields of the schema: {unknown}")
    unit = schema.privacy_unit
    t = unit.reports if reports is None else reports
    split = _split(schema, float(epsilon), float(delta))
    numeric = None
    if schema.numeric is not None:
        numeric = _numeric_plan(schema, split["epsilon_each"], split["numeric_delta"], t, n, zero_prob,
                                data_sd, level, optimize)
    categorical = {}
    if schema.categorical:
        categorical = _categorical_plan(schema, split["epsilon_each"], split["categorical_delta_each"], t,
                                        n, level)
    assumption = ("numeric values uniform on their box" if not data_sd else
                  "numeric values normal with the given sd (clipped into the box) where given, else uniform")
    return {"target": {"epsilon": float(epsilon), "delta": float(delta), "unit": unit.unit, "reports": t},
            "n": n, "level": level, "split": split, "numeric": numeric, "categorical": categorical,
            "assumption": assumption + "; each category at frequency 1/k"}


def planned_schema(schema: TelemetrySchema, plan: Mapping[str, Any]) -> TelemetrySchema:
    """``schema`` with the plan's ``zero_prob``, ``scale`` and categorical ε in place.

    A declared ``epsilon``/``delta`` target of the numeric block is replaced by the planned
    ``scale``. Raises ``SchemaError`` if the result is not a valid schema.
    """
    data = schema.to_dict()
    if plan.get("numeric") is not None:
        num = {k: v for k, v in data["numeric"].items() if k not in ("epsilon", "delta")}
        num["zero_prob"] = float(plan["numeric"]["zero_prob"])
        num["scale"] = float(plan["numeric"]["scale"])
        data["numeric"] = num
    for c in data.get("categorical", []):
        if c["name"] in plan.get("categorical", {}):
            c["epsilon"] = float(plan["categorical"][c["name"]]["epsilon"])
            c.pop("theta", None)  # uRAP's default θ follows ε
    return TelemetrySchema.from_dict(data)
