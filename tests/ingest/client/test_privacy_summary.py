"""The privacy statements of a schema for its unit (ingest/client/privacy_summary.py, docs/privacy.md §7)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ingest.client.schema import PrivacySetting, TelemetrySchema
from mechanisms.privacy.composition import compose_pure, compose_zil

ROOT = Path(__file__).resolve().parents[3]
FLIGHTS = (ROOT / "examples" / "flights.schema.toml").read_text()


def test_an_event_unit_states_per_report_guarantees_only():
    s = TelemetrySchema.loads(FLIGHTS).privacy_summary()
    assert s["unit"]["unit"] == "event" and s["unit"]["holds"] == "per_report"
    assert "composed" not in s["numeric"] and all("composed" not in c for c in s["categorical"].values())
    assert s["numeric"]["memoized"] is False and s["numeric"]["memo_buckets"] is None


@pytest.mark.parametrize("reports", [1, 5])
def test_a_device_unit_states_both_and_the_composed_one_holds(reports):
    schema = TelemetrySchema.loads(FLIGHTS)
    s = schema.privacy_summary(PrivacySetting(unit="device", period="7d", reports_per_period=reports))
    assert s["unit"] | {"statement": None} == {"unit": "device", "period": "7d", "period_s": 604_800,
                                               "reports_per_period": reports, "holds": "composed",
                                               "statement": None}
    comp, d = s["numeric"]["composed"], schema.dim
    rec = compose_zil(0.2, 1.0, diameter=math.sqrt(d), dim=d, reports=reports)
    att = compose_zil(0.2, 1.0, diameter=1.0, dim=d, reports=reports)
    assert [r["delta"] for r in comp["record"]] == list(rec.deltas)
    assert [r["delta"] for r in comp["attribute"]] == list(att.deltas)
    assert comp["exact_release_prob"] == pytest.approx(1 - 0.8 ** reports)
    dest = s["categorical"]["dest"]["composed"]
    assert [r["delta"] for r in dest["epsilon_delta"]] == list(compose_pure(2.0, reports=reports).deltas)
    # the per-report statements stay, and composing can only weaken them
    per = {r["epsilon"]: r["delta"] for r in s["numeric"]["epsilon_delta"]["record"]}
    for r in comp["record"]:
        if r["epsilon"] in per:
            assert r["delta"] >= per[r["epsilon"]] - 1e-9


def test_memoized_fields_are_stated():
    text = FLIGHTS.replace('unit = "min"\n', 'unit = "min"\nmemoize = true\n')
    text = text.replace('unit = "mi"\n', 'unit = "mi"\nmemoize = true\n')
    text = text.replace('unit = "h"\n', 'unit = "h"\nmemoize = true\n')
    text = text.replace('mechanism = "urr"\n', 'mechanism = "urr"\nmemoize = true\n')
    text += '\n[privacy]\nunit = "device"\nperiod = "1d"\nreports_per_period = 3\n'
    s = TelemetrySchema.loads(text).privacy_summary()
    assert s["numeric"]["memoized"] is True and s["numeric"]["memo_buckets"] == 32
    assert s["categorical"]["origin"]["memoized"] is True and s["categorical"]["carrier"]["memoized"] is False
    assert "memoized report resent in the same period is not a fresh one" in s["unit"]["statement"]
