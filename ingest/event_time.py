"""Event time: durations, parsing a time column into Unix seconds, rounding and ISO-8601 text
(docs/windows.md §1).

Event times are whole seconds since the Unix epoch, UTC, as ``int64``. A schema may name a time
column and a resolution (``[event_time] field = "time_hour", resolution = "1h"``); the client
rounds every event time *down* to a multiple of the resolution and sends it per report, in
clear. Without one, the Kafka record timestamp is the event time of every report in the record.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import numpy as np

from ingest.errors import SchemaError

__all__ = [
    "DURATION_UNITS",
    "MAX_EVENT_TIME",
    "EventTimeError",
    "floor_to",
    "format_duration",
    "iso_utc",
    "parse_duration",
    "parse_iso_utc",
    "to_unix_seconds",
]

#: Seconds per duration unit: ``"30s"``, ``"15m"``, ``"1h"``, ``"1d"``, ``"7d"``, ``"2w"``.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_RE = re.compile(r"^\s*(\d{1,9})\s*([smhdw])\s*$")

#: Largest event time the wire format carries: 2³² − 1 s (2106-02-07T06:28:15Z).
MAX_EVENT_TIME = (1 << 32) - 1


class EventTimeError(SchemaError):
    """A time value that cannot be read as an event time; the message names the field and the
    row (``time column 'time_hour', row 17: cannot parse '2013-13-01' as an ISO-8601 time``)."""


def parse_duration(value: Any, name: str = "duration", *, allow_zero: bool = False) -> int:
    """Seconds of a duration written ``"<integer><unit>"`` with unit ``s m h d w``.

    Parameters
    ----------
    value : str or int
        ``"30s"``, ``"15m"``, ``"1h"``, ``"1d"``, ``"7d"``; an ``int`` is taken as seconds.
    name : str
        The setting's name, for the message.
    allow_zero : bool
        Whether ``0`` (e.g. ``grace = "0s"``) is allowed.

    Returns
    -------
    int
        Seconds (> 0, or ≥ 0 with ``allow_zero``).

    Raises
    ------
    ValueError
        ``<name> must be a duration like "30s", "15m", "1h", "1d" or "7d", got '1 day'``.
    """
    if isinstance(value, bool):
        seconds = None
    elif isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = int(m.group(1)) * DURATION_UNITS[m.group(2)]
    else:
        seconds = None
    if seconds is None or seconds < 0 or (seconds == 0 and not allow_zero):
        low = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a duration {low} like \"30s\", \"15m\", \"1h\", \"1d\" or "
                         f"\"7d\", got {value!r}")
    return seconds


def format_duration(seconds: int) -> str:
    """The shortest ``"<n><unit>"`` text of a whole number of seconds (``86400`` → ``"1d"``)."""
    s = int(seconds)
    for unit in ("d", "h", "m"):
        if s and s % DURATION_UNITS[unit] == 0:
            return f"{s // DURATION_UNITS[unit]}{unit}"
    return f"{s}s"


def floor_to(t: np.ndarray, resolution_s: int) -> np.ndarray:
    """Round event times (int64 seconds) down to a multiple of ``resolution_s`` (> 0)."""
    t = np.asarray(t, dtype=np.int64)
    return t - np.mod(t, int(resolution_s))


def iso_utc(t: int | float) -> str:
    """``"2013-01-01T00:00:00Z"`` of Unix seconds ``t`` (whole seconds, UTC)."""
    return datetime.fromtimestamp(int(t), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso_utc(text: str, name: str = "time") -> int:
    """Unix seconds of an ISO-8601 time (``2013-01-01``, ``2013-01-01T05:00:00Z``, an offset
    such as ``+01:00``; without a zone: UTC).

    Raises
    ------
    ValueError
        ``<name> must be an ISO-8601 time like "2013-01-01T00:00:00Z", got '…'``.
    """
    try:
        s = str(text).strip()
        if s.endswith(("Z", "z")):
            s = s[:-1] + "+00:00"
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise ValueError(f"{name} must be an ISO-8601 time like \"2013-01-01T00:00:00Z\", "
                         f"got {text!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() // 1)


def to_unix_seconds(column: Any, field: str) -> np.ndarray:
    """A time column as int64 Unix seconds (UTC), floored to whole seconds.

    Parameters
    ----------
    column : array-like, shape (n,)
        ISO-8601 strings (``"2013-01-01T10:00:00Z"``; without a zone: UTC), ``datetime64``
        values, ``datetime`` objects, or numbers of Unix seconds.
    field : str
        The column's name, for the message.

    Returns
    -------
    ndarray of int64, shape (n,)

    Raises
    ------
    EventTimeError
        For a missing, unparsable or non-finite value, or one outside
        ``[0, MAX_EVENT_TIME]`` (1970 … 2106): the message names the field and the first bad row.
    """
    arr = np.asarray(column)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.dtype.kind == "M":
        nat = np.isnat(arr)
        secs = arr.astype("datetime64[s]").astype(np.int64)
        bad = nat
        _check_range(secs, bad, arr, field)
        return secs
    if arr.dtype.kind in "iu":
        secs = arr.astype(np.int64)
        _check_range(secs, np.zeros(arr.shape, bool), arr, field)
        return secs
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        secs = np.floor(np.where(bad, 0.0, arr)).astype(np.int64)
        _check_range(secs, bad, arr, field)
        return secs
    out = np.empty(arr.shape[0], dtype=np.int64)
    # the common ISO layout at numpy speed; anything else value by value
    try:
        text = arr.astype(str)
        stripped = np.char.rstrip(text, "Zz")
        plain = ((np.char.str_len(stripped) >= 10) & (np.char.find(stripped, "+") < 0)
                 & (np.char.rfind(stripped, "-") < 8))  # a date, no zone offset
        if not plain.all():
            raise ValueError
        parsed = np.array(stripped, dtype="datetime64[s]")
        if np.isnat(parsed).any():
            raise ValueError
        out[:] = parsed.astype(np.int64)
    except (ValueError, TypeError):
        for i, v in enumerate(arr):
            out[i] = _one(v, field, i)
    _check_range(out, np.zeros(out.shape, bool), arr, field)
    return out


def _one(v: Any, field: str, row: int) -> int:
    if isinstance(v, datetime):
        return int((v if v.tzinfo else v.replace(tzinfo=UTC)).timestamp() // 1)
    if isinstance(v, np.datetime64):
        if np.isnat(v):
            raise EventTimeError(f"time column {field!r}, row {row}: missing value")
        return int(v.astype("datetime64[s]").astype(np.int64))
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, (float, np.floating)):
        if not np.isfinite(v):
            raise EventTimeError(f"time column {field!r}, row {row}: missing or non-finite value {v!r}")
        return int(np.floor(v))
    if v is None or (isinstance(v, str) and not v.strip()):
        raise EventTimeError(f"time column {field!r}, row {row}: missing value")
    try:
        return parse_iso_utc(v, field)
    except ValueError:
        raise EventTimeError(f"time column {field!r}, row {row}: cannot parse {str(v)!r} as an ISO-8601 "
                             "time (e.g. \"2013-01-01T10:00:00Z\")") from None


def _check_range(secs: np.ndarray, bad: np.ndarray, raw: np.ndarray, field: str) -> None:
    bad = bad | (secs < 0) | (secs > MAX_EVENT_TIME)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise EventTimeError(f"time column {field!r}, row {row}: {raw[row]!r} is missing or outside "
                             f"1970-01-01 … {iso_utc(MAX_EVENT_TIME)}")
