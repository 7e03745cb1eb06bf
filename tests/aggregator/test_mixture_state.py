"""The ``kmeans`` and ``gaussian_mixture`` queries: configuration errors, alignment of components
before pooling, canonical order, unidentified components in the estimate, and ``analyze``
(docs/mechanisms.md §7.4, §7.6)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from aggregator.analyze import Replay, analyze_query
from aggregator.errors import ConfigError
from aggregator.queries import parse_query
from aggregator.state import build_state
from ingest.client.batch import ReportBatch
from ingest.client.schema import TelemetrySchema
from mechanisms.mixtures import fit_kmeans, match_components
from mechanisms.mixtures.components import permute_fit
from tests.aggregator._state_support import make_schema

# three unit-variance clusters 8 SD apart (a turned triangle: distinct first coordinates)
_ANG = 0.3 + np.array([0.0, 2 * np.pi / 3, 4 * np.pi / 3])
CENTRES = np.column_stack([np.cos(_ANG), np.sin(_ANG)]) * 8.0 / np.sqrt(3.0)
LOW, HIGH = CENTRES.min(axis=0) - 4.0, CENTRES.max(axis=0) + 4.0


def _schema(zero_prob=0.2, scale=0.5) -> TelemetrySchema:
    return TelemetrySchema.from_dict({
        "name": "clusters", "version": 1,
        "numeric": {"zero_prob": zero_prob, "scale": scale, "fields": [
            {"name": "a", "low": float(LOW[0]), "high": float(HIGH[0])},
            {"name": "b", "low": float(LOW[1]), "high": float(HIGH[1])}]},
        "categorical": [{"name": "c", "categories": ["x", "y"], "sensitive": ["x"], "mechanism": "urr",
                         "epsilon": 1.0}]})


def _reports(schema, n, rng):
    zil = schema.zil_mechanism()
    x = CENTRES[rng.integers(3, size=n)] + rng.standard_normal((n, 2))
    x1 = zil.privatize(x, rng)
    cat = {"c": schema.categorical_mechanism("c").privatize(rng.integers(2, size=n), rng)}
    return ReportBatch(schema.fingerprint, x1, cat), zil.double(x1, rng)


KM = {"kind": "kmeans", "name": "km", "fields": ["a", "b"], "k": 3,
      "renewable": {"warm_up": 2000, "batch_size": 500}}


@pytest.mark.parametrize("bad, message", [
    ({"k": 0}, "queries.km.k: must be >= 1, got 0"),
    ({"k": 51}, "queries.km.k: must be <= 50, got 51"),
    ({"fields": []}, "queries.km.fields: fields must name at least one numeric field"),
    ({"fields": ["a", "a"]}, "queries.km.fields: fields must be distinct"),
    ({"estimator": "sdr"}, "queries.km.estimator"),
    ({"sgd": {}}, "averaged-SGD options are gone"),
])
def test_bad_queries_are_refused_with_one_line(bad, message):
    with pytest.raises(ConfigError) as err:
        parse_query({**KM, **bad})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_fields_must_be_numeric_fields_of_the_schema():
    schema = _schema()
    with pytest.raises(ConfigError, match=r"queries.km.fields: 'c' is not a numeric field"):
        build_state({**KM, "fields": ["a", "c"]}, schema)
    with pytest.raises(ConfigError, match=r"queries.km.fields: 'zz' is not a numeric field"):
        build_state({**KM, "fields": ["zz"]}, schema)


def test_parameter_names_and_canonical_order():
    schema = _schema()
    batch, x2 = _reports(schema, 20_000, np.random.default_rng(5))
    est = build_state(KM, schema).update(batch, x2).estimate()
    assert est.params == ("0.a", "0.b", "1.a", "1.b", "2.a", "2.b")
    a = est.value[0::2]
    assert np.all(np.diff(a) > 0)  # ascending by the first field's centre
    gm = build_state({**KM, "kind": "gaussian_mixture", "name": "gm"}, schema).update(batch, x2).estimate()
    assert gm.params[:3] == ("0.weight", "1.weight", "2.weight") and gm.params[3] == "0.mean.a"
    assert gm.params[-1] == "2.var.b" and gm.estimator == "deconvolution"
    assert np.all(np.diff(gm.value[3:9][0::2]) > 0)
    assert abs(gm.value[:3].sum() - 1.0) < 1e-9


def test_merge_aligns_components_before_pooling():
    """A partition whose components are stored in another order pools as if they were not."""
    schema = _schema()
    rng = np.random.default_rng(17)
    b1, x21 = _reports(schema, 6000, rng)
    b2, x22 = _reports(schema, 6000, rng)
    left = build_state(KM, schema).update(b1, x21)
    right = build_state(KM, schema).update(b2, x22)
    want = (left + right).estimate()
    # relabel the right partition's fit: its components in reverse order
    f = right.fit
    theta, H, A = permute_fit([2, 1, 0], right.loss.widths, f.theta, f.H, f.A)
    assert not np.allclose(theta, f.theta)
    right.fit = type(f)(theta, H, A, f.n, f.spread, f.guarded)
    got = (left + right).estimate()
    np.testing.assert_allclose(got.value, want.value, rtol=1e-10)
    np.testing.assert_allclose(got.stderr, want.stderr, rtol=1e-10)


def test_online_and_merged_agree_with_the_batch_fit():
    """Within the warm-up the merged estimate is the batch fit of the pooled reports; past it the
    online estimate stays within half a batch standard error (docs/mechanisms.md §6.8)."""
    schema = _schema()
    zil = schema.zil_mechanism()
    batch, x2 = _reports(schema, 40_000, np.random.default_rng(29))
    ref = fit_kmeans(batch.numeric, x2, k=3, low=LOW, high=HIGH, zero_prob=zil.zero_prob)
    one = build_state({**KM, "renewable": {}}, schema)  # the defaults: warm-up 20000, blocks of 1000
    for s in range(0, batch.n, 4000):
        rows = np.arange(s, min(s + 4000, batch.n))
        one.update(ReportBatch(batch.fingerprint, batch.numeric[rows], {"c": batch.categorical["c"][rows]}),
                   x2[rows])
    e = one.estimate()
    assert one.fit is not None and one.fit.n > 20_000  # past the warm-up: renewed
    assert np.all(np.abs(e.value - ref.value) < 0.5 * ref.stderr)
    assert np.all(e.stderr / ref.stderr < 1.15)
    # every partition in its warm-up: the estimate is the batch fit of their pooled reports
    wide = {**KM, "renewable": {"warm_up": 50_000}}
    parts = [build_state(wide, schema) for _ in range(4)]
    for p, st in enumerate(parts):
        rows = np.flatnonzero(np.arange(batch.n) % 4 == p)
        st.update(ReportBatch(batch.fingerprint, batch.numeric[rows], {"c": batch.categorical["c"][rows]}),
                  x2[rows])
    merged = parts[0] + parts[1] + parts[2] + parts[3]
    m = merged.estimate()
    assert np.all(np.abs(m.value - ref.value) < 0.05 * ref.stderr)
    # the same point; the interval's smoothed Hessian has the renewal's bandwidth (0.6 instead of
    # 1.0 times spread·n^(-1/5), docs/mechanisms.md §6.7 vs §4.3): SEs within 15 %
    np.testing.assert_allclose(m.stderr, ref.stderr, rtol=0.15)


def test_too_many_components_are_named_not_hidden():
    """k = 8 on three clusters: the estimate is finite, and a component is named in the notes
    exactly when its standard errors are infinite. Whether the fit of these 6000 reports leaves a
    centre undetermined depends on where its restarts place the extra centres, so a centre is then
    moved onto the fields' bounds — where the fit holds a centre that the reports would place
    outside them — and must be named, with infinite standard errors and no interval."""
    from dataclasses import replace

    schema = _schema()
    batch, x2 = _reports(schema, 6000, np.random.default_rng(3))
    st = build_state({**KM, "k": 8, "name": "km8"}, schema).update(batch, x2)

    def check(est):
        assert not np.any(np.isnan(est.value)) and not np.any(np.isnan(est.stderr))
        named = {int(n.split(":")[0].split()[1]) for n in est.notes}
        for j in range(8):
            se = est.stderr[2 * j:2 * j + 2]
            assert np.all(np.isinf(se)) == (j in named), (j, se, est.notes)
        d = est.to_dict()
        assert d.get("notes", []) == list(est.notes) and d["stderr"].count(None) == 2 * len(named)
        return named

    check(st.estimate())
    fit = st.current_fit()
    theta = fit.theta.copy()
    hi = st.loss.box[1]
    theta[14:16] = hi  # the last centre of the fit's order, on the corner of the box
    st.fit = replace(fit, theta=theta)
    st.buf1 = st.buf2 = st.buf1[:0]
    est = st.estimate()
    corner = np.asarray(hi) * st.scale + st.shift
    j = int(np.flatnonzero(np.all(np.isclose(est.value.reshape(8, 2), corner), axis=1))[0])
    assert j in check(est) and "bounds" in dict(n.split(": ", 1) for n in est.notes)[f"component {j}"]


def test_analyze_refits_in_batch():
    schema = _schema()
    zil = schema.zil_mechanism()
    batch, x2 = _reports(schema, 20_000, np.random.default_rng(41))
    runtime = types.SimpleNamespace(schema=schema)
    res = analyze_query(Replay(batch, x2, records=20), runtime, parse_query(KM))
    ref = fit_kmeans(batch.numeric, x2, k=3, low=LOW, high=HIGH, zero_prob=zil.zero_prob, fields=["a", "b"])
    assert res["params"] == list(ref.params) and res["estimator"] == "dr" and res["n"] == 20_000
    np.testing.assert_allclose(res["value"], ref.value, rtol=1e-9)
    true = CENTRES[match_components(ref.centres, CENTRES)]
    assert np.all(np.abs(ref.centres - true) < 4.5 * ref.stderr.reshape(3, 2))


def test_non_numeric_state_schema_is_refused():
    with pytest.raises(ConfigError):
        build_state({**KM, "fields": ["c"]}, make_schema())
