"""``/estimates`` entries of queries over memoized fields say that their intervals treat the
reports as independent (docs/devices.md §4)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from aggregator.queries import FrequencyQuery, MeanQuery
from aggregator.serve import estimate_payload, memoized_fields
from aggregator.state.registry import build_state
from ingest.client.privatizer import Privatizer
from ingest.client.schema import TelemetrySchema


def _schema(memo_a: bool, memo_c: bool) -> TelemetrySchema:
    return TelemetrySchema.from_dict({
        "name": "memo",
        "numeric": {"zero_prob": 0.2, "scale": 0.5, "fields": [
            {"name": "a", "low": 0.0, "high": 10.0, "memoize": memo_a},
            {"name": "b", "low": -5.0, "high": 5.0, "memoize": memo_a}]},
        "categorical": [{"name": "c", "categories": ["x", "y", "z"], "sensitive": ["x"],
                         "mechanism": "urr", "epsilon": 1.0, "memoize": memo_c}]})


@pytest.mark.parametrize(("memo_a", "memo_c"), [(True, False), (False, True), (False, False)])
def test_an_estimate_over_a_memoized_field_says_it_assumes_independent_reports(memo_a, memo_c):
    schema = _schema(memo_a, memo_c)
    rng = np.random.default_rng(5)
    n = 2000
    # the reports of the same mechanism without memoization (a device path is not needed here)
    batch = Privatizer(_schema(False, False), rng=rng).privatize_batch(
        {"a": rng.uniform(0, 10, n), "b": rng.uniform(-5, 5, n),
         "c": np.asarray(["x", "y", "z"], dtype=object)[rng.integers(0, 3, n)]})
    batch = dataclasses.replace(batch, fingerprint=schema.fingerprint)
    for query, memo in ((MeanQuery(name="m", field="a"), memo_a),
                        (FrequencyQuery(name="f", field="c"), memo_c)):
        st = build_state(query, schema)
        st.update(batch, None if not getattr(st, "needs_x2", False) else batch.numeric)
        out = estimate_payload(query.name, st)
        assert "error" not in out, out
        assert memoized_fields(st) == ((query.field,) if memo else ())
        if memo:
            ind = out["independence"]
            assert ind["assumed"] is True and ind["memoized_fields"] == [query.field]
            assert "sqrt(T) too narrow" in ind["note"] and query.field in ind["note"]
        else:
            assert "independence" not in out
