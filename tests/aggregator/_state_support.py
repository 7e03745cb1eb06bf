"""Shared fixtures for the state tests: a small schema and a privatized batch generator."""

from __future__ import annotations

import numpy as np

from ingest.client.batch import ReportBatch
from ingest.client.schema import TelemetrySchema

SCHEMA_DICT = {
    "name": "state-test",
    "version": 1,
    "numeric": {
        "zero_prob": 0.3,
        "scale": 0.5,
        "fields": [
            {"name": "a", "low": 0.0, "high": 10.0},
            {"name": "b", "low": -5.0, "high": 5.0},
            {"name": "y", "low": 0.0, "high": 1.0},
        ],
    },
    "categorical": [
        {"name": "c", "categories": ["x", "y", "z", "w"], "sensitive": ["x", "y"], "mechanism": "urr",
         "epsilon": 1.0},
        {"name": "d", "categories": [f"v{i}" for i in range(6)], "sensitive": ["v0", "v1", "v2"],
         "mechanism": "urap", "epsilon": 1.5},
    ],
}


def make_schema() -> TelemetrySchema:
    return TelemetrySchema.from_dict(SCHEMA_DICT)


def raw_data(n: int, rng: np.random.Generator):
    """Raw (a, b, y) in the box and categorical codes."""
    a = rng.uniform(0, 10, n)
    b = np.clip(-4 + 0.5 * a + rng.logistic(0, 1.0, n), -5, 5)
    y = (rng.random(n) < 1 / (1 + np.exp(-(-1 + 0.3 * a)))).astype(float)
    c = rng.choice(4, n, p=[0.1, 0.2, 0.3, 0.4])
    d = rng.choice(6, n, p=[0.3, 0.1, 0.1, 0.2, 0.2, 0.1])
    return np.column_stack([a, b, y]), c, d


def make_batch(schema, n: int, rng: np.random.Generator):
    """(batch, x2, raw numeric) with X̃₁ privatized and X̃₂ doubled."""
    x, c, d = raw_data(n, rng)
    zil = schema.zil_mechanism()
    x1 = zil.privatize(x, rng)
    x2 = zil.double(x1, rng)
    cat = {
        "c": schema.categorical_mechanism("c").privatize(c, rng),
        "d": schema.categorical_mechanism("d").privatize(d, rng),
    }
    return ReportBatch(schema.fingerprint, x1, cat), x2, x


def split(batch: ReportBatch, x2: np.ndarray, at: int):
    """Split a batch (and its x2) into two at row ``at``."""
    parts = []
    for rows in (np.arange(at), np.arange(at, batch.n)):
        cat = {}
        for k, col in batch.categorical.items():
            cat[k] = col.take(rows) if hasattr(col, "take") else col[rows]
        parts.append((ReportBatch(batch.fingerprint, batch.numeric[rows], cat), x2[rows]))
    return parts


def stream_state(qd: dict, schema, python: bool, chunks):
    """Build the state of query dict ``qd`` and update it with each ``(batch, x2)`` of ``chunks``;
    ``python`` forces a renewable state's Python path (``state._kernel = None``)."""
    from aggregator.state import build_state

    st = build_state(qd, schema)
    if python:
        st._kernel = None
    for b, x2 in chunks:
        st.update(b, x2)
    return st
