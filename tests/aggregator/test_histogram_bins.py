"""HistogramState's arithmetic bin index equals ``np.searchsorted(edges, x, side="left")``
for values on, just beside, between and far outside the edges (the ±1 correction is exact)."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.state import build_state
from tests.aggregator._state_support import make_schema

SCHEMA = make_schema()


@pytest.mark.parametrize("bins", [16, 17, 3000, 100_000])
@pytest.mark.parametrize("field", ["a", "b"])
def test_bin_index_equals_searchsorted(bins, field):
    st = build_state({"kind": "quantiles", "name": "q", "field": field, "q": [0.5], "bins": bins}, SCHEMA)
    e = st.edges
    rng = np.random.default_rng(bins)
    span = e[-1] - e[0]
    x = np.concatenate([
        e, np.nextafter(e, np.inf), np.nextafter(e, -np.inf),
        rng.uniform(e[0] - span, e[-1] + span, 20_000),
        np.round(rng.normal(e.mean(), span / 4, 20_000), 1),  # integer-ish data on the edge grid
        [-1e300, 1e300, e[0] - 1e-300, 0.0, -0.0],
    ])
    np.testing.assert_array_equal(st._bin_index(x), np.searchsorted(e, x, side="left"))
