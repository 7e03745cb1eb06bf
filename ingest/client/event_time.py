"""Event time: durations, parsing a time column into Unix seconds, rounding and ISO-8601 text
(docs/windows.md §1).

Event times are whole seconds since the Unix epoch, UTC, as ``int64``. A schema may name a time
column and a resolution (``[event_time] field = "time_hour", resolution = "1h"``); the client
rounds every event time *down* to a multiple of the resolution and sends it per report, in
clear. Without one, the Kafka record timestamp is the event time of every report in the record.
"""

from __future__ import annotations

import math
import numbers
import re
from datetime import UTC, datetime
from typing import Any

import numpy as np

from ingest.errors import EventTimeError

__all__ = [
    "DURATION_UNITS",
    "MAX_EVENT_TIME",
    "MAX_RESOLUTION_S",
    "EventTimeError",
    "floor_to",
    "format_duration",
    "invalid_time_error",
    "iso_utc",
    "parse_duration",
    "parse_iso_utc",
    "to_unix_seconds",
    "to_unix_seconds_masked",
]

#: Seconds per duration unit: ``"30s"``, ``"15m"``, ``"1h"``, ``"1d"``, ``"7d"``, ``"2w"``.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_RE = re.compile(r"^\s*(\d{1,9})\s*([smhdw])\s*$")

#: Largest event time the wire format carries: 2³² − 1 s (2106-02-07T06:28:15Z).
MAX_EVENT_TIME = (1 << 32) - 1

#: Coarsest event-time resolution a schema may declare (``[event_time] resolution``): 7 days.
MAX_RESOLUTION_S = 7 * 86400


def parse_duration(value: Any, name: str = "duration", *, allow_zero: bool = False) -> int:
    """Seconds of a duration written ``"<integer><unit>"`` with unit ``s m h d w``.

    Parameters
    ----------
    value : str or int
        ``"30s"``, ``"15m"``, ``"1h"``, ``"1d"``, ``"7d"``; an ``int`` is taken as seconds.
    name : str
        The setting's name, for the message (``""``: the message starts with "must be").
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
        lead = f"{name} " if name else ""
        raise ValueError(f"{lead}must be a duration {low} like \"30s\", \"15m\", \"1h\", \"1d\" or "
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
    arr = _flat(column)
    secs, valid = to_unix_seconds_masked(arr, field)
    if not valid.all():
        raise invalid_time_error(arr, field, int(np.flatnonzero(~valid)[0]))
    return secs


def to_unix_seconds_masked(column: Any, field: str) -> tuple[np.ndarray, np.ndarray]:
    """A time column as int64 Unix seconds (UTC) and the mask of the rows that are valid times.

    The one reading of time columns: :func:`to_unix_seconds` raises on the first invalid row,
    ``Privatizer`` (``on_invalid="skip"``) drops the invalid rows.

    Parameters
    ----------
    column : array-like, shape (n,)
        As in :func:`to_unix_seconds`.
    field : str
        The column's name (for messages of callers).

    Returns
    -------
    secs : ndarray of int64, shape (n,)
        Unix seconds, floored to whole seconds; 0 in invalid rows.
    valid : ndarray of bool, shape (n,)
        False where the value is missing (``None``, NaN, NaT, empty text), not a time (unparsable
        text, another type) or outside ``[0, MAX_EVENT_TIME]``.
    """
    arr = _flat(column)
    n = arr.shape[0]
    if arr.dtype.kind == "M":
        valid = ~np.isnat(arr)
        secs = np.where(valid, arr, np.datetime64(0, "s")).astype("datetime64[s]").astype(np.int64)
        valid &= (secs >= 0) & (secs <= MAX_EVENT_TIME)
    elif arr.dtype.kind in "iu":
        valid = (arr >= 0) & (arr <= MAX_EVENT_TIME)
        secs = np.where(valid, arr, 0).astype(np.int64)
    elif arr.dtype.kind == "f":
        valid = np.isfinite(arr) & (arr >= 0) & (arr < MAX_EVENT_TIME + 1)
        secs = np.floor(np.where(valid, arr, 0.0)).astype(np.int64)
    else:
        secs = np.zeros(n, dtype=np.int64)
        valid = np.ones(n, dtype=bool)
        # the common ISO layout at numpy speed; anything else value by value
        try:
            text = arr.astype(str)
            stripped = np.char.rstrip(text, "Zz")
            plain = ((np.char.str_len(stripped) >= 10) & (np.char.find(stripped, "+") < 0)
                     & (np.char.find(stripped, "-") == 4)
                     & (np.char.rfind(stripped, "-") == 7))  # YYYY-MM-DD…, no zone offset
            if not plain.all():
                raise ValueError
            parsed = np.array(stripped, dtype="datetime64[s]")
            if np.isnat(parsed).any():
                raise ValueError
            secs[:] = parsed.astype(np.int64)
        except (ValueError, TypeError, OverflowError):
            for i, v in enumerate(arr):
                t = _one(v)
                if t is None:
                    valid[i] = False
                else:
                    secs[i] = t
        valid &= (secs >= 0) & (secs <= MAX_EVENT_TIME)
    secs[~valid] = 0
    return secs, valid


def invalid_time_error(column: Any, field: str, row: int) -> EventTimeError:
    """The error naming the field, the row and why ``column[row]`` is not an event time.

    Parameters
    ----------
    column : array-like, shape (n,)
        The time column.
    field : str
        Its name.
    row : int
        A row that :func:`to_unix_seconds_masked` marks invalid.

    Returns
    -------
    EventTimeError
        ``time column 'time_hour', row 17: cannot parse '2013-13-01' as an ISO-8601 time (e.g.
        "2013-01-01T10:00:00Z")``; ``… row 3: missing value``; ``… row 5: 5000000000 is outside
        1970-01-01 … 2106-02-07T06:28:15Z``; ``… row 2: True is not a time``.
    """
    v = _flat(column)[row]
    where = f"time column {field!r}, row {row}"
    if _missing(v):
        return EventTimeError(f"{where}: missing value")
    if isinstance(v, str | np.str_):
        try:
            parse_iso_utc(v, field)
        except (ValueError, OverflowError, OSError):
            return EventTimeError(f"{where}: cannot parse {str(v)!r} as an ISO-8601 time "
                                  "(e.g. \"2013-01-01T10:00:00Z\")")
    elif isinstance(v, bool | np.bool_) or not isinstance(
            v, numbers.Real | datetime | np.datetime64):
        return EventTimeError(f"{where}: {v!r} is not a time")
    return EventTimeError(f"{where}: {v!r} is outside 1970-01-01 … {iso_utc(MAX_EVENT_TIME)}")


def _flat(column: Any) -> np.ndarray:
    arr = np.asarray(column)
    return arr.reshape(-1) if arr.ndim != 1 else arr


def _missing(v: Any) -> bool:
    """None, NaN, NaT, empty text, pandas.NA / NaT."""
    if v is None or type(v).__name__ in ("NAType", "NaTType"):
        return True
    if isinstance(v, np.datetime64):
        return bool(np.isnat(v))
    if isinstance(v, float | np.floating):
        return bool(np.isnan(v))
    return isinstance(v, str | np.str_) and not v.strip()


def _one(v: Any) -> int | None:
    """Unix seconds of one value, or None if it is not a time inside ``[0, MAX_EVENT_TIME]``."""
    if _missing(v) or isinstance(v, bool | np.bool_):
        return None
    if isinstance(v, datetime):
        try:
            t = int((v if v.tzinfo else v.replace(tzinfo=UTC)).timestamp() // 1)
        except (ValueError, OverflowError, OSError):
            return None
    elif isinstance(v, np.datetime64):
        t = int(v.astype("datetime64[s]").astype(np.int64))
    elif isinstance(v, numbers.Integral):
        t = int(v)
    elif isinstance(v, numbers.Real):
        if not math.isfinite(v):
            return None
        t = math.floor(v)
    elif isinstance(v, str):
        try:
            t = parse_iso_utc(v)
        except (ValueError, OverflowError, OSError):
            return None
    else:
        return None
    return t if 0 <= t <= MAX_EVENT_TIME else None
