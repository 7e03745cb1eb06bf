"""The parameter planner (ingest/client/planner.py, docs/privacy.md §8): the parameters it recommends meet
the target for the unit, the budget adds up, and its predictions are those of
mechanisms.planning at the recommended parameters."""

from __future__ import annotations

import math

import pytest

from ingest.client.planner import plan_schema, planned_schema
from ingest.client.schema import TelemetrySchema
from mechanisms.errors import ParameterError
from mechanisms.planning import (
    predict_frequency_halfwidth,
    predict_mean_halfwidth,
    predict_quantile_halfwidth,
)
from mechanisms.privacy.composition import compose_pure, compose_zil

SCHEMA = """
name = "plan"
version = 1

[numeric]
zero_prob = 0.2
scale = 1.0

[[numeric.fields]]
name = "delay"
low = -60.0
high = 240.0

[[numeric.fields]]
name = "hour"
low = 0.0
high = 23.0

[[categorical]]
name = "carrier"
mechanism = "urap"
epsilon = 1.0
categories = ["a", "b", "c", "d"]
sensitive = ["d"]

[privacy]
unit = "device"
period = "1d"
reports_per_period = 3
"""


@pytest.fixture(scope="module")
def schema():
    return TelemetrySchema.loads(SCHEMA)


@pytest.fixture(scope="module")
def plan(schema):
    return plan_schema(schema, 6.0, 0.4, n=20_000, data_sd={"delay": 45.0})


def test_the_recommended_parameters_meet_the_target_per_unit(plan):
    assert plan["target"] == {"epsilon": 6.0, "delta": 0.4, "unit": "device", "reports": 3}
    num, split = plan["numeric"], plan["split"]
    assert split["groups"] == 2 and split["epsilon_each"] == pytest.approx(3.0)
    assert split["numeric_delta"] == pytest.approx(0.36)
    assert split["categorical_delta_each"] == pytest.approx(0.04)
    got = compose_zil(num["zero_prob"], num["scale"], diameter=math.sqrt(2), dim=2, reports=3,
                      epsilons=(3.0,))
    assert got.deltas[0] <= 0.36
    tighter = compose_zil(num["zero_prob"], num["scale"] * 0.99, diameter=math.sqrt(2), dim=2, reports=3,
                          epsilons=(3.0,))
    assert tighter.deltas[0] > 0.36  # the smallest scale, not just any
    assert num["exact_release_prob"] == pytest.approx(1 - (1 - num["zero_prob"]) ** 3)
    assert num["exact_release_prob"] < 0.36
    cat = plan["categorical"]["carrier"]
    assert compose_pure(cat["epsilon"], reports=3, epsilons=(3.0,)).deltas[0] <= 0.04
    assert cat["epsilon"] >= 1.0  # at least basic composition's ε/T
    # across the mechanisms the budget adds up to the target
    assert split["epsilon_each"] * split["groups"] == pytest.approx(6.0)
    assert split["numeric_delta"] + split["categorical_delta_each"] == pytest.approx(0.4)


def test_the_predictions_are_the_planning_functions_at_the_recommended_parameters(plan):
    num = plan["numeric"]
    z, lam = num["zero_prob"], num["scale"]
    delay, hour = num["fields"]["delay"], num["fields"]["hour"]
    assert delay["mean_halfwidth"] == pytest.approx(
        predict_mean_halfwidth(z, lam, -60, 240, 20_000, data_sd=45.0))
    assert delay["median_halfwidth"] == pytest.approx(
        predict_quantile_halfwidth(z, lam, -60, 240, 20_000, data_sd=45.0))
    assert hour["median_halfwidth"] == pytest.approx(predict_quantile_halfwidth(z, lam, 0, 23, 20_000))
    cat = plan["categorical"]["carrier"]
    assert cat["halfwidth_sensitive"] == pytest.approx(
        predict_frequency_halfwidth("urap", cat["epsilon"], 4, 1, 0.25, 20_000))
    assert cat["halfwidth_non_sensitive"] == pytest.approx(
        predict_frequency_halfwidth("urap", cat["epsilon"], 4, 1, 0.25, 20_000, sensitive=False))


def test_the_search_keeps_the_best_candidate_for_its_objective(schema, plan):
    rows = plan["numeric"]["candidates"]
    assert len(rows) == 6 and all(r["exact_release_prob"] < 0.36 for r in rows)
    best = min(rows, key=lambda r: r["score"])
    assert plan["numeric"]["zero_prob"] == best["zero_prob"]
    for r in rows:
        geometric = math.sqrt(r["mean_halfwidth_per_range"] * r["median_halfwidth_per_range"])
        assert r["score"] == pytest.approx(geometric)
    mean = plan_schema(schema, 6.0, 0.4, n=20_000, optimize="mean")["numeric"]
    median = plan_schema(schema, 6.0, 0.4, n=20_000, optimize="median")["numeric"]
    assert mean["zero_prob"] < median["zero_prob"]  # the mean wants few exact releases, the median many
    assert mean["fields"]["delay"]["mean_halfwidth"] < median["fields"]["delay"]["mean_halfwidth"]
    assert median["fields"]["delay"]["median_halfwidth"] < mean["fields"]["delay"]["median_halfwidth"]


def test_the_planned_schema_carries_the_parameters(schema, plan):
    out = planned_schema(schema, plan)
    assert out.numeric.zero_prob == plan["numeric"]["zero_prob"]
    assert out.numeric.scale == plan["numeric"]["scale"]
    assert out.categorical_field("carrier").epsilon == plan["categorical"]["carrier"]["epsilon"]
    assert TelemetrySchema.loads(out.dumps_toml()) == out
    assert out.privacy_unit == schema.privacy_unit


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"epsilon": 0.0}, "epsilon must be > 0"),
    ({"delta": 1.0}, r"delta must be in \(0, 1\)"),
    ({"zero_prob": 0.3}, r"numeric block .*delta must exceed 0.657"),
    ({"data_sd": {"carrier": 1.0}}, "not numeric fields of the schema: \\['carrier'\\]"),
    ({"optimize": "fast"}, "optimize must be one of"),
])
def test_bad_input_is_one_clear_error(schema, kwargs, match):
    args = {"epsilon": 6.0, "delta": 0.4, "n": 1000} | kwargs
    with pytest.raises(ParameterError, match=match):
        plan_schema(schema, args.pop("epsilon"), args.pop("delta"), **args)
