"""``analyze`` of a thresholded logistic query is the exact batch DR fit (docs/mechanisms.md §4)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from aggregator.analyze import Replay, analyze_query
from aggregator.queries import parse_query
from mechanisms.estimation import m_estimate
from mechanisms.losses import LogisticLoss
from tests.aggregator._state_support import make_batch, make_schema

pytestmark = pytest.mark.slow


def test_thresholded_logistic_is_the_batch_dr_fit_and_near_truth():
    schema = make_schema()
    zil = schema.zil_mechanism()
    batch, x2, _ = make_batch(schema, 40_000, np.random.default_rng(91))
    runtime = types.SimpleNamespace(schema=schema)
    q = parse_query({"kind": "logistic_regression", "name": "lg", "covariates": ["a"], "label": "b",
                     "threshold": -1.5})
    res = analyze_query(Replay(batch, x2, records=40), runtime, q)
    assert res["estimator"] == "dr" and res["params"] == ["intercept", "a"] and res["n"] == 40_000
    # the same fit computed directly
    loss = LogisticLoss(noised=(0, 1), covariates=(0,), label=lambda u: (u[:, 1] > -1.5).astype(float))
    ref = m_estimate(loss, batch.numeric[:, :2], x2[:, :2], zero_prob=zil.zero_prob,
                     scale=zil.coord_scale[:2], method="dr")
    np.testing.assert_allclose(res["value"], ref.theta, rtol=1e-6)
    # P(b > -1.5 | a) = sigmoid(-2.5 + 0.5 a) in the generator: within 4 standard errors
    truth = np.array([-2.5, 0.5])
    assert np.all(np.abs(np.asarray(res["value"]) - truth) < 4 * np.asarray(res["stderr"])), res
