"""TelemetrySchema: TOML round trip, fingerprint, validation messages, derived mechanisms."""

from __future__ import annotations

import copy
import json
import math
import pathlib

import numpy as np
import pytest

from ingest.client.schema import TelemetrySchema
from ingest.errors import SchemaError

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.schema.toml"))


def base_dict() -> dict:
    return {
        "name": "t",
        "version": 2,
        "numeric": {
            "zero_prob": 0.2,
            "scale": 0.5,
            "fields": [
                {"name": "a", "low": -1.0, "high": 1.0, "unit": "m"},
                {"name": "b", "low": 0.0, "high": 10.0},
            ],
        },
        "categorical": [
            {"name": "c", "categories": ["x", "y", "z"], "sensitive": ["x"], "mechanism": "urap",
             "epsilon": 1.0, "fallback": "z"},
            {"name": "e", "categories": ["p", "q"], "sensitive": ["q"], "mechanism": "urr", "epsilon": 2.0},
        ],
    }


def reverse_keys(x):
    if isinstance(x, dict):
        return {k: reverse_keys(x[k]) for k in reversed(list(x))}
    if isinstance(x, list):
        return [reverse_keys(v) for v in x]
    return x


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_schemas_round_trip(path, tmp_path):
    s = TelemetrySchema.load(path)
    assert TelemetrySchema.loads(s.dumps_toml()) == s
    assert TelemetrySchema.from_dict(s.to_dict()) == s
    j = tmp_path / "s.json"
    j.write_text(s.canonical_json())
    t = TelemetrySchema.load(j)
    assert t == s and t.fingerprint == s.fingerprint
    t2 = tmp_path / "s.toml"
    t2.write_text(s.dumps_toml())
    assert TelemetrySchema.load(t2).fingerprint == s.fingerprint


def test_flights_example_content():
    s = TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")
    assert s.numeric_names == ("arr_delay", "dep_delay", "distance", "air_time", "hour")
    assert len(s.categorical_field("carrier").categories) == 16
    assert len(s.categorical_field("dest").categories) == 105
    assert s.categorical_field("origin").mechanism == "urr"
    assert s.numeric.zero_prob == 0.2


def test_fingerprint_stable_across_key_order_and_formatting():
    d = base_dict()
    a = TelemetrySchema.from_dict(d)
    b = TelemetrySchema.from_dict(reverse_keys(d))
    assert len(a.fingerprint) == 16
    assert a.fingerprint == b.fingerprint
    # ints vs floats and explicit None defaults do not matter
    d2 = copy.deepcopy(d)
    d2["numeric"]["fields"][1]["high"] = 10
    d2["categorical"][1]["theta"] = None
    assert TelemetrySchema.from_dict(d2).fingerprint == a.fingerprint


MUTATIONS = [
    ("name", lambda d: d.update(name="u")),
    ("version", lambda d: d.update(version=3)),
    ("description", lambda d: d.update(description="x")),
    ("zero_prob", lambda d: d["numeric"].update(zero_prob=0.21)),
    ("scale", lambda d: d["numeric"].update(scale=0.5000001)),
    ("low", lambda d: d["numeric"]["fields"][0].update(low=-1.5)),
    ("high", lambda d: d["numeric"]["fields"][1].update(high=11.0)),
    ("unit", lambda d: d["numeric"]["fields"][0].update(unit="cm")),
    ("field name", lambda d: d["numeric"]["fields"][0].update(name="aa")),
    ("field order", lambda d: d["numeric"]["fields"].reverse()),
    ("categories", lambda d: d["categorical"][0].update(categories=["x", "y", "z", "w"])),
    ("category order", lambda d: d["categorical"][0].update(categories=["y", "x", "z"])),
    ("sensitive", lambda d: d["categorical"][0].update(sensitive=["x", "y"])),
    ("mechanism", lambda d: d["categorical"][0].update(mechanism="urr")),
    ("epsilon", lambda d: d["categorical"][1].update(epsilon=2.5)),
    ("theta", lambda d: d["categorical"][0].update(theta=0.6)),
    ("fallback", lambda d: d["categorical"][0].update(fallback="y")),
    ("personalized", lambda d: d["categorical"][0].update(personalized={"bots": 1})),
    ("personalized bots", lambda d: d["categorical"][0].update(personalized={"bots": 2})),
    ("categorical order", lambda d: d["categorical"].reverse()),
]


def test_fingerprint_changes_with_any_parameter():
    seen = {TelemetrySchema.from_dict(base_dict()).fingerprint: "base"}
    for label, mutate in MUTATIONS:
        d = base_dict()
        mutate(d)
        fp = TelemetrySchema.from_dict(d).fingerprint
        assert fp not in seen, f"{label} collides with {seen.get(fp)}"
        seen[fp] = label


INVALID = [
    (lambda d: d["numeric"]["fields"][1].update(low=10.0), ["'b'", "low must be < high"]),
    (lambda d: d["numeric"]["fields"][1].update(low=11.0), ["'b'", "low"]),
    (lambda d: d["numeric"]["fields"][0].update(high=float("inf")), ["'a'", "finite"]),
    (lambda d: d["categorical"][0].update(sensitive=["nope"]), ["'c'", "not in categories"]),
    (lambda d: d["categorical"][1].update(name="a"), ["duplicate", "'a'"]),
    (lambda d: d["numeric"]["fields"][1].update(name="a"), ["duplicate", "'a'"]),
    (lambda d: d["categorical"][0].update(categories=["x", "x", "z"]), ["'c'", "duplicate"]),
    (lambda d: d["numeric"].update(scale=None, epsilon=1.0, delta=0.2), ["delta", "zero_prob"]),
    (lambda d: d["numeric"].update(scale=None, epsilon=1.0, delta=0.1), ["delta", "zero_prob"]),
    (lambda d: d["numeric"].update(epsilon=1.0, delta=0.3), ["scale", "epsilon"]),
    (lambda d: d["numeric"].update(scale=None), ["scale", "epsilon"]),
    (lambda d: d["numeric"].update(scale=None, epsilon=1.0), ["epsilon and delta"]),
    (lambda d: d["numeric"].update(scale=-1.0), ["scale", "> 0"]),
    (lambda d: d["numeric"].update(zero_prob=1.2), ["zero_prob", "(0, 1)"]),
    (lambda d: d["numeric"].update(zero_prob=0.0), ["zero_prob", "(0, 1)"]),
    (lambda d: d["numeric"].update(fields=[]), ["numeric.fields"]),
    (lambda d: d["categorical"][0].update(mechanism="laplace"), ["'c'", "mechanism", "laplace"]),
    (lambda d: d["categorical"][0].update(categories=[]), ["'c'", "categories"]),
    (lambda d: d["categorical"][0].update(categories=["x"]), ["'c'", "categories"]),
    (lambda d: d["categorical"][1].update(sensitive=[]), ["'e'", "sensitive"]),
    (lambda d: d["categorical"][1].update(epsilon=0.0), ["'e'", "epsilon"]),
    (lambda d: d["categorical"][1].update(theta=0.5), ["'e'", "theta"]),
    (lambda d: d["categorical"][0].update(theta=1.0), ["'c'", "theta"]),
    (lambda d: d["categorical"][0].update(fallback="w"), ["'c'", "fallback"]),
    (lambda d: d["categorical"][0].update(personalized={"bots": 0}), ["'c'", "bots"]),
    (lambda d: d["categorical"][0].update(colour="red"), ["'c'", "colour"]),
    (lambda d: d["categorical"][0].update(epsilon="big"), ["'c'", "epsilon"]),
    (lambda d: d["numeric"]["fields"][0].pop("low"), ["'a'", "low"]),
    (lambda d: d.update(version=0), ["version"]),
    (lambda d: (d.pop("numeric"), d.update(categorical=[])), ["no field"]),
]


@pytest.mark.parametrize(("mutate", "needles"), INVALID)
def test_invalid_schemas_name_the_field(mutate, needles):
    d = base_dict()
    mutate(d)
    with pytest.raises(SchemaError) as info:
        TelemetrySchema.from_dict(d)
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, (needle, msg)
    assert isinstance(info.value, ValueError)
    # the field is named once, not "categorical field 'c': categorical field 'c': …"
    for kind in ("categorical field", "numeric field"):
        assert msg.count(kind) <= 1, msg


def test_bad_toml_and_missing_file(tmp_path):
    with pytest.raises(SchemaError, match="TOML"):
        TelemetrySchema.loads("name = ")
    with pytest.raises(SchemaError, match="cannot read"):
        TelemetrySchema.load(tmp_path / "nope.toml")
    with pytest.raises(SchemaError, match="mapping"):
        TelemetrySchema.from_dict([1, 2])


def test_numeric_group_optional_and_categorical_only_schema():
    d = base_dict()
    d.pop("numeric")
    s = TelemetrySchema.from_dict(d)
    assert s.dim == 0 and s.numeric_names == () and s.zil_mechanism() is None
    assert s.privacy_summary()["numeric"] is None
    assert TelemetrySchema.loads(s.dumps_toml()) == s


def test_calibrated_scale_meets_target():
    from mechanisms.privacy import delta_for_epsilon

    d = base_dict()
    d["numeric"].update(scale=None, epsilon=2.0, delta=0.3)
    s = TelemetrySchema.from_dict(d)
    lam = s.resolved_scale
    assert lam > 0
    # independent check: the record-level guarantee at c = sqrt(d)/λ gives δ̃(ε) = δ′
    got = float(delta_for_epsilon(2.0, math.sqrt(2) / lam, 0.2))
    assert got == pytest.approx(0.3, abs=1e-6)
    assert s.zil_mechanism().scale == pytest.approx(lam)
    summ = s.privacy_summary()["numeric"]
    assert summ["scale_source"] == "calibrated" and summ["target"] == {"epsilon": 2.0, "delta": 0.3}


def test_mechanisms_and_codes():
    s = TelemetrySchema.from_dict(base_dict())
    z = s.zil_mechanism()
    np.testing.assert_array_equal(z.low, [-1.0, 0.0])
    np.testing.assert_array_equal(z.high, [1.0, 10.0])
    assert z.zero_prob == 0.2 and z.scale == 0.5
    m = s.categorical_mechanism("c")
    assert type(m).__name__ == "URAP" and m.k == 3 and list(m.sensitive) == [0]
    u = s.categorical_mechanism("e")
    assert type(u).__name__ == "URR" and u.k == 2 and list(u.sensitive) == [1]
    assert s.category_code("c", "y") == 1
    assert s.category_code("c", "unknown") == 2  # fallback "z"
    with pytest.raises(SchemaError, match=r"'e'.*unknown category"):
        s.category_code("e", "r")
    with pytest.raises(SchemaError, match="no field 'zz'"):
        s.category_code("zz", "x")
    with pytest.raises(SchemaError, match="numeric"):
        s.categorical_mechanism("a")


def test_personalized_field_extends_domain():
    d = base_dict()
    d["categorical"][0]["personalized"] = {"bots": 2}
    s = TelemetrySchema.from_dict(d)
    f = s.categorical_field("c")
    assert f.k == 5 and f.sensitive_codes == (0, 3, 4)
    m = s.categorical_mechanism("c")
    assert m.k == 5 and list(m.sensitive) == [0, 3, 4]


def test_privacy_summary_contents():
    s = TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")
    summ = s.privacy_summary()
    json.dumps(summ)  # plain data
    num = summ["numeric"]
    assert num["c_record"] == pytest.approx(math.sqrt(5) / 1.0)
    assert num["c_attribute"] == pytest.approx(1.0)
    assert "exact" in num["zero_prob_statement"]
    for level in ("record", "attribute"):
        pairs = num["epsilon_delta"][level]
        assert pairs and all(p["delta"] >= 0.2 for p in pairs)
    # attribute level is a weaker adversary than record level
    assert num["epsilon_delta"]["attribute"][0]["delta"] <= num["epsilon_delta"]["record"][0]["delta"]
    car = summ["categorical"]["carrier"]
    assert car["mechanism"] == "urap" and car["sensitive_size"] == 5 and car["epsilon"] == 1.0
    # uRAP default theta: 1 - d2 = 1 - e^{-eps/2}
    assert car["reveal_prob_non_sensitive"] == pytest.approx(1 - math.exp(-0.5))
    org = summ["categorical"]["origin"]
    e = math.exp(1.0)
    assert org["reveal_prob_non_sensitive"] == pytest.approx(1 - 1 / (1 + e - 1))
    assert repr(s).startswith("TelemetrySchema(")


# ------------------------------------------------------------------ [event_time]
V1_SCHEMA = {"name": "v1", "numeric": {"zero_prob": 0.1, "scale": 1.0,
                                       "fields": [{"name": "x", "low": 0.0, "high": 1.0}]},
             "categorical": [{"name": "c", "categories": ["a", "b", "c"], "sensitive": ["a"],
                              "mechanism": "urr", "epsilon": 1.0},
                             {"name": "u", "categories": ["a", "b", "c", "d"], "sensitive": ["a"],
                              "mechanism": "urap", "epsilon": 1.0}]}
#: fingerprints computed before schemas could have [event_time]: a schema without it keeps them
V1_FINGERPRINT = "c31355b1e9a8a5e3d86309c5a931134b"
FLIGHTS_FINGERPRINT = "6848845b7f84f764f81fa9419db3f126"

TOML_WITH_TIME = """
name = "timed"

[numeric]
zero_prob = 0.2
scale = 1.0

[[numeric.fields]]
name = "arr_delay"
low = -60.0
high = 240.0

[event_time]
field = "time_hour"
resolution = "1h"
"""


def test_fingerprint_without_event_time_is_unchanged():
    s = TelemetrySchema.from_dict(V1_SCHEMA)
    assert s.event_time is None and s.time_resolution_s is None
    assert "event_time" not in s.to_dict() and "event_time" not in s.canonical_json()
    assert s.fingerprint.hex() == V1_FINGERPRINT


def test_example_flights_fingerprint_is_unchanged():
    d = TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml").to_dict()
    d.pop("event_time", None)  # the example without its time column: the fingerprint it always had
    assert TelemetrySchema.from_dict(d).fingerprint.hex() == FLIGHTS_FINGERPRINT


def test_event_time_table_round_trip_and_fingerprint():
    s = TelemetrySchema.loads(TOML_WITH_TIME)
    assert s.event_time.field == "time_hour" and s.event_time.resolution == "1h"
    assert s.event_time.resolution_s == 3600 and s.time_resolution_s == 3600
    assert s.to_dict()["event_time"] == {"field": "time_hour", "resolution": "1h"}
    assert TelemetrySchema.loads(s.dumps_toml()) == s
    assert "[event_time]" in s.dumps_toml()
    assert TelemetrySchema.from_dict(json.loads(s.canonical_json())).fingerprint == s.fingerprint
    plain = TelemetrySchema.loads(TOML_WITH_TIME.split("[event_time]")[0])
    other = TelemetrySchema.loads(TOML_WITH_TIME.replace('"1h"', '"30m"'))
    moved = TelemetrySchema.loads(TOML_WITH_TIME.replace('"time_hour"', '"ts"'))
    assert len({s.fingerprint, plain.fingerprint, other.fingerprint, moved.fingerprint}) == 4
    with_categorical = base_dict() | {"event_time": {"field": "t0", "resolution": "15m"}}
    t = TelemetrySchema.from_dict(with_categorical)
    assert TelemetrySchema.loads(t.dumps_toml()) == t and t.time_resolution_s == 900


@pytest.mark.parametrize("res", ["1s", "30s", "15m", "1h", "6h", "1d", "7d", "1w"])
def test_event_time_resolutions(res):
    s = TelemetrySchema.loads(TOML_WITH_TIME.replace('"1h"', f'"{res}"'))
    assert 1 <= s.time_resolution_s <= 7 * 86400


@pytest.mark.parametrize("res", ['"1 day"', '"0s"', '"8d"', '"2w"', '"1y"', '""'])
def test_bad_event_time_resolution_is_named(res):
    with pytest.raises(SchemaError, match=r"^invalid schema: event_time\.resolution must be a duration "
                                          r"from \"1s\" to \"7d\" like .*, got '") as info:
        TelemetrySchema.loads(TOML_WITH_TIME.replace('"1h"', res))
    assert "\n" not in str(info.value)
    with pytest.raises(SchemaError, match=r"event_time\.resolution: Input should be a valid string"):
        TelemetrySchema.loads(TOML_WITH_TIME.replace('"1h"', "3600"))


def test_event_time_field_checks():
    with pytest.raises(SchemaError, match=r"event_time\.field 'arr_delay' is also a numeric or categorical"):
        TelemetrySchema.loads(TOML_WITH_TIME.replace('"time_hour"', '"arr_delay"'))
    with pytest.raises(SchemaError, match=r"event_time\.field 'c' is also"):
        TelemetrySchema.from_dict(base_dict() | {"event_time": {"field": "c", "resolution": "1h"}})
    with pytest.raises(SchemaError, match=r"event_time\.field: Field required"):
        TelemetrySchema.loads(TOML_WITH_TIME.replace('field = "time_hour"', ""))
    with pytest.raises(SchemaError, match=r"event_time\.field: String should have at least 1 character"):
        TelemetrySchema.loads(TOML_WITH_TIME.replace('"time_hour"', '""'))
    with pytest.raises(SchemaError, match=r"event_time\.zone: Extra inputs are not permitted"):
        TelemetrySchema.loads(TOML_WITH_TIME + 'zone = "UTC"\n')


def test_privacy_summary_says_the_event_time_travels_in_clear():
    timed = TelemetrySchema.loads(TOML_WITH_TIME).privacy_summary()["event_time"]
    assert timed["field"] == "time_hour" and timed["resolution_s"] == 3600
    assert "rounded down to 1h" in timed["statement"] and "in clear" in timed["statement"]
    assert "not protected" in timed["statement"]
    day = TelemetrySchema.loads(TOML_WITH_TIME.replace('"1h"', '"24h"')).privacy_summary()["event_time"]
    assert "rounded down to 1d" in day["statement"] and day["resolution_s"] == 86400
    plain = TelemetrySchema.from_dict(V1_SCHEMA).privacy_summary()
    json.dumps(plain)
    assert plain["event_time"]["field"] is None and plain["event_time"]["resolution_s"] is None
    assert "Kafka record timestamp" in plain["event_time"]["statement"]
    assert "in clear" in plain["event_time"]["statement"]
