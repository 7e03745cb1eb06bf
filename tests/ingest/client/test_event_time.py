"""ingest.client.event_time: durations, time columns to Unix seconds (ISO-8601 with and without zones,
datetime64, datetime, numbers), bad rows named, the range 1970 … 2106, rounding down."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest

from ingest.client.event_time import (
    MAX_EVENT_TIME,
    EventTimeError,
    floor_to,
    format_duration,
    invalid_time_error,
    iso_utc,
    parse_duration,
    parse_iso_utc,
    to_unix_seconds,
    to_unix_seconds_masked,
)
from ingest.errors import SchemaError

T0 = 1357034400  # 2013-01-01T10:00:00Z


@pytest.mark.parametrize("text, seconds", [("30s", 30), ("15m", 900), ("1h", 3600), ("1d", 86400),
                                           ("7d", 604800), ("2w", 1209600), (" 5 m ", 300), (90, 90)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["1 day", "1.5h", "h", "", "-1h", "0s", 0, -5, True, None, 1.0, "1y"])
def test_bad_durations_name_the_setting(bad):
    with pytest.raises(ValueError, match=r"^window must be a duration > 0 like"):
        parse_duration(bad, "window")


def test_zero_duration_when_allowed_and_formatting():
    assert parse_duration("0s", "grace", allow_zero=True) == 0
    with pytest.raises(ValueError, match=">= 0"):
        parse_duration("-1s", "grace", allow_zero=True)
    assert [format_duration(s) for s in (30, 90, 900, 3600, 5400, 86400, 604800, 0)] == [
        "30s", "90s", "15m", "1h", "90m", "1d", "7d", "0s"]
    for s in (1, 59, 61, 3600, 7200, 86400, 3 * 86400):
        assert parse_duration(format_duration(s)) == s


@pytest.mark.parametrize("text, seconds", [
    ("2013-01-01T10:00:00Z", T0), ("2013-01-01T10:00:00z", T0), ("2013-01-01T10:00:00", T0),
    ("2013-01-01 10:00:00", T0), ("2013-01-01T11:00:00+01:00", T0), ("2013-01-01T05:00:00-05:00", T0),
    ("2013-01-01", T0 - 36000), ("2013-01-01T10:00:00.9Z", T0), ("1970-01-01T00:00:00Z", 0)])
def test_iso_parsing(text, seconds):
    assert parse_iso_utc(text) == seconds
    assert to_unix_seconds(np.array([text], dtype=object), "t").tolist() == [seconds]
    assert to_unix_seconds([text], "t").tolist() == [seconds]  # a list (numpy str array)


def test_iso_text_and_bad_iso():
    assert iso_utc(T0) == "2013-01-01T10:00:00Z" and iso_utc(MAX_EVENT_TIME) == "2106-02-07T06:28:15Z"
    assert parse_iso_utc(iso_utc(T0 + 17)) == T0 + 17
    with pytest.raises(ValueError, match=r"^start must be an ISO-8601 time .* got '2013-13-01'"):
        parse_iso_utc("2013-13-01", "start")


def test_columns_of_every_kind():
    want = [T0, T0 + 3600]
    assert to_unix_seconds(np.array(["2013-01-01T10:00:00", "2013-01-01T11:00"], "datetime64[m]"),
                           "t").tolist() == want
    assert to_unix_seconds(np.array(want, "datetime64[s]").astype("datetime64[ns]"), "t").tolist() == want
    assert to_unix_seconds(np.array(want, np.int32 if max(want) < 2**31 else np.int64), "t").tolist() == want
    assert to_unix_seconds(np.array(want, np.uint64), "t").tolist() == want
    assert to_unix_seconds(np.array([T0 + 0.9, T0 + 3600.2]), "t").tolist() == want  # floored
    aware = datetime(2013, 1, 1, 5, tzinfo=timezone(timedelta(hours=-5)))
    naive = datetime(2013, 1, 1, 11)  # no zone: UTC
    assert to_unix_seconds(np.array([aware, naive], dtype=object), "t").tolist() == want
    mixed = np.array(["2013-01-01T10:00:00Z", T0 + 3600], dtype=object)
    assert to_unix_seconds(mixed, "t").tolist() == want
    # numbers as text are not times (not years either)
    with pytest.raises(EventTimeError, match="row 1: cannot parse '1357038000'"):
        to_unix_seconds(np.array(["2013-01-01T10:00:00Z", "1357038000"], dtype=object), "t")
    assert to_unix_seconds(np.array([np.datetime64(T0, "s"), float(T0 + 3600)], dtype=object),
                           "t").tolist() == want
    out = to_unix_seconds(np.empty(0, dtype=object), "t")
    assert out.dtype == np.int64 and out.shape == (0,)


def test_range_limits():
    ok = to_unix_seconds(np.array([0, MAX_EVENT_TIME]), "t")
    assert ok.tolist() == [0, MAX_EVENT_TIME] and ok.dtype == np.int64
    assert to_unix_seconds(np.array([float(MAX_EVENT_TIME) + 0.5]), "t").tolist() == [MAX_EVENT_TIME]
    for bad in ([-1], [MAX_EVENT_TIME + 1], [-0.5], [1e300], ["1969-12-31T23:59:59Z"],
                ["2106-02-07T06:28:16Z"], np.array(["2200-01-01"], "datetime64[s]")):
        with pytest.raises(EventTimeError, match=r"^time column 't', row 0: .* is outside 1970-01-01 … "
                                                 r"2106-02-07T06:28:15Z$"):
            to_unix_seconds(bad, "t")


@pytest.mark.parametrize("value, why", [
    (None, "missing value"), (float("nan"), "missing value"), ("", "missing value"),
    ("  ", "missing value"), (np.datetime64("NaT"), "missing value"),
    ("2013-13-01", "cannot parse '2013-13-01' as an ISO-8601 time"), ("yesterday", "cannot parse"),
    (True, "True is not a time"), (b"2013", "is not a time"), (float("inf"), "is outside")])
def test_bad_rows_are_named(value, why):
    col = np.array(["2013-01-01T10:00:00Z", "2013-01-01T11:00:00Z", value], dtype=object)
    with pytest.raises(EventTimeError, match=r"^time column 'time_hour', row 2: ") as info:
        to_unix_seconds(col, "time_hour")
    assert why in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, SchemaError)
    secs, valid = to_unix_seconds_masked(col, "time_hour")
    assert valid.tolist() == [True, True, False] and secs.tolist() == [T0, T0 + 3600, 0]
    assert str(invalid_time_error(col, "time_hour", 2)) == str(info.value)


def test_masked_reading_marks_every_bad_row():
    col = np.array(["2013-01-01T10:00:00Z", None, "x", -5, "2013-01-01T11:00:00+00:00", 2.5,
                    MAX_EVENT_TIME + 1], dtype=object)
    secs, valid = to_unix_seconds_masked(col, "t")
    assert valid.tolist() == [True, False, False, False, True, True, False]
    assert secs.tolist() == [T0, 0, 0, 0, T0 + 3600, 2, 0]
    secs, valid = to_unix_seconds_masked(np.array([1.0, np.nan, np.inf, -1.0]), "t")
    assert valid.tolist() == [True, False, False, False] and secs.tolist() == [1, 0, 0, 0]
    secs, valid = to_unix_seconds_masked(np.array(["2013-01-01", "NaT"], "datetime64[D]"), "t")
    assert valid.tolist() == [True, False] and secs.tolist() == [T0 - 36000, 0]


def test_floor_to_rounds_down():
    t = np.array([0, 1, 3599, 3600, T0 + 1799, MAX_EVENT_TIME])
    assert floor_to(t, 3600).tolist() == [0, 0, 0, 3600, T0, MAX_EVENT_TIME // 3600 * 3600]
    assert floor_to(t, 1).tolist() == t.tolist()
    assert floor_to(np.array([T0 + 50399]), 86400).tolist() == [T0 - 36000]  # 23:59:59 → 00:00
    assert floor_to(np.array([T0]), 3600).dtype == np.int64


def test_datetime_columns_agree_with_text():
    rng = np.random.default_rng(3)
    secs = rng.integers(0, MAX_EVENT_TIME, 50)
    text = np.array([iso_utc(s) for s in secs], dtype=object)
    dts = np.array([datetime.fromtimestamp(int(s), tz=UTC) for s in secs], dtype=object)
    assert to_unix_seconds(text, "t").tolist() == secs.tolist()
    assert to_unix_seconds(dts, "t").tolist() == secs.tolist()
    assert to_unix_seconds(secs.astype("datetime64[s]"), "t").tolist() == secs.tolist()
