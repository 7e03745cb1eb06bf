"""The privacy statements of a schema: per report and composed over the privacy unit
(docs/privacy.md §1, §2, §7; docs/frequency.md §1).
:meth:`ingest.client.schema.TelemetrySchema.privacy_summary` is the entry point."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ingest.client.event_time import format_duration
from ingest.client.schema_fields import CategoricalField, EventTimeSetting, PrivacySetting

if TYPE_CHECKING:
    from ingest.client.schema import TelemetrySchema

__all__ = ["summarize"]


def summarize(schema: TelemetrySchema, unit: PrivacySetting) -> dict[str, Any]:
    """The dict of :meth:`TelemetrySchema.privacy_summary` for ``unit``."""
    out: dict[str, Any] = {
        "schema": schema.name,
        "version": schema.version,
        "fingerprint": schema.fingerprint.hex(),
        "unit": _unit_summary(unit),
        "numeric": None,
        "categorical": {},
        "event_time": _event_time_summary(schema.event_time),
    }
    if schema.numeric is not None:
        out["numeric"] = _numeric_summary(schema)
        first = schema.numeric.fields[0]
        out["numeric"]["memoized"] = bool(first.memoize)
        out["numeric"]["memo_buckets"] = first.memo_buckets if first.memoize else None
        if unit.unit == "device":
            out["numeric"]["composed"] = _numeric_composed(schema, unit.reports)
    for c in schema.categorical:
        out["categorical"][c.name] = _categorical_summary(c) | {"memoized": bool(c.memoize)}
        if unit.unit == "device":
            from mechanisms.privacy.composition import compose_pure

            out["categorical"][c.name]["composed"] = compose_pure(c.epsilon, reports=unit.reports).to_dict()
    return out


def _unit_summary(unit: PrivacySetting) -> dict[str, Any]:
    if unit.unit == "event":
        return {"unit": "event", "period": None, "period_s": None, "reports_per_period": None,
                "holds": "per_report",
                "statement": "the unit is one event: each guarantee below protects one report. A "
                             "device that sends several reports is protected by their composition, "
                             "which is weaker (ldp-stream privacy compose)"}
    t, period = unit.reports, unit.period
    return {"unit": "device", "period": period, "period_s": unit.period_s, "reports_per_period": t,
            "holds": "composed",
            "statement": f"the unit is one device over one period of {period} (UTC) with at most {t} "
                         f"fresh report(s) (a memoized report resent in the same period is not a "
                         f"fresh one; docs/devices.md): the composed guarantees protect it; the "
                         f"per-report guarantees protect only a single report"}


def _numeric_composed(schema: TelemetrySchema, reports: int) -> dict[str, Any]:
    from mechanisms.privacy.composition import compose_zil, exact_release_prob

    z, lam, d = schema.numeric.zero_prob, schema.resolved_scale, schema.dim
    record = compose_zil(z, lam, diameter=math.sqrt(d), dim=d, reports=reports)
    attribute = compose_zil(z, lam, diameter=1.0, dim=d, reports=reports)
    p = exact_release_prob(z, reports)
    return {
        "reports": reports,
        "exact_release_prob": p,
        "exact_release_statement": f"with {reports} report(s) per period, at least one carries the "
                                   f"exact values with probability {p:.4g}: no composed delta is below it",
        "accounting": record.accounting,
        "record": record.to_dict()["epsilon_delta"],
        "attribute": attribute.to_dict()["epsilon_delta"],
    }


def _numeric_summary(schema: TelemetrySchema) -> dict[str, Any]:
    num = schema.numeric
    lam = schema.resolved_scale
    d = schema.dim
    c_i, c_a = math.sqrt(d) / lam, 1.0 / lam
    summ: dict[str, Any] = {
        "mechanism": "zil",
        "fields": list(schema.numeric_names),
        "dim": d,
        "zero_prob": num.zero_prob,
        "zero_prob_statement": (
            f"with probability {num.zero_prob} a report carries the exact (clipped) values of all "
            f"{d} numeric field(s); otherwise one joint SL noise draw is added"
        ),
        "scale": lam,
        "scale_source": "declared" if num.scale is not None else "calibrated",
        "target": None if num.scale is not None else {"epsilon": num.epsilon, "delta": num.delta},
        "c_record": c_i,
        "c_attribute": c_a,
        "noise_std": {f.name: lam * (f.high - f.low) for f in num.fields},
        "bounds": {f.name: [f.low, f.high] for f in num.fields},
        "epsilon_delta": None,
    }
    from mechanisms.privacy import zil_guarantee

    g = zil_guarantee(num.zero_prob, lam, d)
    summ["epsilon_delta"] = {
        "record": [{"epsilon": e, "delta": dt} for e, dt in zip(g.epsilons, g.delta_record)],
        "attribute": [{"epsilon": e, "delta": dt} for e, dt in zip(g.epsilons, g.delta_attribute)],
        "exact": g.exact,
        "pure_epsilon": g.pure_epsilon,
    }
    summ["statement"] = g.summary()
    return summ


def _event_time_summary(et: EventTimeSetting | None) -> dict[str, Any]:
    if et is None:
        return {"field": None, "resolution_s": None,
                "statement": "the Kafka record timestamp, set by the producer, is the event time of "
                             "every report of a record: it travels in clear with the record, as "
                             "metadata not protected by the mechanisms"}
    res = format_duration(et.resolution_s)
    return {"field": et.field, "resolution_s": et.resolution_s,
            "statement": f"the event time (column {et.field!r}), rounded down to {res}, travels in "
                         "clear with every report: it is metadata, not protected by the mechanisms"}


def _categorical_summary(c: CategoricalField) -> dict[str, Any]:
    s = len(c.sensitive_codes)
    k = c.k
    e = math.exp(c.epsilon)
    out: dict[str, Any] = {
        "mechanism": c.mechanism,
        "epsilon": c.epsilon,
        "k": k,
        "sensitive_size": s,
        "sensitive": list(c.sensitive),
        "personalized_bots": c.personalized.bots if c.personalized else 0,
        "guarantee": f"({c.epsilon}, sensitive set of {s})-ULDP: sensitive values are protected "
                     f"with epsilon = {c.epsilon}",
    }
    if c.mechanism == "urr":
        c3 = 1.0 - s / (s + e - 1.0)
        out["reveal_prob_non_sensitive"] = c3
        out["non_sensitive_reveal"] = (
            f"a non-sensitive value is reported as itself with probability c3 = {c3:.4g} and then "
            "revealed exactly (uRR never outputs a non-sensitive value for a sensitive input)"
        )
    else:
        theta = c.resolved_theta
        d2 = ((1 - theta) * e + theta) / e
        out["theta"] = theta
        out["reveal_prob_non_sensitive"] = 1.0 - d2
        out["non_sensitive_reveal"] = (
            f"a non-sensitive value sets its own bit with probability 1 - d2 = {1 - d2:.4g}, which "
            "reveals it exactly; reports with no non-sensitive bit are protected"
        )
    if c.personalized:
        out["personalized_note"] = (
            "each user's personally sensitive values are mapped to a bot symbol before the mechanism "
            "and get the same protection as the common sensitive set"
        )
    return out
